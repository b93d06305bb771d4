"""The validations pooled per policy: each policy's per-step error (the profile alone) beside an exact model's on the
same repeats, over several `lssim validate --out` folders, and whether each folder's twin priced the driver.

    python -m lssim.analysis.fidelity --pool paper/experiments/validation/full9 paper/experiments/validation/full8

Read from each folder's summary.csv and steps_by_repeat.parquet (nothing is replayed; `read_folder` is the one reader
of a folder, paper/experiments/validation_noise.py reads through it too): per policy (a world's baseline as
baseline@WORLD) the twin's median per-step error, an exact model's (noise_floor: from the summary, or computed from the
repeats for a folder written before it was), their ratio (`noise_ratio` in `lssim validate --json`) and the same
without the driver priced. A folder written before the driver was priced has only the twin without it;
one recorded before the runs held the driver's seconds cannot be priced at all, and the tables say which.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from lssim.analysis.fidelity.modes import is_modes_folder, modes_pool_text
from lssim.analysis.fidelity.noise import noise_floor
from lssim.analysis.fidelity.summary import load_summary

PRICED = "priced"
NOT_REPLAYED = "recorded, not priced: written before the twin priced it (replay its runs: lssim validate --runs)"
NOT_RECORDED = "not recorded: cannot be priced (its runs did not record the driver's seconds)"


# noise_floor's columns: what an exact model would score against a folder's repeats
EXACT_MODEL_COLUMNS = ("noise_floor_median_pct", "noise_floor_p90_pct", "noise_bound_median_pct", "noise_bound_p90_pct",
                       "repeats_for_goal")


@dataclass(frozen=True)
class ValidationFolder:
    """A `lssim validate --out` folder's tables: `summary` (per policy, as load_summary reads it: the speedup's noise
    floor and the runs added to an older folder's) and `by_repeat` (steps_by_repeat.parquet: each step of each
    repeat, measured and predicted)."""

    path: Path
    summary: pd.DataFrame
    by_repeat: pd.DataFrame

    def exact_model(self) -> pd.DataFrame:
        """Per policy, EXACT_MODEL_COLUMNS: the summary's where it holds them (as `lssim validate` wrote them), the
        rest computed from the repeats as `lssim validate` computes them (noise_floor, searching repeats_for_goal)."""
        recorded = [c for c in EXACT_MODEL_COLUMNS if c in self.summary]
        if len(recorded) == len(EXACT_MODEL_COLUMNS):
            return self.summary[list(EXACT_MODEL_COLUMNS)]
        computed = noise_floor(self.by_repeat).reindex(self.summary.index)
        return computed.assign(**{c: self.summary[c] for c in recorded})[list(EXACT_MODEL_COLUMNS)]


def read_folder(folder) -> ValidationFolder:
    """A validation folder's summary and steps by repeat; ValueError naming the folder and the file it lacks."""
    folder = Path(folder)
    for name in ("summary.csv", "steps_by_repeat.parquet"):
        if not (folder / name).is_file():
            raise ValueError(f"{folder}: no {name} (written by `lssim validate --out {folder}`)")
    by_repeat = pd.read_parquet(folder / "steps_by_repeat.parquet")
    return ValidationFolder(folder, load_summary(folder, by_repeat), by_repeat)


def folder_rows(folder) -> pd.DataFrame:
    """One row per policy of a validation folder: folder, world, runs, twin (its median per-step error, %, profile
    alone, as the folder's twin priced it), twin_unpriced (without the driver), exact (an exact model's:
    ValidationFolder.exact_model), ratio and ratio_unpriced (each over exact), and driver: PRICED, or why not (the
    world's reason, NOT_REPLAYED or NOT_RECORDED). ValueError naming the folder and the file it lacks."""
    read = read_folder(folder)
    summary, by_repeat = read.summary, read.by_repeat
    twin = summary["makespan_median_ape_pct"]
    unpriced = summary["unpriced_median_ape_pct"] if "unpriced_median_ape_pct" in summary else twin
    rows = pd.DataFrame({"folder": str(read.path), "world": summary["world"], "runs": summary["runs"], "twin": twin,
                         "twin_unpriced": unpriced, "exact": read.exact_model()["noise_floor_median_pct"]},
                        index=summary.index)
    rows["ratio"], rows["ratio_unpriced"] = rows["twin"] / rows["exact"], rows["twin_unpriced"] / rows["exact"]
    rows["driver"] = [_driver_status(summary.loc[p], by_repeat[by_repeat["policy"] == p]) for p in summary.index]
    rows.index.name = "policy"
    return rows


def _driver_status(row: pd.Series, policy_steps: pd.DataFrame) -> str:
    """PRICED, the world's reason it was not (a folder written since the driver was priced), or for an older folder
    whether its runs recorded the driver's seconds (NOT_REPLAYED) or not (NOT_RECORDED)."""
    if "driver_priced" in row and pd.notna(row["driver_priced"]):
        return PRICED if bool(row["driver_priced"]) else f"not priced: {row['driver_why']}"
    recorded = ("measured_driver_seconds" in policy_steps and len(policy_steps)
                and np.isfinite(policy_steps["measured_driver_seconds"].to_numpy(float)).all())
    return NOT_REPLAYED if recorded else NOT_RECORDED


def pool_rows(folders) -> pd.DataFrame:
    """folder_rows of every folder, one frame (the policy as a column)."""
    return pd.concat([folder_rows(f).reset_index() for f in folders], ignore_index=True)


def pool_policies(rows: pd.DataFrame) -> pd.DataFrame:
    """Per policy over `rows` (pool_rows): rows pooled, runs, the twin's error (median over the rows), an exact
    model's, ratio (the median of the rows' ratios, as `lssim validate --json`'s pooled), the same without the
    driver priced, and priced: in how many of its rows the driver was priced. A last row, "all", pools every row."""
    def pooled(r: pd.DataFrame) -> dict:
        return {"rows": len(r), "runs": int(r["runs"].sum()), "twin": r["twin"].median(), "exact": r["exact"].median(),
                "ratio": r["ratio"].median(), "twin_unpriced": r["twin_unpriced"].median(),
                "ratio_unpriced": r["ratio_unpriced"].median(), "priced": f"{int((r['driver'] == PRICED).sum())} of {len(r)}"}

    table = {policy: pooled(r) for policy, r in rows.groupby("policy", sort=False)}
    table["all"] = pooled(rows)
    out = pd.DataFrame.from_dict(table, orient="index")
    out.index.name = "policy"
    return out


def folder_drivers(rows: pd.DataFrame) -> pd.DataFrame:
    """Per folder and world: whether the driver was priced there, or why not (pool_rows' driver)."""
    return rows.groupby(["folder", "world"], sort=False)["driver"].first().to_frame()


def pool_text(folders) -> str:
    """The pooled tables `python -m lssim.analysis.fidelity --pool` prints: per policy over the policies' folders,
    per execution mode over the modes folders (`lssim validate --mode --out`; lssim.analysis.fidelity.modes)."""
    modes = [f for f in folders if is_modes_folder(f)]
    policies = [f for f in folders if not is_modes_folder(f)]
    text = modes_pool_text(modes) if modes else ""
    return text + ("\n" if text and policies else "") + (_policies_text(policies) if policies else "")


def _policies_text(folders) -> str:
    rows = pool_rows(folders)
    with pd.option_context("display.width", 250, "display.max_rows", 500, "display.max_colwidth", 150):
        return (f"per policy, pooled over {len(folders)} validation folder(s): the per-step error median % (the profile "
                f"alone; twin: as each folder's twin priced it, twin_unpriced: without the driver), an exact model's on "
                f"the same repeats (exact), ratio: twin / exact (the median over the rows), priced: rows whose twin "
                f"priced the driver\n"
                + pool_policies(rows).to_string(float_format=lambda v: f"{v:.2f}")
                + "\n\nthe driver, per folder and world:\n"
                + "".join(f"{folder}  {world}: {status}\n" for (folder, world), status in folder_drivers(rows)["driver"].items()))


__all__ = ["read_folder", "ValidationFolder", "EXACT_MODEL_COLUMNS", "folder_rows", "pool_rows", "pool_policies", "folder_drivers", "pool_text", "PRICED", "NOT_REPLAYED", "NOT_RECORDED"]
