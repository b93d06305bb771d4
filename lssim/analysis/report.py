"""`lssim report`: one self-contained HTML page on what a policy does to a trace, with its figures and tables.

    from lssim.analysis.report import build_report, write_report
    report = build_report(load_trace("traces/longtail32k.parquet"), "april", SimSetup(), trace_name="longtail32k")
    write_report(report, "out/")    # out/report.html, out/figures/*.png, out/tables/*.csv

The page says what the trace is (lssim.traces.summary), what the policy did against baseline and oracle
(lssim.analysis.replay.summarize), how far each step is from its lower bound, one step's timeline, what the simulator
modelled rather than replayed, and the execution mode's end-to-end figures (lssim.analysis.replay.end_to_end). Figures
are embedded as base64 PNG, so the page needs no other file; the same figures and tables are written beside it.
The folder is written under a temporary name and renamed into place: an error leaves nothing half-written.
"""

from __future__ import annotations

import base64
import html
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd

from lssim.analysis import plots
from lssim.results import atomic_directory

PAGE = "report.html"
SUMMARY_COLUMNS = ["speedup", "rollout_speedup", "rollout_seconds", "step_seconds", "lower_bound_efficiency",
                   "long_tail_ratio", "truncated_fraction", "policy_stopped_fraction", "off_policy_token_fraction",
                   "stale_token_fraction", "effective_group_fraction", "exact_fraction", "mean_reward", "groups_trained", "steps"]
STEP_COLUMNS = ["step", "rollout_seconds", "lower_bound_seconds", "lower_bound_efficiency", "tokens", "responses_in",
                "carried_in", "finished", "truncated", "policy_stopped", "dropped", "carried_out", "groups_trained",
                "off_policy_token_fraction", "exact_fraction", "step_seconds", "max_staleness"]
END_TO_END_COLUMNS = ["mode", "step_seconds", "step_seconds_per_group", "train_seconds", "logprob_seconds", "update_seconds",
                      "sync_seconds", "switch_seconds", "wait_seconds", "devices", "idle_device_seconds", "max_staleness",
                      "stale_token_fraction", "dropped_stale", "trained_tokens_per_second"]


@dataclass
class Section:
    """A heading, paragraphs, figures (name -> PNG bytes, with a caption) and tables (name -> frame)."""

    heading: str
    paragraphs: list[str] = field(default_factory=list)
    figures: dict[str, tuple[bytes, str]] = field(default_factory=dict)
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)


@dataclass
class Report:
    title: str
    sections: list[Section]

    def figures(self) -> dict[str, tuple[bytes, str]]:
        return {k: v for s in self.sections for k, v in s.figures.items()}

    def tables(self) -> dict[str, pd.DataFrame]:
        return {k: v for s in self.sections for k, v in s.tables.items()}


def build_report(trace: pd.DataFrame, policy: str, setup=None, *, trace_name: str = "trace", steps: int | None = None,
                 seed: int = 0, timeline_step: int | None = None, say: Callable[[str], None] = lambda _: None,
                 progress: bool = False) -> Report:
    """Replay `trace` under `policy` (beside baseline and oracle) on `setup` (lssim.analysis.replay.SimSetup) and gather
    the page. `say` is told each stage (the CLI prints them on a terminal); `progress` shows the runs' bars."""
    from lssim.analysis.replay import SimSetup, replay, summarize
    from lssim.traces.summary import trace_info

    setup = setup or SimSetup()
    say(f"summarizing {trace_name}")
    info = trace_info(trace, source=trace_name)
    say(f"replaying baseline, {policy}, oracle")
    results = replay(trace, [policy], setup, steps=steps, seed=seed, progress=progress)
    names = list(results)  # baseline, the policy (its name as made by make_policy), oracle
    name = names[1] if len(names) == 3 else "baseline"
    summary = summarize(results, trace, steps)
    step = _timeline_step(results, name) if timeline_step is None else timeline_step
    say("drawing figures")
    sections = [_trace_section(trace, info, trace_name), _policy_section(summary, results, name, setup),
                _bound_section(results, name), _step_section(results, name, step), _modelled_section(results),
                _mode_section(summary, results, setup)]
    return Report(title=f"lssim report: {name} on {trace_name}", sections=sections)


def _timeline_step(results: dict, name: str) -> int:
    """The step to draw: the one where baseline is furthest from its bound (the worst tail), among the steps both
    runs have."""
    base = results["baseline"].steps.set_index("step")
    common = base.index.intersection(results[name].steps["step"])
    gap = (base.loc[common, "rollout_seconds"] - base.loc[common, "lower_bound_seconds"]).fillna(0)
    return int(gap.idxmax())


def _kv_table(info: dict) -> pd.DataFrame:
    rows = []
    for k, v in info.items():
        if isinstance(v, dict):
            rows += [(f"{k}.{kk}", vv) for kk, vv in v.items()]
        else:
            rows.append((k, v))
    return pd.DataFrame(rows, columns=["statistic", "value"])


def _trace_section(trace: pd.DataFrame, info: dict, trace_name: str) -> Section:
    rl = info["response_len"]
    text = (f"{info['rows']:,} responses over {info['steps']} steps ({info['prompts']:,} prompts, {info['groups']:,} groups). "
            f"Response length: median {rl['p50']:,.0f}, p99 {rl['p99']:,.0f}, max {rl['max']:,} tokens; per step the "
            f"longest is {info['step_max_over_median'] or float('nan'):.1f}x the median. "
            f"{100 * info['truncated_fraction']:.1f}% were truncated at their budget.")
    fig = plots.length_cdf(trace, title=f"{trace_name}: response lengths as recorded")
    return Section("What the trace is", [text], {"trace_length_cdf": (plots.figure_png(fig), "Response-length CDF per step "
                   "(thin) and over the whole trace (black).")}, {"trace": _kv_table(info)})


def _policy_section(summary: pd.DataFrame, results: dict, name: str, setup) -> Section:
    row = summary.loc[name]
    text = [f"Simulated on {setup.n_instances} x {setup.model} on {setup.hardware} (tp={setup.tp}, mode {row['mode']}). "
            f"{name} trains the same number of groups as baseline in {row['step_seconds']:,.0f} s against "
            f"{summary.loc['baseline', 'step_seconds']:,.0f} s: {row['speedup']:.3f}x end to end, "
            f"{row['rollout_speedup']:.3f}x in rollout time per trained group (oracle: {summary.loc['oracle', 'rollout_speedup']:.3f}x).",
            f"What it costs: {row['off_policy_token_fraction']:.1%} of trained tokens off-policy, {row['truncated_fraction']:.1%} "
            f"of responses truncated, {row['policy_stopped_fraction']:.1%} stopped by the policy, "
            f"{row['effective_group_fraction']:.1%} of trained groups with a learning signal."]
    table = summary[[c for c in SUMMARY_COLUMNS if c in summary.columns]]
    tables = {"setup": setup_table(setup), "summary": table.reset_index()}
    tables.update({f"steps_{_safe(n)}": res.steps[[c for c in STEP_COLUMNS if c in res.steps]] for n, res in results.items() if n != "oracle"})
    return Section("What the policy did", text, {}, tables)


def _bound_section(results: dict, name: str) -> Section:
    eff = {n: float(r.steps["lower_bound_seconds"].sum() / r.steps["rollout_seconds"].sum()) for n, r in results.items()}
    text = ("The lower bound of a step is the longest response's solo decode time or the step's work over the cluster's "
            "capacity, whichever is larger (lssim.sim.bounds); no schedule of the same responses finishes sooner. "
            + "; ".join(f"{n} reaches {e:.1%} of it" for n, e in eff.items()) + " over the run.")
    fig = plots.makespan_vs_bound({n: results[n] for n in ("baseline", name)})
    return Section("How far from the bound", [text], {"makespan_vs_bound": (plots.figure_png(fig),
                   "Per-step rollout makespan (solid) and its lower bound (dashed).")})


def _step_section(results: dict, name: str, step: int) -> Section:
    pair = ["baseline", name] if name != "baseline" else ["baseline"]
    text = (f"Step {step} (the step where baseline is furthest from its bound), response by response. A row is an engine "
            "instance where the run recorded one, else a slot: the responses that ran one after another in it. Hatched bars "
            "were carried out unfinished (partial rollout): the records keep only the step they ended in, so they are drawn "
            "over the whole rollout.")
    figs = {"timeline": (plots.figure_png(plots.compare_timelines(results, step, pair)), f"Step {step}: a bar per response "
                         "from submission to finish, coloured by how it ended; the dashed line is the step's lower bound."),
            "tokens_in_flight": (plots.figure_png(plots.tokens_in_flight({n: results[n] for n in pair}, step)),
                                 f"Step {step}: KV tokens and sequences in flight (tokens grow linearly between first "
                                 "token and finish: the records keep no per-token times).")}
    return Section(f"One step: {step}", [text], figs)


def _modelled_section(results: dict) -> Section:
    rows = []
    for n, res in results.items():
        sources = res.meta.get("sources", {})
        total = max(1, sum(sources.values()))
        rows.append({"policy": n, **{f"{k}_responses": v for k, v in sources.items()},
                     **{f"{k}_share": v / total for k, v in sources.items()},
                     "exact_fraction": float(res.responses["exact"].mean()), "cost_model": _described(res.meta, "cost", "name")})
    table = pd.DataFrame(rows).fillna(0)
    text = ("Under baseline the trace replays as recorded. Where a policy asks for something the trace never saw (another "
            "budget, a resumed response, another prompt), the Workload answers by truncating a longer recorded response or "
            "resampling the prompt's own history (lssim.traces.workload). The share answered exactly is below; the rest is "
            "modelled. Every time is modelled by the cost model (roofline or profiled), never replayed.")
    return Section("What was modelled rather than replayed", [text], {}, {"sources": table})


def _mode_section(summary: pd.DataFrame, results: dict, setup) -> Section:
    cfg = setup.mode_config()
    table = summary[[c for c in END_TO_END_COLUMNS if c in summary.columns]].reset_index()
    text = (f"Execution mode {cfg.label()}: {cfg.rollout_devices} rollout devices, {cfg.train_devices} training devices "
            f"(lssim.loop.modes). The training phases are priced by the {_described(results['baseline'].meta, 'train', 'kind')} "
            "train cost model (lssim.sim.training).")
    figs = {"phase_breakdown": (plots.figure_png(plots.phase_breakdown(results)), "Seconds per phase summed over the "
                                "steps, with the run's wall time (pipelined modes overlap phases)."),
            "staleness": (plots.figure_png(plots.staleness_histogram(results)), "Trained tokens by how many weight "
                          "versions behind they were generated.")}
    return Section("End to end under the execution mode", [text], figs, {"end_to_end": table})


def _described(meta: dict, key: str, field_name: str) -> str:
    """A field of a model's describe() dict in a run's meta, or '?' where the run did not say."""
    value = meta.get(key)
    return str(value.get(field_name, "?")) if isinstance(value, dict) else str(value or "?")


def _safe(name: str) -> str:
    from lssim.results import policy_dirname

    return policy_dirname(name)


# --------------------------------------------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------------------------------------------

CSS = """body{font-family:system-ui,sans-serif;max-width:1250px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;font-size:12px;margin:1em 0}td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}
th{background:#f3f3f3}figure{margin:1em 0}img{max-width:100%}figcaption{font-size:13px;color:#555}
.tablewrap{overflow-x:auto}"""


def render_html(report: Report) -> str:
    """The page: every figure inline as a base64 PNG, every table as HTML; no script, no external file."""
    parts = [f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>{html.escape(report.title)}</title>",
             f"<style>{CSS}</style></head><body><h1>{html.escape(report.title)}</h1>"]
    for s in report.sections:
        parts.append(f"<section><h2>{html.escape(s.heading)}</h2>")
        parts += [f"<p>{html.escape(p)}</p>" for p in s.paragraphs]
        for name, (png, caption) in s.figures.items():
            data = base64.b64encode(png).decode("ascii")
            parts.append(f"<figure id='fig-{name}'><img alt='{html.escape(name)}' src='data:image/png;base64,{data}'>"
                         f"<figcaption>{html.escape(caption)}</figcaption></figure>")
        for name, table in s.tables.items():
            parts.append(f"<h3>{html.escape(name)}</h3><div class='tablewrap' id='table-{name}'>"
                         + table.to_html(index=False, float_format=_fmt, na_rep="", classes="lssim", border=0) + "</div>")
        parts.append("</section>")
    parts.append("</body></html>")
    return "\n".join(parts)


def _fmt(v: float) -> str:
    return f"{v:,.0f}" if np.isfinite(v) and abs(v) >= 1000 else f"{v:.4g}"


def write_report(report: Report, out_dir) -> Path:
    """`out_dir`/report.html, figures/NAME.png and tables/NAME.csv, written under a temporary name beside it and
    renamed into place. An existing folder is replaced only if it holds a report (or nothing)."""
    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and not (out / PAGE).is_file())):
        raise ValueError(f"{out}: exists and is not an lssim report folder; not overwriting it")
    with atomic_directory(out) as tmp:
        (tmp / "figures").mkdir()
        (tmp / "tables").mkdir()
        for name, (png, _) in report.figures().items():
            (tmp / "figures" / f"{name}.png").write_bytes(png)
        for name, table in report.tables().items():
            table.to_csv(tmp / "tables" / f"{name}.csv", index=False)
        (tmp / PAGE).write_text(render_html(report), encoding="utf-8")
    return out


def setup_table(setup) -> pd.DataFrame:
    """The simulated cluster as a two-column table."""
    return pd.DataFrame([(k, str(v)) for k, v in asdict(setup).items()], columns=["setting", "value"])


__all__ = ["Report", "Section", "build_report", "render_html", "write_report", "setup_table", "PAGE"]
