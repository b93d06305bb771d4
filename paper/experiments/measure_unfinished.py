"""Issue 16: what a run's unfinished.parquet changes in its simulated twin (groups trained, per-step error).

    python -m paper.experiments.measure_unfinished RUN [RUN ...]                 # recorded runs (`lssim real --out RUN`)
    flock /tmp/lssim-vllm.lock python -m paper.experiments.measure_unfinished --record 3 --steps 4 --total-groups 32 \
        --out runs/unfinished                                               # record async runs first (one engine)

Each run is replayed in its own mode (real_backend.validate_modes.compare_modes, the engine's and the trainer's
profiled cost models) twice: from its folder as recorded, and from a copy without unfinished.parquet (the twin then
fills the responses the run left unfinished from other members of their groups, as it did before the recorder wrote
the file). Prints one row per run and twin: the responses the file holds, groups trained measured and predicted,
the per-step APE of step_seconds (median, p90, each step's); --csv writes the rows.

--record: async runs (staleness 1, baseline) of --steps steps x 4 groups x 4 samples, 96 tokens, 16 prompts, each in
OUT/run<k>. --total-groups above steps x 4 gives the run more data than its steps take, as a run cut at --steps of a
longer schedule is: it ends with groups admitted and still generating (with exactly steps x 4 an async run usually
trains every group by its last step and leaves nothing unfinished).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

import pandas as pd

PROFILE = "real_backend/data/profile_cpu.json"
TRAIN_PROFILE = "real_backend/data/profile_trainer_cpu.json"


def twin_rows(folder, profile: str = PROFILE, train_profile: str = TRAIN_PROFILE) -> list[dict]:
    """The run in `folder` replayed with and without its unfinished.parquet: one row each (see the module)."""
    from lssim.analysis.fidelity.run import UNFINISHED_FILE, load_run

    from real_backend.validate_modes import compare_modes

    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        bare = Path(scratch) / "run"
        shutil.copytree(folder, bare, ignore=shutil.ignore_patterns(UNFINISHED_FILE, "checkpoint.pt"))
        for twin, path in (("with file", folder), ("without", bare)):
            run = load_run(path)
            steps = compare_modes([run], profile, train_profile)["steps"]
            ape = steps.loc[steps["in_twin"], "ape_pct"]
            rows.append({"run": str(folder), "twin": twin, "unfinished": len(run.unfinished),
                         "measured_groups": int(steps["measured_groups"].sum()),
                         "predicted_groups": int(steps["predicted_groups"].sum()),
                         "steps_not_in_twin": int((~steps["in_twin"]).sum()),
                         "median_ape_pct": float(ape.median()), "p90_ape_pct": float(ape.quantile(0.9)),
                         "ape_pct_by_step": " ".join(f"{x:.1f}" for x in steps["ape_pct"])})
    return rows


def record(n: int, steps: int, total_groups: int | None, out: Path) -> list[Path]:
    """`n` async baseline runs on one engine (see the module), after a throwaway warm-up run."""
    from lssim.loop.controller import RunConfig
    from lssim.loop.modes import ModeConfig

    from real_backend.world import RealSetup, prepare, run_real, start_engine

    setup = RealSetup(n_prompts=16)
    config = RunConfig(steps=steps, groups_per_step=4, group_size=4, max_tokens=96, total_groups=total_groups)
    mode = ModeConfig(mode="async", rollout_devices=1, train_devices=1, staleness=1)
    prompts, _ = prepare(setup, "baseline", config)
    engine = start_engine(setup, prompts)
    folders = []
    try:
        with tempfile.TemporaryDirectory() as scratch:  # the first steps in a process are slower: not recorded
            prompts, policy = prepare(setup, "baseline", config)
            run_real(setup, policy, RunConfig(steps=2, groups_per_step=4, group_size=4, max_tokens=96), scratch,
                     engine=engine, prompts=prompts, mode=mode)
        for k in range(n):
            prompts, policy = prepare(setup, "baseline", config)
            folder = out / f"run{k}"
            run_real(setup, policy, config, folder, engine=engine, prompts=prompts, mode=mode,
                     meta={"command": " ".join(sys.argv), "policy_spec": "baseline", "repeat": k})
            folders.append(folder)
    finally:
        engine.close()
    return folders


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m paper.experiments.measure_unfinished", description=__doc__.split("\n")[0])
    p.add_argument("runs", nargs="*", help="recorded run folders")
    p.add_argument("--record", type=int, default=0, metavar="N", help="record N async runs into --out first")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--total-groups", type=int, default=None, help="groups of data in all (default: steps x 4)")
    p.add_argument("--out", help="folder for the recorded runs (with --record)")
    p.add_argument("--csv", help="write the rows here")
    args = p.parse_args(argv)
    runs = [Path(r) for r in args.runs]
    if args.record:
        if not args.out:
            p.error("--record needs --out")
        runs += record(args.record, args.steps, args.total_groups, Path(args.out))
    if not runs:
        p.error("give run folders, or --record N --out DIR")
    import warnings

    warnings.filterwarnings("ignore", "All-NaN slice")  # compare_modes' speed level: NaN without a collocated run
    table = pd.DataFrame([row for folder in runs for row in twin_rows(folder)])
    print(table.to_string(index=False, float_format=lambda x: f"{x:.1f}"))
    if args.csv:
        table.to_csv(args.csv, index=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
