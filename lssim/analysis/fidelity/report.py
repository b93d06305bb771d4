"""Fidelity as markdown (the README's tables: `fidelity_markdown`, `phases_markdown`, `markdown_from` a folder) and as a
plot (`plot`).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from lssim.analysis.fidelity.compare import phases_table
from lssim.analysis.fidelity.noise import MAX_REPEATS_SEARCHED, TARGET_MEDIAN_PCT, TARGET_P90_PCT, TARGET_SPEEDUP_POINTS
from lssim.analysis.fidelity.summary import load_summary


def phases_markdown(phases: pd.DataFrame) -> str:
    """phases_table as the markdown sections `lssim validate` adds to fidelity.md: every policy's admission against
    the rest of its steps; for worlds of several instances, the shared part and the tail."""
    t = phases_table(phases)
    level = ("measured / predicted (`lssim validate`: the twin at each run's probed speed level where every run of the "
             "world was probed; ratios are the median of the steps' ratios)")
    lines = ["", "Where each step's time went (median over steps): the admission (from the step's first submission until "
             "every request submitted before its first token had one: the front end takes them one by one, the twin as one "
             f"prefill; lssim.analysis.fidelity.admission_seconds) and the generation after it, {level}.", "",
             "The driver's share is the part of each real rollout the driver worked on its own thread instead of waiting "
             "for the engine (the controller, the policy, rewards, submit and abort calls; real_backend.recorder's "
             "driver_seconds): on a host whose cores the driver shares with the engine it is time the engine loses, and the "
             "twin charges what a world's baseline runs hold beyond the profile's cells where that world's driver is priced "
             "(the driver's price, below).", "",
             "| policy | admission: measured / predicted s | generation: measured / predicted | driver's share | steps |",
             "|---|---|---|---|---|"]
    for name, r in t.iterrows():
        share = r.get("measured_driver_share", np.nan)
        lines.append(f"| `{name}` | {r.measured_admission_seconds:.3f} / {r.predicted_admission_seconds:.3f} | "
                     f"{r.generation_ratio:.3f} | {'-' if share != share else f'{share:.1%}'} | {int(r.steps)} |")
    several = t[t["instances"] > 1]
    if len(several):
        lines += ["", "Worlds of several instances, where the step's time went (median over steps): the shared part (every "
                  "instance the step used still busy: lssim.sim.shared_host prices it with s_2) and the tail one instance runs "
                  f"alone (s_1), {level}.", "",
                  "| policy | shared part: measured / predicted s (ratio) | tail: measured / predicted s | steps |", "|---|---|---|---|"]
        for name, r in several.iterrows():
            lines.append(f"| `{name}` | {r.measured_shared_seconds:.3f} / {r.predicted_shared_seconds:.3f} ({r.shared_ratio:.3f}) | "
                         f"{r.measured_tail_seconds:.3f} / {r.predicted_tail_seconds:.3f} | {int(r.steps)} |")
    return "\n".join(lines) + "\n"


def fidelity_markdown(summary: pd.DataFrame, profile: str = "") -> str:
    """The README's fidelity table, from `policy_summary`'s frame (`lssim validate` writes it as fidelity.md)."""
    def pct(r, col):
        v = r.get(col, np.nan)
        return "" if pd.isna(v) else f"{v:.1f}"

    probed = "probed_median_ape_pct" in summary and summary["probed_median_ape_pct"].notna().any()
    floor = "noise_floor_median_pct" in summary and summary["noise_floor_median_pct"].notna().any()
    speedup_floor = "speedup_noise_bound_points" in summary and summary["speedup_noise_bound_points"].notna().any()
    lines = ["| policy | world | acted (of responses) | step error median / p90 % | "
             + ("at the probed speed level median / p90 % | " if probed else "")
             + "with the world's speed level median / p90 % | repeat spread median / p90 % | "
             + ("an exact model's error median / p90 % (repeats for the goal) | " if floor else "")
             + "speedup real (repeats) / sim | speedup error (points)"
             + (" (an exact model's 95% bound)" if speedup_floor else "") + " | goal |",
             "|" + "---|" * (9 + probed + floor)]
    for name, r in summary.iterrows():
        acted_text = f"{int(r['acted'])} of {int(r['responses'])}" if pd.notna(r.get("acted", np.nan)) else "(reference)"
        anchored = f"{pct(r, 'anchored_median_ape_pct')} / {pct(r, 'anchored_p90_ape_pct')}" if pd.notna(r.get("anchored_median_ape_pct", np.nan)) else "(reference)"
        goal = ("yes" if r.get("meets_goal") else "at the probed level" if r.get("meets_goal_probed")
                else "with the level" if r.get("meets_goal_anchored") else "within noise" if r.get("within_noise") else "no")
        cells = [f"`{name}`", str(r.get("world", "")), acted_text,
                 f"{pct(r, 'makespan_median_ape_pct')} / {pct(r, 'makespan_p90_ape_pct')}",
                 *([f"{pct(r, 'probed_median_ape_pct')} / {pct(r, 'probed_p90_ape_pct')}"] if probed else []), anchored,
                 f"{pct(r, 'repeat_spread_median_pct')} / {pct(r, 'repeat_spread_p90_pct')}",
                 *([f"{pct(r, 'noise_floor_median_pct')} / {pct(r, 'noise_floor_p90_pct')}{_repeats_for_goal(r)}"] if floor else []),
                 f"{r.get('speedup_measured', np.nan):.3f}{_repeat_range(r)} / {r.get('speedup_predicted', np.nan):.3f}",
                 f"{r.get('speedup_error_points', np.nan):+.1f}" + _speedup_bound(r), goal]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", f"Goal: per-step makespan error median <= {TARGET_MEDIAN_PCT:.0f}%, p90 <= {TARGET_P90_PCT:.0f}%, speedup "
                  f"within {TARGET_SPEEDUP_POINTS:.0f} points. Step error: the profiled cost model's prediction against vLLM; "
                  + ("at the probed speed level: the same, scaled by each run's speed level (the median of the four "
                     "probes nearest the run, a fixed batch timed on the engine between every two runs, over the same "
                     "probe around the profile's measurement: real_backend/speed_probe.py); " if probed else "")
                  + f"with the world's speed level: every prediction scaled by the median measured/predicted ratio of the "
                  f"world's baseline steps (the machine's speed in those minutes; the baseline is then calibrated, not "
                  f"predicted). Repeat spread: each repeat's step time against the median of its repeats on the real "
                  f"engine (same policy, same seed), the noise no model can predict; (repeats): the range of the real "
                  f"speedup over the repeats, each against its world's baseline recorded in the same minutes."
                  + (" An exact model's error: what a model that predicted every step exactly would score against the "
                     "per-step medians of these repeats, from the repeats' spread alone (lssim.analysis.fidelity.noise_floor); "
                     "(repeats for the goal): how many repeats would bring that under the goal. Goal 'within noise': "
                     "missed, but within the 95% bound of that exact model's errors at one of the levels (the profile alone, "
                     "the probed level, the world's)." if floor else "")
                  + (" The speedup's bound: 95% of an exact model's speedup errors against these repeats lie within it "
                     "(lssim.analysis.fidelity.speedup_noise_floor); a speedup error within it cannot be told from noise." if speedup_floor else "")
                  + (f" Cost model: {profile}." if profile else "")]
    return "\n".join(lines) + _speedup_parts_markdown(summary) + driver_markdown(summary) + "\n"


def _speedup_parts_markdown(summary: pd.DataFrame) -> str:
    """Where the runs recorded the driver's own time: each speedup error split into the points of groups trained, of
    the driver's time and of the engine (_speedup_error_parts)."""
    if "speedup_points_driver" not in summary or summary["speedup_points_driver"].isna().all():
        return ""
    lines = ["", "", "Each speedup error split (points; they add up): from groups trained (the twin trained more or fewer), "
             "from the driver's own time in the real rollouts (the controller, the policy, rewards, submit and abort calls, "
             "recorded as driver_seconds: on this host it shares the engine's cores; the measured speedup recomputed without "
             "it), and from the engine (the rest: the cost model's, with the driver's price where the world has one).", "",
             "| policy | speedup error | groups | driver | engine |", "|---|---|---|---|---|"]
    for name, r in summary.iterrows():
        if name.startswith("baseline") or pd.isna(r.get("speedup_points_driver", np.nan)):
            continue
        lines.append(f"| `{name}` | {r['speedup_error_points']:+.1f} | {r['speedup_points_groups']:+.1f} | "
                     f"{r['speedup_points_driver']:+.1f} | {r['speedup_points_engine']:+.1f} |")
    return "\n".join(lines)


def driver_markdown(summary: pd.DataFrame) -> str:
    """The driver's price per world (real_backend.validate_twin.world_driver: fitted on the world's baseline runs
    against the profile's cells, or why not) and each row's step error and noise ratio with and without it; empty
    for a summary written before the driver was priced."""
    if "driver_priced" not in summary:
        return ""
    lines = ["", "", "The driver's price per world: the driver's seconds the world's baseline runs hold beyond what the "
             "profile's cells' own driver takes, fitted per request submitted, token streamed and response finished (NNLS, "
             "lssim.analysis.fidelity.driver) and charged by every twin of the world (lssim.sim.shared_host); steps: the "
             "baseline's steps fitted; excess: the median share of their driver seconds beyond the cells'.", "",
             "| world | priced | per request ms | per token us | per finish ms | steps | excess | why not |", "|---|---|---|---|---|---|---|---|"]
    for world, r in summary.groupby("world", sort=False).first().iterrows():
        fitted = pd.notna(r.get("driver_per_request", np.nan))
        numbers = (f"{r['driver_per_request'] * 1e3:.3f} | {r['driver_per_token'] * 1e6:.2f} | {r['driver_per_finish'] * 1e3:.3f} | "
                   f"{int(r['driver_steps'])} | {r['driver_excess_share']:.0%}") if fitted else " | | | | "
        why = r.get("driver_why")
        lines.append(f"| {world} | {'yes' if r['driver_priced'] else 'no'} | {numbers} | {why if isinstance(why, str) else ''} |")
    lines += ["", "| policy | step error median %: driver priced / not | an exact model's % | noise ratio: priced / not |",
              "|---|---|---|---|"]
    for name, r in summary.iterrows():
        exact = r.get("noise_floor_median_pct", np.nan)
        priced, unpriced = r["makespan_median_ape_pct"], r["unpriced_median_ape_pct"]
        lines.append(f"| `{name}` | {priced:.1f} / {unpriced:.1f} | {exact:.1f} | {priced / exact:.2f} / {unpriced / exact:.2f} |")
    return "\n".join(lines)


def _repeats_for_goal(r) -> str:
    n = r.get("repeats_for_goal", np.nan)
    if pd.isna(r.get("noise_floor_median_pct", np.nan)):
        return ""
    return f" (>{MAX_REPEATS_SEARCHED})" if pd.isna(n) else f" ({int(n)})"


def _speedup_bound(r) -> str:
    bound = r.get("speedup_noise_bound_points", np.nan)
    return "" if pd.isna(bound) else f" ({bound:.1f})"


def _repeat_range(r) -> str:
    lo, hi = r.get("speedup_repeat_min", np.nan), r.get("speedup_repeat_max", np.nan)
    return "" if pd.isna(lo) or pd.isna(hi) or lo == hi else f" ({lo:.2f}-{hi:.2f})"


def markdown_from(folder) -> str:
    """fidelity_markdown of a `lssim validate --out` folder's summary.csv (`load_summary`: the README's table,
    regenerated without replaying anything): `python -m lssim.analysis.fidelity paper/experiments/validation/full1`."""
    return fidelity_markdown(load_summary(folder))


def plot(steps: pd.DataFrame, path, title: str = "") -> None:
    """Predicted against measured rollout seconds, one point per step, one colour per policy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 5))
    colors, markers = plt.cm.tab20.colors, "osD^v<>p"
    for i, (name, s) in enumerate(steps.groupby("policy", sort=False)):  # a colour and a marker each: 13+ policies
        ax.scatter(s["measured_seconds"], s["predicted_seconds"], s=20, label=name, color=colors[i % 20], marker=markers[i % 8])
    lo = float(min(steps["measured_seconds"].min(), steps["predicted_seconds"].min())) * 0.9
    hi = float(max(steps["measured_seconds"].max(), steps["predicted_seconds"].max())) * 1.1
    ax.plot([lo, hi], [lo, hi], color="black", lw=0.8)
    ax.fill_between([lo, hi], [lo * 0.92, hi * 0.92], [lo * 1.08, hi * 1.08], color="grey", alpha=0.15, label="±8%")
    ax.set(xlabel="measured rollout seconds (vLLM)", ylabel="predicted rollout seconds (simulator)", xlim=(lo, hi), ylim=(lo, hi),
           title=title or "simulator vs real engine, per step")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120, format="png")  # the path may be a temporary name
    plt.close(fig)
