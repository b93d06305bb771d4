"""The same rollout step inside an RL run and as a bare cell: does the run's harness slow the engine down?

    python -m paper.experiments.measure_run_vs_cell --world placed     # two instances; ~2 minutes
    python -m paper.experiments.measure_run_vs_cell --world tail       # one instance
    python -m paper.experiments.measure_run_vs_cell --before push,torch  # also after a weight push, torch work, both
    python -m paper.experiments.measure_run_vs_cell --natural --no-train # also natural lengths; runs that do not train
    python -m paper.experiments.measure_run_vs_cell --iterations         # also each instance's iteration time by batch size

Each round records one baseline run of the world (real_backend.world.run_real: controller, rewards, trainer, weight
pushes), then replays each of its rollout steps as a bare cell on the same engine (real_backend.cells.time_cell: the same
prompts, each response forced to the length it had, on the instance it ran on, nothing else in flight, no
controller, no trainer). Printed: the run's step makespan over the cell's, per step and by finish band (the
median finish time of the responses in each band of the step's finish order).

Measured 2026-11-26 (README, "Fidelity"): the run and the cell agree, 1.08x bare in the two-instance placed world
(1.01x after a weight push or 0.4 s of torch work, 1.03x after both; `--rounds 3 --before push,torch --natural`), flat
over the finish bands, and 1.02x with one instance (`--world tail`). An earlier version read 1.41-1.73x in the placed
world: its traces said instance 0 for every response the dispatcher had placed, so its cells ran on one instance.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import numpy as np
import pandas as pd

from lssim.analysis.fidelity.compare import FINISH_QUANTILES as BANDS  # the finish bands lssim.analysis.fidelity.compare.finish_profile reports


def band_medians(finish) -> list[float]:
    """The median finish time in each band of the finish order (BANDS)."""
    t = np.sort(np.asarray(finish, dtype=float))
    q = (np.arange(len(t)) + 1) / len(t)
    return [float(np.median(t[(q > a) & (q <= b)])) if ((q > a) & (q <= b)).any() else float("nan")
            for a, b in zip(BANDS[:-1], BANDS[1:])]


def replay_step(engine, prompts, step: pd.DataFrame, seed: int, natural: bool = False, budget: int = 256) -> list[float]:
    """One recorded step's responses (trace rows) as a bare cell: seconds from submission to each one's end. Each is
    forced to its recorded length, or with `natural` generates until EOS or `budget` tokens (other lengths, the same
    kind of request as a run's)."""
    from lssim.loop.core import Request

    from real_backend.cells import time_cell

    cell_prompts: dict[int, list[int]] = {}
    with engine.serving_exactly(cell_prompts):
        if natural:
            engine.sampling_kwargs["ignore_eos"] = False
        requests = []
        for i, r in enumerate(step.itertuples()):
            cell_prompts[i] = prompts.prompt_tokens(int(r.prompt_id))
            requests.append(Request(rid=i, group_id=int(r.group_id), step=0, prompt_id=i, sample_idx=int(r.sample_idx),
                                    prompt_len=int(r.prompt_len), max_tokens=budget if natural else max(1, int(r.response_len)),
                                    seed=seed + i, instance=int(r.instance)))
        finish = time_cell(engine, requests)
    return [finish[i] for i in range(len(requests))]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m paper.experiments.measure_run_vs_cell", description=__doc__.split("\n\n")[0])
    p.add_argument("--world", default="placed", help="a world of real_backend/validation_workloads.toml (default placed)")
    p.add_argument("--rounds", type=int, default=4, help="runs recorded, each replayed step by step (default 4)")
    p.add_argument("--before", default="", metavar="push,torch",
                   help="also replay each step after what a run does between steps: 'push' (the reference weights "
                        "pushed into the engine, its prefix cache reset), 'torch' (0.4 s of torch work in this process, "
                        "as a trainer's), or both; the bare cell is always replayed too")
    p.add_argument("--natural", action="store_true",
                   help="also replay each step with natural lengths (EOS, the world's budget), as a run's requests are")
    p.add_argument("--no-train", action="store_true",
                   help="the runs train once, then reuse that step's metrics (weights still pushed): no training between "
                        "their rollouts")
    p.add_argument("--iterations", action="store_true",
                   help="also print each instance's iteration time by running sequences, runs against cells, and the "
                        "one-instance profile's (--profile) price of it")
    p.add_argument("--profile", default="paper/experiments/validation/until2/profile.json",
                   help="the one-instance profile --iterations prices iterations with (default: the kept validation's)")
    return p


def main(argv=None) -> int:
    p = _parser()
    args = p.parse_args(argv)
    from real_backend.validation_workloads import world_arg

    world = world_arg(args.world)
    if world is None:
        return 2
    befores = [""] + [b.strip() for b in args.before.split(",") if b.strip()]
    if len(befores) > 2:
        befores.append("+".join(befores[1:]))
    unknown = {part for b in befores for part in b.split("+") if part} - {"push", "torch"}
    if unknown:
        p.error(f"--before: unknown {', '.join(sorted(unknown))} (push, torch)")
    if args.no_train:
        train_once()
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    rows, traces, log = record_rounds(world, args, befores + (["natural"] if args.natural else []))
    print_bands(pd.DataFrame(rows), args.world)
    if log is not None:
        print_iterations(log.iterations(), args.profile)
        print_admission(pd.concat(traces, ignore_index=True))
    return 0


def record_rounds(world, args, kinds: list[str]) -> tuple[list[dict], list[pd.DataFrame], "IterationLog | None"]:
    """Record args.rounds baseline runs of `world`; replay each of their steps as a cell after each of `kinds`."""
    from real_backend.world import prepare, run_real, world_engine

    rows, traces = [], []
    with world_engine(world) as (setup, config, _, engine):
        log = IterationLog(engine) if args.iterations else None
        state = None
        if any("push" in b for b in kinds):
            from transformers import AutoModelForCausalLM

            state = AutoModelForCausalLM.from_pretrained(setup.model_dir).state_dict()
        with tempfile.TemporaryDirectory() as scratch:
            prompts, policy = prepare(setup, "baseline", config)
            run_real(setup, policy, config, f"{scratch}/warm", engine=engine, prompts=prompts)  # first steps are slower
            for k in range(args.rounds):
                prompts, policy = prepare(setup, "baseline", config)
                if log is not None:
                    log.tag = "run"
                if k == 0:  # where the controller's thread spends a rollout: waiting for vLLM's events, or working
                    waited, rollout = profiled_run(lambda: run_real(setup, policy, config, f"{scratch}/run{k}",
                                                                    engine=engine, prompts=prompts))
                    print(f"round 0: the controller's thread waited for events {waited:.2f} s of its {rollout:.2f} s "
                          f"of rollouts ({waited / rollout:.0%}; cProfile)", flush=True)
                else:
                    run_real(setup, policy, config, f"{scratch}/run{k}", engine=engine, prompts=prompts)
                trace = pd.read_parquet(f"{scratch}/run{k}/trace.parquet")
                traces.append(trace.assign(round=k))
                rows += replay_steps(engine, prompts, trace, k, kinds, log, state, config.max_tokens)
    return rows, traces, log


def replay_steps(engine, prompts, trace: pd.DataFrame, k: int, kinds: list[str], log, state, budget: int) -> list[dict]:
    """Each step of round `k`'s run replayed as a bare cell after each of `kinds`: run / cell makespans and band ratios."""
    rows = []
    for step, s in trace.groupby("step"):
        run = (s["finish_time"] - s["submit_time"].min()).to_numpy()
        for before in kinds:
            if log is not None:
                log.tag = "cell" if before == "" else None
            if "push" in before:
                engine.update_weights(state)
            if "torch" in before:
                torch_work(0.4)
            cell = replay_step(engine, prompts, s, seed=1000 * k, natural=before == "natural", budget=budget)
            rows.append({"round": k, "step": int(step), "before": before or "bare", "run_s": float(run.max()),
                         "cell_s": float(max(cell)),
                         **{f"band{b}": r / c for b, (r, c) in enumerate(zip(band_medians(run), band_medians(cell)))}})
            print(f"round {k} step {step}: run {rows[-1]['run_s']:.3f} s, cell ({before or 'bare'}) "
                  f"{rows[-1]['cell_s']:.3f} s", flush=True)
    return rows


def print_bands(df: pd.DataFrame, world: str) -> None:
    bands = [f"{a:.0%}-{b:.0%}" for a, b in zip(BANDS[:-1], BANDS[1:])]
    for before, d in df.groupby("before", sort=False):
        print(f"world {world}, cell {before}: run / cell makespan, median {float((d.run_s / d.cell_s).median()):.3f} "
              f"(cell {float(d.cell_s.median()):.3f} s, run {float(d.run_s.median()):.3f} s); by finish band "
              + ", ".join(f"{name} {float(d[f'band{b}'].median()):.3f}" for b, name in enumerate(bands)))


class IterationLog:
    """Every token the engine's driver takes from vLLM while `tag` is set: (tag, instance, time, request key).
    Wraps VLLMEngine._process, so it costs the run nothing measurable. Every request an instance runs gets one token
    per engine iteration, so `iterations` starts a new iteration at the first token of a request already in the
    current one (the driver can take one iteration's tokens in several bursts, interleaved with the other
    instance's: a time gap does not mark an iteration; a scratch check against vLLM's engine-core timestamps put the
    driver 0.6 ms median behind the engine)."""

    IDLE = 0.02  # seconds without a token from an instance: it was idle, the next token starts a new iteration

    def __init__(self, engine):
        self.tag, self.rows = None, []
        process = engine._process

        def logged(items):
            if self.tag is not None:
                for key, t, toks, *_ in items:
                    live = engine._live.get(key) if isinstance(key, str) else None
                    if live is not None and toks:
                        self.rows.append((self.tag, live.instance, t, key))
            return process(items)

        engine._process = logged

    def iterations(self) -> pd.DataFrame:
        """One row per instance iteration: tag, instance, t (its first token), n_seqs (its tokens: the sequences it
        ran), seconds (to the instance's next iteration; gaps over 0.1 s, an idle instance between steps, dropped).
        A token of a request already in the current iteration, of another tag, or after IDLE starts a new one."""
        groups = []
        for inst in sorted({row[1] for row in self.rows}):
            current, seen, last = None, set(), -np.inf
            for tag, _, t, key in sorted((r for r in self.rows if r[1] == inst), key=lambda r: r[2]):
                if current is None or t - last > self.IDLE or tag != current["tag"] or key in seen:
                    current, seen = {"tag": tag, "instance": inst, "t": t, "n_seqs": 0}, set()
                    groups.append(current)
                current["n_seqs"] += 1
                seen.add(key)
                last = t
        it = pd.DataFrame(groups, columns=["tag", "instance", "t", "n_seqs"])
        it["seconds"] = -it.groupby(["tag", "instance"])["t"].diff(-1)
        return it[it["seconds"] < 0.1].reset_index(drop=True)


def print_iterations(it: pd.DataFrame, profile: str) -> None:
    """Median iteration time by running sequences, runs against cells, with the profile's price of it (no context
    term: the reference task's contexts are short)."""
    from lssim.cost import ProfiledCostModel

    base = ProfiledCostModel.from_json(profile)
    buckets = pd.cut(it["n_seqs"], [0, 2, 4, 8, 12, 16, 32, 64, 256])
    table = it.groupby([buckets, "tag"], observed=True)["seconds"].median().unstack("tag") * 1000
    n_mid = it.groupby(buckets, observed=True)["n_seqs"].median()
    table["profile"] = [base.decode_time(int(n), 0.0, 1) * 1000 for n in n_mid]
    print("decode iteration, median ms by sequences running on the instance (profile: one instance alone, "
          f"{profile}):\n{table.round(2).to_string()}")


def print_admission(trace: pd.DataFrame) -> None:
    """When a step's requests start on their instance: each one's first token after the step's submission, by its
    place in the order its instance's requests started (median over the runs' steps). vLLM's front end hands a
    step's requests over one by one, while the simulated twin admits them all at once."""
    t = trace.assign(first_ms=(trace["first_token_time"] - trace.groupby(["round", "step"])["submit_time"].transform("min")) * 1000)
    t["order"] = t.groupby(["round", "step", "instance"])["first_ms"].rank(method="first").astype(int)
    by_order = t.groupby("order")["first_ms"].median()
    print("first token after the step's submission, median ms by start order on the instance: "
          + ", ".join(f"#{k} {v:.1f}" for k, v in by_order.items() if k in (1, 2, 4, 8, 12, 16, 24, 32)))


def profiled_run(run) -> tuple[float, float]:
    """Run `run()` under cProfile: (seconds the controller waited in VLLMEngine's event queue, seconds in its
    rollouts)."""
    import cProfile
    import pstats

    profile = cProfile.Profile()
    profile.runcall(run)
    stats = pstats.Stats(profile).stats  # (file, line, name) -> (calls, primitive calls, own time, cumulative, callers)
    waited = sum(v[3] for (f, _, name), v in stats.items() if name == "_wait" and f.endswith("engine.py"))
    rollout = sum(v[3] for (f, _, name), v in stats.items() if name == "_rollout" and f.endswith("controller.py"))
    return waited, rollout


def train_once() -> None:
    """From now on GRPOTrainer.update trains once and then returns a copy of that step's metrics (the weights are
    still pushed): runs without training between their rollouts."""
    import copy

    from real_backend.trainer import GRPOTrainer

    real, kept = GRPOTrainer.update, {}

    def update(self, groups, step):
        if "metrics" not in kept:
            kept["metrics"] = real(self, groups, step)
        return copy.deepcopy(kept["metrics"])

    GRPOTrainer.update = update


def torch_work(seconds: float) -> None:
    """CPU work in this process's torch threads, as a trainer's between two rollouts."""
    import time

    import torch

    a, t0 = torch.randn(512, 512), time.monotonic()
    while time.monotonic() - t0 < seconds:
        a = torch.tanh(a @ a.T / 512)


if __name__ == "__main__":
    sys.exit(main())
