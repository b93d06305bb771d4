"""Per policy, everything `lssim validate` reports (`policy_summary`), as JSON (`policy_results`), and read back from a
validation folder (`load_summary`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from lssim.analysis.fidelity.compare import ACTED_KINDS
from lssim.analysis.fidelity.noise import noise_floor, step_errors_within_goal, TARGET_MEDIAN_PCT, TARGET_P90_PCT, TARGET_SPEEDUP_POINTS, with_speedup_noise, within_noise


def policy_summary(summary: pd.DataFrame, acted_rows: pd.DataFrame, noise: pd.DataFrame | None,
                   anchored: pd.DataFrame | None = None, real_cuts: pd.DataFrame | None = None,
                   speedups: pd.DataFrame | None = None, steps_by_repeat: pd.DataFrame | None = None,
                   probed: pd.DataFrame | None = None) -> pd.DataFrame:
    """The fidelity table (`fidelity_table`, one row per policy) with, per policy, how much it acted on the real
    engine (`acted` rows, one per repeat: the median over repeats, and the fewest in one repeat), the real
    engine's run-to-run spread of its step times (`median_over_repeats`' spread: each repeat's step against the
    median of its repeats; median and p90, in %; NaN with one repeat), whether it meets the goal, and, with
    `anchored` (per-step medians of `anchor_on_baseline` rows, a speed_factor column), the same errors with the
    machine's speed level taken from its world's baseline (the speedup error does not change: a level cancels
    in a ratio). With `real_cuts` (per-step medians of replays `with_real_cuts`), the error of policies that end
    rollouts when the real engine's cut points are replayed rather than predicted. With `speedups`
    (`speedup_by_repeat`), the range of the measured speedup over the repeats and its spread in points. With
    `steps_by_repeat` holding speed_level (each run's probed speed over the cost model's, real_backend.speed_probe),
    its median over the repeats; with `probed` (per-step medians of the twin at each run's probed level), its
    errors and meets_goal_probed. With `steps_by_repeat` of several repeats, the noise floor (`noise_floor`: what an
    exact model would score against these repeats, and the repeats it needs to meet the goal) and within_noise: the
    errors, at one of the levels reported, lie within that floor's 95% bound."""
    out = summary.copy()
    if steps_by_repeat is not None and "speed_level" in steps_by_repeat:
        levels = steps_by_repeat.drop_duplicates(["policy", "repeat"]).groupby("policy")["speed_level"]
        out["speed_level"] = out.index.map(levels.median())
    if probed is not None and len(probed):
        by = probed.groupby("policy")["ape_pct"]
        out["probed_median_ape_pct"] = out.index.map(by.median())
        out["probed_p90_ape_pct"] = out.index.map(by.quantile(0.9))
    _add_repeat_columns(out, acted_rows, noise, speedups)
    speedup_ok = out["speedup_error_points"].abs() <= TARGET_SPEEDUP_POINTS if "speedup_error_points" in out else True
    out["meets_goal"] = step_errors_within_goal(out["makespan_median_ape_pct"], out["makespan_p90_ape_pct"]) & speedup_ok
    if "probed_median_ape_pct" in out:
        out["meets_goal_probed"] = step_errors_within_goal(out["probed_median_ape_pct"], out["probed_p90_ape_pct"]) & speedup_ok
    if steps_by_repeat is not None and len(steps_by_repeat):
        out["runs"] = out.index.map(steps_by_repeat.groupby("policy")["repeat"].nunique())
    if steps_by_repeat is not None and len(steps_by_repeat) and steps_by_repeat["repeat"].nunique() > 1:
        floor = noise_floor(steps_by_repeat)
        for col in floor:
            out[col] = out.index.map(floor[col])
        if "speedup_measured" in out:
            with_speedup_noise(out, steps_by_repeat)
    if anchored is not None and len(anchored):
        by = anchored.groupby("policy")
        out["anchored_median_ape_pct"] = out.index.map(by["ape_pct"].median())
        out["anchored_p90_ape_pct"] = out.index.map(by["ape_pct"].quantile(0.9))
        out["speed_factor"] = out.index.map(by["speed_factor"].first())
        out["meets_goal_anchored"] = (step_errors_within_goal(out["anchored_median_ape_pct"], out["anchored_p90_ape_pct"])
                                      & speedup_ok)
    if "noise_bound_median_pct" in out:
        out["within_noise"] = within_noise(out)
    if real_cuts is not None and len(real_cuts):
        by = real_cuts.groupby("policy")["ape_pct"]
        out["real_cuts_median_ape_pct"] = out.index.map(by.median())
        out["real_cuts_p90_ape_pct"] = out.index.map(by.quantile(0.9))
    return out


def with_driver(summary: pd.DataFrame, driver: pd.DataFrame, unpriced: pd.DataFrame) -> pd.DataFrame:
    """`summary` with, per row, its world's driver price (`driver`: one row per world, real_backend.validate_twin's
    world_driver: driver_priced, driver_why, driver_per_request / _per_token / _per_finish, the steps fitted...) and
    its step errors with the twin not charging it (`unpriced`: per-step medians; unpriced_median_ape_pct / _p90)."""
    out = summary.copy()
    for col in driver:
        out[col] = out["world"].map(driver[col])
    by = unpriced.groupby("policy")["ape_pct"]
    out["unpriced_median_ape_pct"] = out.index.map(by.median())
    out["unpriced_p90_ape_pct"] = out.index.map(by.agg(lambda v: float(np.percentile(v, 90))))
    return out


def _add_repeat_columns(out: pd.DataFrame, acted_rows: pd.DataFrame, noise: pd.DataFrame | None,
                        speedups: pd.DataFrame | None) -> None:
    """policy_summary's columns over the repeats, in place: the measured speedup's range, how much each policy acted
    (the median repeat, and the fewest), and the real engine's run-to-run spread of its step times."""
    if speedups is not None and len(speedups):
        by = speedups.groupby("policy")["speedup_measured"]
        out["speedup_repeat_min"], out["speedup_repeat_max"] = out.index.map(by.min()), out.index.map(by.max())
        out["speedup_spread_points"] = (out["speedup_repeat_max"] - out["speedup_repeat_min"]) * 100
    if len(acted_rows):
        counts = acted_rows.drop(columns="repeat").groupby("policy").median()
        for col in counts:
            out[col] = out.index.map(counts[col])
        out["acted_min"] = out.index.map(acted_rows.groupby("policy")["acted"].min())
    spread = noise.groupby("policy")["ape_pct"] if noise is not None and len(noise) else None
    out["repeat_spread_median_pct"] = out.index.map(spread.median()) if spread is not None else np.nan
    out["repeat_spread_p90_pct"] = out.index.map(spread.quantile(0.9)) if spread is not None else np.nan


def unacted(summary: pd.DataFrame) -> list[str]:
    """The policies (not baselines) whose median repeat changed no response on the real engine."""
    if "acted" not in summary:
        return [p for p in summary.index if not str(p).startswith("baseline")]
    return [p for p in summary.index if not str(p).startswith("baseline") and not summary.loc[p, "acted"] > 0]


def policy_results(summary: pd.DataFrame, out: str = "") -> dict:
    """`lssim validate --json`: one object, `policies: {name: {acted, step_error_median, step_error_p90,
    exact_step_error_median (an exact model's median against these repeats), noise_ratio (the first over it: the
    headline), speedup_error, repeat_spread, ..., noise_floor: {floor_median, floor_p90, bound_median, bound_p90} (an exact
    model's errors against these repeats, `noise_floor`), repeats_for_goal, speedup_noise: {floor, bound} (an exact
    model's speedup error in points, `speedup_noise_floor`), repeats_for_speedup_goal, meets_goal, meets_goal_probed,
    within_noise, runs, cost_model: the profile the world's twin priced with, step_error_median_unpriced and
    noise_ratio_unpriced (the twin without the driver's price), driver: {priced, why, per_request, per_token,
    per_finish, steps, excess_share} (its world's, `_driver_entry`)}}` (errors in %, the speedup error in points), the
    baselines apart, `pooled` (the median over every row of the twin's and an exact model's step error and of their
    ratio, with and without the driver priced, with the rows and runs it pools), `driver` (world -> its driver
    entry) and the goal."""
    policies, baselines = {}, {}
    for name, row in summary.iterrows():
        (baselines if str(name).startswith("baseline") else policies)[str(name)] = _policy_entry(row)
    rows = [*policies.values(), *baselines.values()]
    worlds = {str(r["world"]): r["driver"] for r in rows if isinstance(r["world"], str)}  # each world's driver price
    return {"policies": policies, "baselines": baselines, "out": out, "pooled": _pooled(rows), "driver": worlds,
            "goal": {"step_error_median": TARGET_MEDIAN_PCT, "step_error_p90": TARGET_P90_PCT,
                     "speedup_error": TARGET_SPEEDUP_POINTS},
            "all_acted": all((p["acted"] or 0) > 0 for p in policies.values())}


def json_number(v) -> float | None:
    """A JSON number: None for a missing or non-finite one (`--json`'s rule for every figure)."""
    return None if v is None or (isinstance(v, float) and not np.isfinite(v)) else float(v)


def _policy_entry(row: pd.Series) -> dict:
    """policy_results' object of one summary row."""
    model = row.get("cost_model")
    return {"world": row.get("world"), "spec": row.get("spec"), "cost_model": model if isinstance(model, str) else None,
            "acted": int(row["acted"]) if "acted" in row and pd.notna(row["acted"]) else None,
            "acted_by": {k: int(row[k]) for k in ACTED_KINDS if k in row and pd.notna(row[k])},
            "responses": int(row["responses"]) if "responses" in row and pd.notna(row["responses"]) else None,
            "step_error_median": json_number(row["makespan_median_ape_pct"]),
            "step_error_p90": json_number(row["makespan_p90_ape_pct"]),
            "exact_step_error_median": json_number(row.get("noise_floor_median_pct")),
            "noise_ratio": json_number(row["makespan_median_ape_pct"] / row["noise_floor_median_pct"]
                                  if "noise_floor_median_pct" in row else None),
            "speedup_error": json_number(row.get("speedup_error_points")),
            "speedup_measured": json_number(row.get("speedup_measured")),
            "speedup_predicted": json_number(row.get("speedup_predicted")),
            "speedup_spread": json_number(row.get("speedup_spread_points")),
            "speedup_error_from": {k: json_number(row.get(f"speedup_points_{k}")) for k in ("groups", "seconds", "driver", "engine")},
            "repeat_spread": json_number(row.get("repeat_spread_median_pct")),
            "repeat_spread_p90": json_number(row.get("repeat_spread_p90_pct")),
            "step_error_median_anchored": json_number(row.get("anchored_median_ape_pct")),
            "step_error_p90_anchored": json_number(row.get("anchored_p90_ape_pct")),
            "speed_factor": json_number(row.get("speed_factor")),
            "speed_level": json_number(row.get("speed_level")),
            "step_error_median_probed": json_number(row.get("probed_median_ape_pct")),
            "step_error_p90_probed": json_number(row.get("probed_p90_ape_pct")),
            "step_error_median_real_cuts": json_number(row.get("real_cuts_median_ape_pct")),
            "step_error_p90_real_cuts": json_number(row.get("real_cuts_p90_ape_pct")),
            "noise_floor": {k: json_number(row.get(f"noise_{k}_pct")) for k in ("floor_median", "floor_p90", "bound_median", "bound_p90")},
            "repeats_for_goal": json_number(row.get("repeats_for_goal")),
            "speedup_noise": {k: json_number(row.get(f"speedup_noise_{k}_points")) for k in ("floor", "bound")},
            "repeats_for_speedup_goal": json_number(row.get("repeats_for_speedup_goal")),
            "steps": int(row["steps"]), "runs": int(row["runs"]) if pd.notna(row.get("runs")) else None,
            "meets_goal": bool(row.get("meets_goal", False)),
            "meets_goal_probed": bool(row.get("meets_goal_probed", False)),
            "meets_goal_anchored": bool(row.get("meets_goal_anchored", False)),
            "within_noise": bool(row.get("within_noise", False)),
            **_driver_entry(row)}


def _pooled(rows: list[dict]) -> dict:
    """policy_results' `pooled`: the median over every row of the twin's and an exact model's step error and of their
    ratio, with and without the driver priced, and the rows and runs it pools."""
    pooled = {key: json_number(np.nanmedian([r[key] if r[key] is not None else np.nan for r in rows])) if rows else None
              for key in ("step_error_median", "exact_step_error_median", "noise_ratio", "step_error_median_unpriced",
                          "noise_ratio_unpriced")}
    return pooled | {"rows": len(rows), "runs": sum(r["runs"] or 0 for r in rows)}


def _driver_entry(row: pd.Series) -> dict:
    """policy_results' driver fields of one row: the twin's error without the driver priced (the same as
    step_error_median where it was not), its ratio over an exact model's, and the world's price: priced, why not,
    seconds per request / token / finish, the steps fitted and the excess's median share (null for a folder written
    before the driver was priced)."""
    unpriced = row.get("unpriced_median_ape_pct", row["makespan_median_ape_pct"])
    priced = row.get("driver_priced")
    why = row.get("driver_why")  # "" or NaN (read back from a csv) where it was priced
    fitted = {k: json_number(row.get(f"driver_{k}")) for k in ("per_request", "per_token", "per_finish", "steps", "excess_share")}
    return {"step_error_median_unpriced": json_number(unpriced),
            "noise_ratio_unpriced": json_number(unpriced / row["noise_floor_median_pct"] if "noise_floor_median_pct" in row else None),
            "driver": {"priced": None if priced is None or pd.isna(priced) else bool(priced),
                       "why": why if isinstance(why, str) and why else None,
                       **fitted}}


def load_summary(folder, steps_by_repeat: pd.DataFrame | None = None) -> pd.DataFrame:
    """A `lssim validate --out` folder's summary.csv. A folder written before the speedup's noise floor gets its
    columns (`with_speedup_noise`, from `steps_by_repeat`, else the folder's steps_by_repeat.parquet where it has one),
    and one written before the runs were counted its `runs`, from the same; within_noise is taken again (`within_noise`), so that folders written under an older rule read as new ones."""
    path = Path(folder) / "summary.csv"
    if not path.is_file():
        raise ValueError(f"{path}: no summary.csv (written by `lssim validate --out {folder}`)")
    summary = pd.read_csv(path, index_col="policy")
    by_repeat = Path(folder) / "steps_by_repeat.parquet"
    if steps_by_repeat is None and by_repeat.is_file() and ("runs" not in summary or "speedup_noise_bound_points" not in summary):
        steps_by_repeat = pd.read_parquet(by_repeat)
    if "speedup_noise_bound_points" not in summary and "speedup_measured" in summary and steps_by_repeat is not None:
        with_speedup_noise(summary, steps_by_repeat)
    if "runs" not in summary and steps_by_repeat is not None:  # folders written before the runs were counted
        summary["runs"] = summary.index.map(steps_by_repeat.groupby("policy")["repeat"].nunique())
    if "noise_bound_median_pct" in summary:  # every folder read under today's rule
        summary["within_noise"] = within_noise(summary)
    return summary
