"""Issue 37: the driver's own seconds per step in each mode's real runs, read from recorded modes folders, no engine.

    python -m paper.experiments.modes_driver paper/experiments/validation/modes42 [FOLDER ...]

Each run's steps.parquet records `driver_seconds`: the caller's own time in the rollout (the controller, the policy,
rewards, submit and abort calls), the rest of the rollout being the wait for vLLM's streams. The twin prices the
driver beyond the profile's cells from the collocated runs (`DriverPrice`), whose submissions all come at the step's
start; async aborts and resubmits every response in flight each time weights arrive mid-rollout.

Measured 2026-11-28 (means per step over 3 repeats x 5 steps):

| folder | mode | driver s a step | rollout s a step | responses in the step | driver share of the rollout |
|---|---|---|---|---|---|
| modes42 | collocated | 0.025 | 0.917 | 32.0 | 2.7% |
| modes42 | disaggregated | 0.039 | 1.025 | 32.0 | 3.8% |
| modes42 | async | 0.061 | 0.777 | 46.9 | 7.8% |
| modes42 | hybrid | 0.024 | 1.020 | 32.0 | 2.3% |
| modes41 | collocated | 0.023 | 0.911 | 32.0 | 2.5% |
| modes41 | disaggregated | 0.042 | 1.021 | 32.0 | 4.1% |
| modes41 | async | 0.062 | 0.753 | 48.1 | 8.2% |
| modes41 | hybrid | 0.029 | 1.008 | 32.0 | 2.9% |
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

MODES = ("collocated", "disaggregated", "async", "hybrid")


def driver_by_mode(folder: Path) -> pd.DataFrame:
    """Per mode, the runs' mean driver seconds, rollout seconds and responses in the rollout (carried in too) per step."""
    rows = []
    for mode in MODES:
        runs = sorted((folder / "real" / mode / "baseline").glob("repeat*"))
        if not runs:
            continue
        steps = pd.concat([pd.read_parquet(run / "steps.parquet") for run in runs])
        rows.append({"folder": folder.name, "mode": mode, "driver": steps.driver_seconds.mean(),
                     "rollout": steps.rollout_seconds.mean(), "submitted": steps.responses_in.mean()})
    return pd.DataFrame(rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folders", nargs="+", type=Path, help="recorded `lssim validate --mode` folders (real/)")
    args = ap.parse_args(argv)
    print("| folder | mode | driver s a step | rollout s a step | responses in the step | driver share of the rollout |")
    print("|---|---|---|---|---|---|")
    for folder in args.folders:
        for r in driver_by_mode(folder).itertuples():
            print(f"| {r.folder} | {r.mode} | {r.driver:.3f} | {r.rollout:.3f} | {r.submitted:.1f} | {r.driver / r.rollout:.1%} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
