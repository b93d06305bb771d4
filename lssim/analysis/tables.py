"""The terminal tables and progress lines lssim prints, one place for both worlds.

    format_summary(table)     one row per policy: a `lssim.analysis.replay.summarize` / `lssim.analysis.sweep.sweep` table
                              (`lssim replay`, `lssim sweep`)
    format_step(row)          one line per RL step: the controller's step row (`lssim real`, and the runs
                              `lssim validate` records)
    format_fidelity(frames)   the simulator's prediction against vLLM's measurement: the frames of
                              `real_backend.sim_vs_real.validate` (`lssim validate`)

Plain strings, no colour, nothing printed here: the commands decide where each goes (stdout or stderr).
"""

from __future__ import annotations

from typing import Callable

_Format = str | Callable[[float], str]

TABLE_COLUMNS: dict[str, tuple[str, _Format]] = {  # summary column -> (header, format)
    "step_seconds": ("step s", lambda v: f"{v:,.0f}" if v >= 100 else f"{v:.3g}"),  # end to end: the run's wall time
    "speedup": ("speedup", "{:.3f}x"),  # end to end, per trained group, against baseline in the same mode
    "rollout_seconds": ("rollout s", lambda v: f"{v:,.0f}" if v >= 100 else f"{v:.3g}"),  # a CPU run's seconds or a cluster's days
    "rollout_speedup": ("rollout x", "{:.3f}x"),
    "tokens_per_second": ("tok/s", "{:,.0f}"),
    "lower_bound_efficiency": ("bound eff", "{:.1%}"),
    "long_tail_ratio": ("tail ratio", "{:.2f}"),
    "busy_fraction": ("busy", "{:.1%}"),
    "mean_running": ("batch", "{:.0f}"),
    "truncated_fraction": ("truncated", "{:.1%}"),
    "policy_stopped_fraction": ("stopped", "{:.1%}"),
    "tokens_saved_fraction": ("saved", "{:.1%}"),
    "stopped_correct_fraction": ("stop FP", "{:.1%}"),
    "off_policy_token_fraction": ("off-policy", "{:.1%}"),
    "max_staleness": ("max stale", "{:.0f}"),
    "trained_tokens_vs_baseline": ("trained tok x", "{:.3f}x"),  # response tokens trained, against baseline's
    "length_bias": ("len bias", "{:.3f}"),  # mean trained response length over the trace's (lssim.analysis.signal)
    "effective_group_fraction": ("eff groups", "{:.1%}"),
    "exact_fraction": ("exact", "{:.1%}"),
    "steps": ("steps", "{:d}"),
}


def format_summary(table) -> str:
    """The terminal table: one row per policy, the columns a researcher reads first."""
    return format_table(table.rename_axis("policy").reset_index(), {"policy": ("policy", "{}"), **TABLE_COLUMNS})


def format_table(table, columns: dict[str, tuple[str, _Format]]) -> str:
    """Rows of `table` under `columns` (column -> (header, format)), those it has; the first left-aligned, the
    others right-aligned, NaN as "-"."""
    columns = {col: spec for col, spec in columns.items() if col in table.columns}  # a table may lack some
    headers = [h for h, _ in columns.values()]
    cell = lambda v, fmt: "-" if v != v else fmt(v) if callable(fmt) else fmt.format(v)  # noqa: E731  (NaN: nothing to report)
    rows = [[cell(row[col], fmt) for col, (_, fmt) in columns.items()] for _, row in table.iterrows()]
    widths = [max(len(r[i]) for r in [headers] + rows) for i in range(len(headers))]
    line = lambda cells: "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))  # noqa: E731
    return "\n".join([line(headers), line(["-" * w for w in widths])] + [line(r) for r in rows])


def format_step(row: dict) -> str:
    """One progress line per step."""
    def f(key, fmt, default="-"):
        v = row.get(key)
        return default if v is None or v != v else format(v, fmt)

    return (f"step {row['step']:3d}  reward {f('mean_reward', '.3f')}  rollout {row['rollout_seconds']:6.2f} s  "
            f"tokens {row['tokens']:6,d} ({f('tokens_per_second', ',.0f')} tok/s)  train {row['train_seconds']:5.2f} s  "
            f"responses {row['responses_in']} = {row['finished']} stop + {row['truncated']} length + "
            f"{row['policy_stopped']} policy + {row['dropped']} dropped + {row['carried_out']} carried  "
            f"groups {row['groups_trained']} ({row['effective_groups']} with signal)  loss {f('trainer_loss', '.4f')}")


def format_fidelity(frames: dict) -> str:
    """The `lssim validate` report: per policy the step-makespan error, finish order, tokens and speedups;
    over all steps the errors against lssim.analysis.fidelity's targets; then, where the frames hold them, the
    run-to-run noise, the error after each modelling stage and the counterfactual predictions."""
    import numpy as np

    from lssim.analysis.fidelity.noise import TARGET_MEDIAN_PCT, TARGET_P90_PCT, TARGET_SPEEDUP_POINTS

    s = frames["summary"]
    cols = {"steps": "steps", "makespan_median_ape_pct": "median APE %", "makespan_p90_ape_pct": "p90 APE %",
            "finish_order_spearman": "finish order rho", "finish_time_median_ape_pct": "finish time APE %",
            "tokens_error_pct": "tokens err %", "speedup_measured": "speedup real", "speedup_predicted": "speedup sim",
            "speedup_error_points": "err points"}
    table = s[[c for c in cols if c in s]].rename(columns=cols)
    lines = ["per-step rollout makespan, simulator (profiled) vs vLLM:", table.to_string(float_format=lambda v: f"{v:.2f}")]
    all_steps = frames["steps"]["ape_pct"]
    worst_speedup = float(s["speedup_error_points"].abs().max()) if "speedup_error_points" in s else float("nan")
    lines.append(f"all steps: median APE {all_steps.median():.1f}% (target {TARGET_MEDIAN_PCT:.0f}%), "
                 f"p90 {np.percentile(all_steps, 90):.1f}% (target {TARGET_P90_PCT:.0f}%); worst policy median "
                 f"{s['makespan_median_ape_pct'].max():.1f}%, p90 {s['makespan_p90_ape_pct'].max():.1f}%; "
                 f"largest speedup error {worst_speedup:.1f} points (target {TARGET_SPEEDUP_POINTS:.0f})")
    if "noise" in frames:
        noise = frames["noise"]
        k = int(noise["repeat"].max()) + 1
        lines.append(f"run-to-run noise: one run's step against the median of its policy's {k} repeats (same seeds, same "
                     f"tokens): median {noise['ape_pct'].median():.1f}%, p90 {np.percentile(noise['ape_pct'], 90):.1f}%")
    if "stages" in frames:
        lines += ["", "error after each modelling step:",
                  frames["stages"].drop(columns="model").to_string(float_format=lambda v: f"{v:.2f}")]
    if "counterfactual" in frames:
        cf = frames["counterfactual"]
        lines += ["", "counterfactual: each policy predicted from the baseline's trace, and the lengths the Workload modelled "
                      "for responses that trace did not hold, against what vLLM generated:",
                  cf[["modelled_fraction", "length_ks", "length_wasserstein_tokens", "length_measured_mean", "length_modelled_mean",
                      "speedup_measured", "speedup_predicted_from_baseline_trace", "speedup_error_points"]]
                  .to_string(float_format=lambda v: f"{v:.2f}")]
    return "\n".join(lines)


__all__ = ["TABLE_COLUMNS", "format_summary", "format_step", "format_fidelity"]
