"""Issue 37: each update's wall seconds in a run against the trainer profile's price and the twin's, per mode and
step. From recorded modes folders (`lssim validate --mode ... --out DIR`), no engine.

    python -m paper.experiments.update_price paper/experiments/validation/modes50p paper/experiments/validation/modes51p

Per run and step: `price` (the trainer profile's seconds for the step's update alone: the twin's update_seconds),
`wall` (the run's train_end - train_start) and `twin` (the twin's, on a shared host: price x its trainer factor where
the mode trains beside the rollout). Per mode, one least-squares line wall = a + b x price over every update, and the
twin's; then per mode and step, the medians. Each folder is replayed as `lssim validate --mode any --runs ...` does
(real_backend.validate_modes: host_pricing, mode_sim_setup).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd


def folder_updates(folder: Path) -> list[dict]:
    """One row per run and step of a recorded folder's baseline runs: mode, step, price, wall, twin (seconds)."""
    from lssim.analysis.fidelity.run import replay_run
    from real_backend.validate_modes import DEFAULT_TRAIN_PROFILE, host_pricing, mode_sim_setup
    from real_backend.validate_twin import load_recorded, run_prompts

    runs = [load_recorded(f) for f in sorted(folder.glob("real/*/baseline/repeat*"))]
    if not runs:
        raise SystemExit(f"{folder}: no recorded baseline runs under real/<mode>/baseline/repeat<k>")
    profile = str(folder / "profile.json")
    share, driver, _ = host_pricing(runs, profile)
    rows = []
    for run in runs:
        setup = mode_sim_setup(run, profile, str(DEFAULT_TRAIN_PROFILE), share, driver)
        sim, real = replay_run(run, setup, run_prompts(run)).steps, run.steps
        for k in range(min(len(sim), len(real))):
            rows.append({"folder": folder.name, "mode": run.meta["mode"]["mode"], "step": k,
                         "price": float(sim["update_seconds"].iloc[k]),
                         "wall": float(real["train_end"].iloc[k] - real["train_start"].iloc[k]),
                         "twin": float(sim["train_end"].iloc[k] - sim["train_start"].iloc[k])})
    return rows


def line(price: pd.Series, seconds: pd.Series) -> str:
    """seconds = a + b x price, least squares."""
    a, b = np.linalg.lstsq(np.c_[np.ones(len(price)), price], seconds, rcond=None)[0]
    return f"{a:+.3f} + {b:.2f} x price"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m paper.experiments.update_price", description=__doc__.split("\n\n")[0])
    p.add_argument("folders", nargs="+", type=Path, help="recorded modes folders (profile.json, real/<mode>/<policy>/repeat<k>)")
    args = p.parse_args(argv)
    table = pd.DataFrame([row for folder in args.folders for row in folder_updates(folder)])
    for mode, rows in table.groupby("mode", sort=False):
        print(f"{mode}: wall = {line(rows['price'], rows['wall'])}; twin = {line(rows['price'], rows['twin'])} "
              f"({len(rows)} updates)")
    print("\nmedian seconds per mode and step:")
    print(table.groupby(["mode", "step"])[["price", "wall", "twin"]].median().round(3).to_string())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
