"""The goal and the noise: what `lssim validate` is judged against (TARGET_*), what an exact model would score against
the repeats' own spread (`noise_floor`, `speedup_noise_floor`), the repeats it would take to meet the goal, and
whether a miss lies within that noise (`within_noise`).
"""

from __future__ import annotations

import numpy as np
import pandas as pd


# What `lssim validate` is judged against (lssim.analysis.tables.format_fidelity prints each beside its measure): the
# per-step makespan's median and p90 absolute percentage error, and the speedup over baseline, in points.
TARGET_MEDIAN_PCT, TARGET_P90_PCT, TARGET_SPEEDUP_POINTS = 3.0, 8.0, 5.0


def step_errors_within_goal(median_pct, p90_pct):
    """Whether per-step errors (a median and a p90, in %; numbers or columns) are within the goal."""
    return (median_pct <= TARGET_MEDIAN_PCT) & (p90_pct <= TARGET_P90_PCT)


MAX_REPEATS_SEARCHED = 60  # noise_floor's repeats_for_goal looks no further


def noise_floor(steps_by_repeat: pd.DataFrame, draws: int = 2000, seed: int = 0, search: bool = True) -> pd.DataFrame:
    """Per policy: the step error an EXACT model would show against these repeats, from the real engine's
    run-to-run noise alone: how well the goal can be tested at all on this machine with this many repeats.

    The per-step median of k repeats is itself a noisy measurement. The noise is taken from the differences between
    repeats of a step (in log seconds, over sqrt(2), pooled over the policy's steps: 100-200 values with 5 repeats,
    so the stalls in the tail are in the pool) and resampled k at a time per step, `draws` times; an exact model's
    error on a step is then the distance of the resampled median from the truth.

    Columns: noise_floor_median_pct / noise_floor_p90_pct (the typical median and p90 over the steps of that
    error), noise_bound_median_pct / noise_bound_p90_pct (their 95th percentiles: a model whose errors lie within
    both cannot be told from an exact one), and repeats_for_goal (the fewest repeats at which an exact model's
    typical errors meet the goal; NaN beyond MAX_REPEATS_SEARCHED, and not searched with `search=False`, as the stop rule
    that reads only the floor asks). One repeat has no spread: NaN."""
    rng = np.random.default_rng(seed)
    rows = {}
    for name, s in steps_by_repeat.groupby("policy", sort=False):
        table = _step_table(s)
        k, n_steps = table.shape[1], table.shape[0]
        residuals = _repeat_noise(table)
        if k < 2 or residuals.size == 0:
            rows[name] = {"noise_floor_median_pct": np.nan, "noise_floor_p90_pct": np.nan, "noise_bound_median_pct": np.nan,
                          "noise_bound_p90_pct": np.nan, "repeats_for_goal": np.nan}
            continue

        def exact_errors(repeats: int) -> tuple[np.ndarray, np.ndarray]:
            medians = np.median(rng.choice(residuals, size=(draws, n_steps, repeats)), axis=2)
            ape = np.abs(np.expm1(-medians)) * 100  # truth against a measured median exp(m) times the truth
            return np.median(ape, axis=1), np.percentile(ape, 90, axis=1)

        def typically_meets_goal(repeats: int) -> bool:
            med, p90 = exact_errors(repeats)
            return bool(step_errors_within_goal(np.median(med), np.median(p90)))

        med, p90 = exact_errors(k)
        needed = next((r for r in range(2, MAX_REPEATS_SEARCHED + 1) if typically_meets_goal(r)), np.nan) if search else np.nan
        rows[name] = {"noise_floor_median_pct": float(np.median(med)), "noise_floor_p90_pct": float(np.median(p90)),
                      "noise_bound_median_pct": float(np.percentile(med, 95)), "noise_bound_p90_pct": float(np.percentile(p90, 95)),
                      "repeats_for_goal": needed}
    out = pd.DataFrame.from_dict(rows, orient="index")
    out.index.name = "policy"
    return out


def _step_table(rows: pd.DataFrame) -> pd.DataFrame:
    """One policy's measured seconds, a step x repeat table."""
    return rows.pivot_table(index="step", columns="repeat", values="measured_seconds", aggfunc="first")


def _repeat_noise(table: pd.DataFrame) -> np.ndarray:
    """The real engine's run-to-run noise in a step x repeat table of seconds, as log-seconds draws pooled over its
    steps. The noise itself, not deviations from the step's own median (those are shrunk, one in k is 0, and would
    put the floor ~3x too low): every difference of two repeats of a step, over sqrt(2), has the noise's spread."""
    logs = np.log(table.to_numpy(dtype=float))
    i, j = np.triu_indices(logs.shape[1], 1)
    residuals = ((logs[:, i] - logs[:, j]) / np.sqrt(2)).ravel()
    residuals = np.concatenate([residuals, -residuals])  # either repeat could have come first
    return residuals[np.isfinite(residuals)]


def _world_of(rows: pd.DataFrame) -> pd.Series:
    """Each row's world: its world column, else what follows the last '@' of its policy (`lssim validate` names a
    world's baseline baseline@world, and the stop rule every policy name@world), else one world for all."""
    if "world" in rows:
        return rows["world"].astype(str)
    name = rows["policy"].astype(str)
    return name.where(name.str.contains("@"), "@").str.rsplit("@", n=1).str[-1]


def speedup_noise_floor(steps_by_repeat: pd.DataFrame, speedups=None, repeats: int | None = None,
                        draws: int = 2000, seed: int = 0, search: bool = True) -> pd.DataFrame:
    """Per policy (not a baseline): the speedup error, in points, an EXACT model would show against these repeats,
    from the real engine's run-to-run noise alone: whether a speedup error can be told from noise at all.

    The measured speedup is the world's baseline over the policy, each the sum of its per-step medians of k repeats;
    both sums are noisy. Each policy's noise is `noise_floor`'s (differences between repeats of a step, pooled), and
    both are resampled k at a time per step, `draws` times; an exact model's error is then the distance of the
    resampled speedup from the truth, in points of the measured speedup (`speedups`: policy -> the reported speedup,
    e.g. per trained group; default: the ratio of the per-step medians' sums). `repeats`: resample as if that many
    had been recorded (default: those recorded). The baseline of a world is its policy named baseline or
    baseline@<world> (`_world_of`); a world without one has no rows.

    Columns: speedup_noise_floor_points (the typical error: median over the draws), speedup_noise_bound_points (its
    95th percentile: a speedup error within it cannot be told from an exact model's) and repeats_for_speedup_goal
    (the fewest repeats at which the typical error is within TARGET_SPEEDUP_POINTS; NaN beyond MAX_REPEATS_SEARCHED, and
    not searched with `search=False`). Under two repeats of either policy: NaN."""
    rng = np.random.default_rng(seed)
    speedups = dict(speedups or {})
    rows = {}
    frame = steps_by_repeat.assign(_world=_world_of(steps_by_repeat))
    for _, in_world in frame.groupby("_world", sort=False):
        tables = {name: _step_table(s) for name, s in in_world.groupby("policy", sort=False)}
        references = [n for n in tables if str(n) == "baseline" or str(n).startswith("baseline@")]
        if len(references) != 1:
            continue
        base = tables[references[0]]
        for name, table in tables.items():
            if name == references[0]:
                continue
            steps = table.index.intersection(base.index)
            pol, ref = table.loc[steps], base.loc[steps]
            noise_p, noise_r = _repeat_noise(pol), _repeat_noise(ref)
            if min(pol.shape[1], ref.shape[1]) < 2 or noise_p.size == 0 or noise_r.size == 0 or len(steps) == 0:
                rows[name] = {"speedup_noise_floor_points": np.nan, "speedup_noise_bound_points": np.nan,
                              "repeats_for_speedup_goal": np.nan}
                continue
            m_pol, m_ref = pol.median(axis=1).to_numpy(float), ref.median(axis=1).to_numpy(float)
            speedup = float(speedups.get(name, m_ref.sum() / m_pol.sum()))

            def errors(k: int) -> np.ndarray:
                def resampled(medians, noise):  # the sum of k-repeat medians over the true sum
                    draw = np.median(rng.choice(noise, size=(draws, len(medians), k)), axis=2)
                    return (medians * np.exp(draw)).sum(axis=1) / medians.sum()
                return np.abs(resampled(m_ref, noise_r) / resampled(m_pol, noise_p) - 1) * speedup * 100

            err = errors(repeats or min(pol.shape[1], ref.shape[1]))
            needed = next((k for k in range(2, MAX_REPEATS_SEARCHED + 1)
                           if np.median(errors(k)) <= TARGET_SPEEDUP_POINTS), np.nan) if search else np.nan
            rows[name] = {"speedup_noise_floor_points": float(np.median(err)),
                          "speedup_noise_bound_points": float(np.percentile(err, 95)), "repeats_for_speedup_goal": needed}
    out = pd.DataFrame.from_dict(rows, orient="index", columns=["speedup_noise_floor_points", "speedup_noise_bound_points",
                                                                "repeats_for_speedup_goal"])
    out.index.name = "policy"
    return out


LEVELS = ("makespan", "probed", "anchored")  # the step errors a summary reports: the profile alone, at the probed


def within_noise(summary: pd.DataFrame) -> pd.Series:
    """Per row: misses the goal, perhaps, but an exact model would have scored as badly on these repeats 1 time in
    20 or more: both step errors within noise_floor's 95% bounds, at one of the levels the summary reports (LEVELS:
    the profile alone, the probed level, the world's; the noise is the repeats', whatever sets the level), and the
    speedup error within the goal or within speedup_noise_floor's 95% bound (where the frame has it)."""
    speedup = summary["speedup_error_points"].abs() if "speedup_error_points" in summary else pd.Series(0.0, summary.index)
    speedup_in_noise = speedup <= TARGET_SPEEDUP_POINTS
    if "speedup_noise_bound_points" in summary:
        speedup_in_noise |= speedup <= summary["speedup_noise_bound_points"]
    steps_in_noise = pd.Series(False, summary.index)
    for level in LEVELS:
        if f"{level}_median_ape_pct" in summary:
            steps_in_noise |= ((summary[f"{level}_median_ape_pct"] <= summary["noise_bound_median_pct"])
                               & (summary[f"{level}_p90_ape_pct"] <= summary["noise_bound_p90_pct"]))
    return steps_in_noise & speedup_in_noise


def with_speedup_noise(summary: pd.DataFrame, steps_by_repeat: pd.DataFrame) -> pd.DataFrame:
    """`summary` (a policy_summary or fidelity_table frame with speedup_measured) with speedup_noise_floor's columns
    for its policies, in points of its measured speedups; in place, and returned."""
    floor = speedup_noise_floor(steps_by_repeat, summary["speedup_measured"].dropna().to_dict())
    for col in floor:
        summary[col] = summary.index.map(floor[col])
    return summary
