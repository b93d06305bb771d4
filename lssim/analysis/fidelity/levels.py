"""The host's speed level against the profile's, per validation folder and world: how far a twin priced by the profile
alone must miss before any policy acts.

    python -m lssim.analysis.fidelity --levels paper/experiments/validation/full*

A world's baseline is the same workload in every repeat, so its measured/predicted step-time ratio is the machine's
speed in those minutes over its speed when the profile was measured, plus the cost model's own error. Read from each
folder's steps_by_repeat.parquet (nothing is replayed): per folder and world, the baseline's median ratio over its
runs (`level`: 1.0 is the profile's speed; a run's ratio is the median over its steps), the lowest and highest run's,
the median speed probe (`probed`: a fixed batch timed on the engine between runs, over the same batch around the
profile; lssim.analysis.fidelity.run) and the error that level alone puts on a twin exact at the profile's
minutes, |level - 1| (`floor_pct`), beside an exact model's error on the same repeats (`exact_pct`). Where `floor_pct` is over
1.5x `exact_pct`, a cost model right at the profile's minutes misses issue 37's bound there: only the level measured in
the run's minutes (the probe, or the world's baseline) meets it. In a modes folder each mode is a world whose twin is already priced
at each run's probed level (the engine's cost model: real_backend.validate_twin.sim_setup) and prices the shared host
(lssim.sim.shared_host), so there the level is what the probe leaves of the host's speed, times that price's own error.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from lssim.analysis.fidelity.noise import noise_floor

BASELINE = "baseline"


def world_levels(folder) -> pd.DataFrame:
    """One row per world of a validation folder (see the module's docstring); a modes folder (`lssim validate --mode`)
    one per mode, its baseline's steps the twin has. ValueError naming what is missing."""
    folder = Path(folder)
    path, modes = folder / "steps_by_repeat.parquet", folder / "modes_steps_by_repeat.parquet"
    if modes.is_file():
        path, steps = modes, pd.read_parquet(modes)
        steps = steps[steps["in_twin"]].rename(columns={"mode": "world", "probed_level": "speed_level"})
    elif path.is_file():
        steps = pd.read_parquet(path)
    else:
        raise ValueError(f"{folder}: no steps_by_repeat.parquet or modes_steps_by_repeat.parquet (written by "
                         f"`lssim validate --out {folder}`)")
    missing = {"policy", "repeat", "measured_seconds", "predicted_seconds"} - set(steps.columns)
    if missing:
        raise ValueError(f"{path}: no column(s) {', '.join(sorted(missing))}")
    if "world" not in steps:
        steps = steps.assign(world="default")
    baselines = steps[steps["policy"].str.split("@").str[0] == BASELINE]
    if baselines.empty:
        raise ValueError(f"{path}: no baseline rows (policy 'baseline' or 'baseline@WORLD'): nothing sets the level")
    rows = [_world_row(world, runs) for world, runs in baselines.groupby("world", sort=True)]
    return pd.DataFrame(rows).assign(folder=str(folder)).set_index(["folder", "world"])


def _world_row(world: str, steps: pd.DataFrame) -> dict:
    ratio = steps["measured_seconds"] / steps["predicted_seconds"]
    per_run = ratio.groupby(steps["repeat"]).median()
    level = float(per_run.median())
    probed = (float(steps.groupby("repeat")["speed_level"].first().median())
              if "speed_level" in steps and steps["speed_level"].notna().any() else float("nan"))
    exact = noise_floor(steps.assign(policy=BASELINE), search=False)["noise_floor_median_pct"].iloc[0]
    return {"world": world, "runs": len(per_run), "level": level, "lowest": float(per_run.min()),
            "highest": float(per_run.max()), "probed": probed, "floor_pct": abs(level - 1.0) * 100,
            "exact_pct": float(exact)}


def levels_table(folders) -> tuple[pd.DataFrame, list[str]]:
    """world_levels of every folder, one table, and why each folder it could not read was left out (a glob over a
    folder of validations meets other folders too); ValueError where it could read none."""
    tables, skipped = [], []
    for folder in folders:
        try:
            tables.append(world_levels(folder))
        except ValueError as e:
            skipped.append(str(e))
    if not tables:
        raise ValueError("no folder read: " + "; ".join(skipped))
    return pd.concat(tables), skipped


def levels_text(folders) -> str:
    """The table and what it says, as `python -m lssim.analysis.fidelity --levels` prints it."""
    table, skipped = levels_table(folders)
    out = table.round({"level": 3, "lowest": 3, "highest": 3, "probed": 3, "floor_pct": 2, "exact_pct": 2})
    beyond = table["floor_pct"] > 1.5 * table["exact_pct"]
    probed = table.dropna(subset=["probed"])
    follows = np.corrcoef(probed["level"], probed["probed"])[0, 1] if len(probed) > 2 else np.nan
    left = np.median(np.abs(probed["level"] / probed["probed"] - 1.0)) * 100 if len(probed) else np.nan
    return (f"per folder and world, the baseline's measured/predicted step time (level: the host's speed against the "
            f"profile's; lowest/highest: over its runs), the speed probe's median (probed), the error that level puts "
            f"on a twin exact at the profile's minutes (floor_pct = |level - 1|) and an exact model's (exact_pct)\n"
            f"{out.to_string()}\n\n"
            f"levels from {table['level'].min():.2f} to {table['level'].max():.2f} over {len(table)} worlds; "
            f"median floor {table['floor_pct'].median():.1f}% against an exact model's {table['exact_pct'].median():.1f}%; "
            f"floor over 1.5x an exact model's error in {int(beyond.sum())} of {len(table)}; the level's correlation "
            f"with the probe {follows:.2f} over the {len(probed)} worlds probed, |level / probed - 1| median "
            f"{left:.1f}%\n" + "".join(f"left out: {why}\n" for why in skipped))
