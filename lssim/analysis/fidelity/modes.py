"""The execution modes' validation against the noise: per mode, the twin's per-step error beside an exact model's on
the same runs (`noise_floor` on the per-repeat steps; their ratio, `noise_ratio`, is the headline), the speedup over
collocated measured and predicted with an exact model's bound on its error, and `lssim validate --mode --json`'s
object (`modes_results`).

Rows in (real_backend.validate_modes.compare_modes' steps_by_repeat): label, mode, policy, step, repeat,
measured_seconds, predicted_seconds, measured_groups, predicted_groups (one row per run and step).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from lssim.analysis.fidelity.noise import noise_floor, speedup_noise_floor
from lssim.analysis.fidelity.summary import json_number
from lssim.loop.modes import MODES

REFERENCE_MODE = "collocated"  # what each mode's speedup is over


def mode_noise(by_repeat: pd.DataFrame, summary: pd.DataFrame) -> pd.DataFrame:
    """`summary` (one row per label) with: runs (repeats of the label), exact_step_error_median / _p90 (an exact
    model's per-step error against these repeats: noise_floor), exact_bound_median (its 95% bound), noise_ratio (the
    twin's median over the exact model's), speedup over collocated measured and predicted (per trained group, the
    label's policy in collocated as the reference), speedup_error_points and speedup_noise_bound_points (an exact
    model's 95% bound on it: speedup_noise_floor). NaN where the repeats cannot tell (one run)."""
    out = summary.copy()
    out["runs"] = out.index.map(by_repeat.groupby("label")["repeat"].nunique())
    rows = by_repeat[by_repeat["in_twin"]] if "in_twin" in by_repeat else by_repeat
    floor = noise_floor(rows.assign(policy=rows["label"]), search=False)
    out["exact_step_error_median"] = out.index.map(floor["noise_floor_median_pct"])
    out["exact_step_error_p90"] = out.index.map(floor["noise_floor_p90_pct"])
    out["exact_bound_median"] = out.index.map(floor["noise_bound_median_pct"])
    out["noise_ratio"] = out["step_median_ape_pct"] / out["exact_step_error_median"]
    _speedups(out, rows)
    return out


def _speedups(out: pd.DataFrame, rows: pd.DataFrame) -> None:
    """Each label's speedup over its policy in collocated (seconds per trained group), measured and predicted, the
    error in points and an exact model's bound on it; NaN without a collocated label of the policy."""
    for col in ("speedup_measured", "speedup_predicted", "speedup_error_points", "speedup_noise_bound_points"):
        out[col] = np.nan
    for policy, labels in out.groupby(out.index.map(rows.groupby("label")["policy"].first())):
        reference = labels.index[labels["mode"] == REFERENCE_MODE]
        if len(reference) != 1:
            continue
        ref = out.loc[reference[0]]
        measured = ref["measured_s_per_group"] / labels["measured_s_per_group"]
        predicted = ref["predicted_s_per_group"] / labels["predicted_s_per_group"]
        out.loc[labels.index, "speedup_measured"] = measured
        out.loc[labels.index, "speedup_predicted"] = predicted
        out.loc[labels.index, "speedup_error_points"] = (predicted - measured) * 100
        # speedup_noise_floor's world: the reference named baseline@modes, the others <label>@modes
        named = rows[rows["label"].isin(labels.index)]
        named = named.assign(policy=np.where(named["label"] == reference[0], "baseline@modes", named["label"] + "@modes"),
                             world="modes")
        bound = speedup_noise_floor(named, {f"{k}@modes": v for k, v in measured.items()}, search=False)
        for label in labels.index.drop(reference[0]):
            if f"{label}@modes" in bound.index:
                out.loc[label, "speedup_noise_bound_points"] = bound.loc[f"{label}@modes", "speedup_noise_bound_points"]
    out.loc[out["mode"] == REFERENCE_MODE, "speedup_noise_bound_points"] = 0.0


def mode_key(label: str, mode: str, policy: str) -> str:
    """A label's key in the JSON: its mode, with the policy where it is not the baseline."""
    return mode if policy == "baseline" else f"{mode} / {policy}"


def modes_results(summary: pd.DataFrame, by_repeat: pd.DataFrame, out: str = "") -> dict:
    """`lssim validate --mode --json`: one object, `modes: {mode: {label, runs, steps, step_error_median,
    step_error_p90, exact_step_error_median, exact_step_error_p90, noise_ratio, speedup_measured,
    speedup_predicted, speedup_error, speedup_noise_bound, step_error_median_unshared (the twin with dedicated
    devices: what a GPU-like twin scores here), step_error_median_anchored, probed_level (the runs' median probed
    level the twin priced at; null: the profile alone), ...}}` (errors in %, speedup errors in points), and `pooled`: the step errors over every run's steps with the number of runs."""
    policy_of = by_repeat.groupby("label")["policy"].first()
    modes = {}
    for label, row in summary.iterrows():
        modes[mode_key(label, row["mode"], policy_of[label])] = {
            "label": label, "runs": int(row["runs"]), "steps": int(row["steps"]),
            "steps_not_in_twin": int(row["steps_not_in_twin"]),
            "step_error_median": json_number(row["step_median_ape_pct"]), "step_error_p90": json_number(row["step_p90_ape_pct"]),
            "step_error_median_signed": json_number(row["step_median_signed_pct"]),
            "exact_step_error_median": json_number(row["exact_step_error_median"]),
            "exact_step_error_p90": json_number(row["exact_step_error_p90"]),
            "noise_ratio": json_number(row["noise_ratio"]),
            "speedup_measured": json_number(row["speedup_measured"]), "speedup_predicted": json_number(row["speedup_predicted"]),
            "speedup_error": json_number(row["speedup_error_points"]),
            "speedup_noise_bound": json_number(row["speedup_noise_bound_points"]),
            "step_error_median_unshared": json_number(row.get("unshared_median_ape_pct")),
            "step_error_p90_unshared": json_number(row.get("unshared_p90_ape_pct")),
            "step_error_median_anchored": json_number(row["anchored_median_ape_pct"]),
            "step_error_p90_anchored": json_number(row["anchored_p90_ape_pct"]),
            "s_per_group_measured": json_number(row["measured_s_per_group"]),
            "s_per_group_predicted": json_number(row["predicted_s_per_group"]),
            "max_staleness_measured": int(row["measured_max_staleness"]),
            "max_staleness_predicted": int(row["predicted_max_staleness"]),
            "rank_measured": int(row["measured_rank"]), "rank_predicted": int(row["predicted_rank"]),
            "probed_level": json_number(_median_level(by_repeat, label))}
    return {"out": out, "modes": modes, "pooled": pooled(summary, by_repeat),
            "ranking_agrees": bool((summary["measured_rank"] == summary["predicted_rank"]).all())}


def _median_level(by_repeat: pd.DataFrame, label: str) -> float:
    """The label's runs' median probed speed level (the twin priced at it), NaN where it priced with the profile alone."""
    if "probed_level" not in by_repeat:
        return float("nan")
    levels = by_repeat.loc[by_repeat["label"] == label].drop_duplicates("repeat")["probed_level"].dropna()
    return float(levels.median()) if len(levels) else float("nan")


def pooled(summary: pd.DataFrame, by_repeat: pd.DataFrame) -> dict:
    """Over every label: the median of the labels' twin and exact-model step errors, the median noise ratio, and
    the number of runs and labels they pool."""
    return {"runs": int(by_repeat.groupby("label")["repeat"].nunique().sum()), "labels": len(summary),
            "step_error_median": json_number(float(summary["step_median_ape_pct"].median())),
            "exact_step_error_median": json_number(float(summary["exact_step_error_median"].median())),
            "noise_ratio": json_number(float(summary["noise_ratio"].median()))}


MODES_SUMMARY = "modes_summary.csv"  # what `lssim validate --mode --out` writes beside its runs
_POOLED_COLUMNS = ("mode", "runs", "step_median_ape_pct", "exact_step_error_median", "noise_ratio", "speedup_error_points")


def is_modes_folder(folder) -> bool:
    """Whether `folder` is a `lssim validate --mode --out` folder (its summary is per mode, not per policy)."""
    return (Path(folder) / MODES_SUMMARY).is_file()


def modes_folder_rows(folder) -> pd.DataFrame:
    """One row per label of a modes folder, as its twin priced it (summary_rows of its MODES_SUMMARY). ValueError
    naming the folder and the file or the columns it lacks."""
    path = Path(folder) / MODES_SUMMARY
    if not path.is_file():
        raise ValueError(f"{folder}: no {MODES_SUMMARY} (written by `lssim validate --mode ... --out {folder}`)")
    return summary_rows(pd.read_csv(path, index_col=0), str(folder), source=str(path))


def summary_rows(summary: pd.DataFrame, folder: str, source: str = "") -> pd.DataFrame:
    """One row per label of a modes summary (`lssim validate --mode`'s, its index the labels): folder, key (mode_key),
    mode, runs, twin (the median per-step error %), exact (an exact model's on the same repeats), ratio,
    speedup_error (points). ValueError naming `source` and the columns it lacks."""
    missing = set(_POOLED_COLUMNS) - set(summary.columns)
    if missing:
        raise ValueError(f"{source or folder}: no column(s) {', '.join(sorted(missing))}")
    policies = [str(label).rsplit(" / ", 1)[-1] for label in summary.index]
    return pd.DataFrame({"folder": folder,
                         "key": [mode_key(lab, m, p) for lab, m, p in zip(summary.index, summary["mode"], policies)],
                         "mode": summary["mode"].to_numpy(), "runs": summary["runs"].to_numpy(),
                         "twin": summary["step_median_ape_pct"].to_numpy(),
                         "exact": summary["exact_step_error_median"].to_numpy(),
                         "ratio": summary["noise_ratio"].to_numpy(),
                         "speedup_error": summary["speedup_error_points"].to_numpy()})


def pool_modes(folders) -> pd.DataFrame:
    """pool_rows over several modes folders' rows (modes_folder_rows)."""
    return pool_rows(pd.concat([modes_folder_rows(f) for f in folders], ignore_index=True))


def pool_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """Per mode (policy beside it where not the baseline) over summary_rows of several recordings: recordings, runs,
    the twin's error and an exact model's (medians over the recordings), ratio (the median of the recordings'
    ratios, as each `--json`'s pooled), ratio_range (their least and greatest: how far one recording's figure
    swings) and speedup_error (mean, points), in the modes' order. A last row, "all", pools every row."""

    def pooled(r: pd.DataFrame) -> dict:
        return {"recordings": r["folder"].nunique(), "runs": int(r["runs"].sum()), "twin": r["twin"].median(),
                "exact": r["exact"].median(), "ratio": r["ratio"].median(),
                "ratio_range": f"{r['ratio'].min():.2f}-{r['ratio'].max():.2f}", "speedup_error": r["speedup_error"].mean()}

    order = rows["mode"].map({m: k for k, m in enumerate(MODES)}).fillna(len(MODES))
    table = {key: pooled(r) for key, r in rows.assign(order=order).sort_values("order", kind="stable").groupby("key", sort=False)}
    table["all"] = pooled(rows)
    out = pd.DataFrame.from_dict(table, orient="index")
    out.index.name = "mode"
    return out


AS_RECORDED = ("as each folder's twin priced it (to pool by the twin as it is now, replay each first: lssim validate "
               "--mode any --runs DIR/real/*/*/repeat* --profile DIR/profile.json --out NEW)")


def modes_pool_text(folders) -> str:
    """The per-mode table `python -m lssim.analysis.fidelity --pool` prints for modes folders."""
    return pooled_text(pool_modes(folders), len(folders), AS_RECORDED)


def pooled_text(table: pd.DataFrame, recordings: int, priced: str) -> str:
    """pool_rows' table with what it holds; `priced`: by which twin."""
    with pd.option_context("display.width", 250):
        return (f"per execution mode, pooled over {recordings} modes folder(s) {priced}: the per-step error median % "
                f"(twin), an exact model's on the same repeats (exact), ratio: twin / exact (the median over the "
                f"recordings; ratio_range: theirs), speedup_error: over collocated, points (the mean)\n"
                + table.to_string(float_format=lambda v: f"{v:.2f}") + "\n")


__all__ = ["mode_noise", "modes_results", "pooled", "mode_key", "REFERENCE_MODE", "is_modes_folder", "modes_folder_rows",
           "summary_rows", "pool_modes", "pool_rows", "modes_pool_text", "pooled_text", "MODES_SUMMARY"]
