"""The same rollout step inside an RL run and as a bare cell: does the run's harness slow the engine down?

    python -m real_backend.measure_run_vs_cell --world placed     # two instances; ~2 minutes
    python -m real_backend.measure_run_vs_cell --world tail       # one instance

Each round records one baseline run of the world (real_backend.world.run_real: controller, rewards, trainer, weight
pushes), then replays each of its rollout steps as a bare cell on the same engine (layout._run_cell: the same
prompts, each response forced to the length it had, on the instance it ran on, nothing else in flight, no
controller, no trainer). Printed: the run's step makespan over the cell's, per step and by finish band (the
median finish time of the responses in each band of the step's finish order).

Measured 2026-11-26 (README, "Fidelity"): 1.00x in the one-instance tail world, flat over the bands; 1.48x in the
two-instance placed world (1.36-1.51x by band). A weight push or 0.4 s of torch work right before a cell does not
slow it (0.51-0.57 s against 0.52 s bare, the run's steps 0.72 s), and the run's controller thread waits in its
queue 97% of a rollout (cProfile): something that runs beside two instances during an RL run, not before it.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import numpy as np
import pandas as pd

BANDS = (0.0, 0.25, 0.5, 0.75, 0.9, 1.0)


def band_medians(finish) -> list[float]:
    """The median finish time in each band of the finish order (BANDS)."""
    t = np.sort(np.asarray(finish, dtype=float))
    q = (np.arange(len(t)) + 1) / len(t)
    return [float(np.median(t[(q > a) & (q <= b)])) if ((q > a) & (q <= b)).any() else float("nan")
            for a, b in zip(BANDS[:-1], BANDS[1:])]


def replay_step(engine, prompts, step: pd.DataFrame, seed: int) -> list[float]:
    """One recorded step's responses (trace rows) as a bare cell: seconds from submission to each one's end."""
    from lssim.core import Request

    from .layout import _profiling, _run_cell

    cell_prompts: dict[int, list[int]] = {}
    with _profiling(engine, cell_prompts):
        requests = []
        for i, r in enumerate(step.itertuples()):
            cell_prompts[i] = prompts.prompt_tokens(int(r.prompt_id))
            requests.append(Request(rid=i, group_id=int(r.group_id), step=0, prompt_id=i, sample_idx=int(r.sample_idx),
                                    prompt_len=int(r.prompt_len), max_tokens=max(1, int(r.response_len)),
                                    seed=seed + i, instance=int(r.instance)))
        finish = _run_cell(engine, requests)
    return [finish[i] for i in range(len(requests))]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m real_backend.measure_run_vs_cell", description=__doc__.split("\n\n")[0])
    p.add_argument("--world", default="placed", help="a world of real_backend/validation_workloads.toml (default placed)")
    p.add_argument("--rounds", type=int, default=4, help="runs recorded, each replayed step by step (default 4)")
    args = p.parse_args(argv)
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    from .validation_workloads import load_workloads
    from .world import RealSetup, prepare, run_real, start_engine

    world = load_workloads().worlds[args.world]
    setup = RealSetup(n_instances=world.n_instances, cpus=world.cpus, n_prompts=world.n_prompts)
    config = world.config(seed=0)
    prompts, policy = prepare(setup, "baseline", config)
    engine = start_engine(setup, prompts, seed=0)
    engine.allow_plain_runs = True
    rows = []
    try:
        with tempfile.TemporaryDirectory() as scratch:
            run_real(setup, policy, config, f"{scratch}/warm", engine=engine, prompts=prompts)  # first steps are slower
            for k in range(args.rounds):
                prompts, policy = prepare(setup, "baseline", config)
                run_real(setup, policy, config, f"{scratch}/run{k}", engine=engine, prompts=prompts)
                trace = pd.read_parquet(f"{scratch}/run{k}/trace.parquet")
                for step, s in trace.groupby("step"):
                    run = (s["finish_time"] - s["submit_time"].min()).to_numpy()
                    cell = replay_step(engine, prompts, s, seed=1000 * k)
                    rows.append({"round": k, "step": int(step), "run_s": float(run.max()), "cell_s": float(max(cell)),
                                 **{f"band{b}": r / c for b, (r, c) in enumerate(zip(band_medians(run), band_medians(cell)))}})
                    print(f"round {k} step {step}: run {rows[-1]['run_s']:.3f} s, cell {rows[-1]['cell_s']:.3f} s", flush=True)
    finally:
        engine.close()
    df = pd.DataFrame(rows)
    bands = [f"{a:.0%}-{b:.0%}" for a, b in zip(BANDS[:-1], BANDS[1:])]
    print(f"world {args.world}: run / cell makespan, median {float((df.run_s / df.cell_s).median()):.3f}; by finish band "
          + ", ".join(f"{name} {float(df[f'band{b}'].median()):.3f}" for b, name in enumerate(bands)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
