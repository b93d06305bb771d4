"""The execution modes' validation against the noise: per mode, the twin's per-step error beside an exact model's on
the same runs (`noise_floor` on the per-repeat steps; their ratio, `noise_ratio`, is the headline), the speedup over
collocated measured and predicted with an exact model's bound on its error, and `lssim validate --mode --json`'s
object (`modes_results`).

Rows in (real_backend.validate_modes.compare_modes' steps_by_repeat): label, mode, policy, step, repeat,
measured_seconds, predicted_seconds, measured_groups, predicted_groups (one row per run and step).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from lssim.analysis.fidelity.noise import noise_floor, speedup_noise_floor
from lssim.analysis.fidelity.summary import json_number

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


__all__ = ["mode_noise", "modes_results", "pooled", "mode_key", "REFERENCE_MODE"]
