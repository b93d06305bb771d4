"""Figures of a run, each a function returning a matplotlib Figure (Agg), for notebooks, `lssim report` and the paper.

    from lssim.analysis.plots import step_timeline, compare_timelines, length_cdf, makespan_vs_bound, tokens_in_flight
    fig = compare_timelines(results, step=3)      # baseline vs a policy, one row per slot, bar per response
    fig.savefig("step3.png")

Every function reads the frames a run returns (lssim.loop.controller.RunResult: `.steps`, `.responses`, `.meta`) or
the tables built from them (lssim.analysis.replay.summarize, lssim.analysis.sweep, lssim.analysis.fidelity); none runs a simulation.
Figures are not closed here: a notebook shows them, `figure_png` renders and closes one.
"""

from __future__ import annotations

import io
import json

import matplotlib

matplotlib.use("Agg")  # before pyplot: no display here, the same figures in notebooks and reports
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402
from lssim.analysis.ranking import pareto_mask  # noqa: E402, F401  (lssim.analysis.plots.pareto_mask, as before)

# How a bar on a timeline is coloured: how the response ended in the step (records.RESPONSE_COLUMNS finish_reason),
# or that it ran in the step and was carried out unfinished (partial rollouts), or that it resumed a carried one.
OUTCOME_COLORS = {"stop": "#4c72b0", "length": "#dd8452", "policy_stop": "#c44e52", "abort": "#8c8c8c",
                  "resumed": "#55a868", "carried out": "#b5d6a7"}
OUTCOME_LABELS = {"stop": "finished (EOS)", "length": "truncated at budget", "policy_stop": "stopped by policy",
                  "abort": "aborted / dropped", "resumed": "resumed (carried in)", "carried out": "carried out unfinished"}
PHASES = ("rollout", "logprob", "reference", "update", "sync", "switch", "wait")


def figure_png(fig: Figure, dpi: int = 110) -> bytes:
    """The figure as PNG bytes; closes it (a report makes dozens)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    plt.close(fig)
    return buf.getvalue()


# --------------------------------------------------------------------------------------------------------------
# One step's timeline
# --------------------------------------------------------------------------------------------------------------


def step_bars(result, step: int) -> pd.DataFrame:
    """The bars of one step: each response that ended in it (start = its first token, i.e. admission, or its
    submission where no token time was recorded; end = finish; seconds from the step's start) and each one carried
    out of it unfinished. A carried-out response's rows record only the step it ended
    in, so its bar in this step is drawn from the step's start to the rollout's end (`approximate`=True)."""
    r, s = result.responses, result.steps.set_index("step")
    if step not in s.index:
        raise ValueError(f"step {step} not in the run (steps {int(s.index.min())}..{int(s.index.max())})")
    rollout = float(s.loc[step, "rollout_seconds"])
    ended = r[r["end_step"] == step]
    first = ended["first_token_time"].to_numpy(float)
    start = np.where(np.isfinite(first), first, ended["submit_time"].to_numpy(float))
    bars = pd.DataFrame({"start": start, "end": ended["finish_time"].to_numpy(float),
                         "instance": ended["instance"].to_numpy(int), "approximate": False,
                         "outcome": np.where(ended["step"].to_numpy() < step, "resumed", ended["finish_reason"].to_numpy())})
    out = r[(r["step"] <= step) & (r["end_step"] > step)]
    carried = pd.DataFrame({"start": 0.0, "end": rollout, "instance": out["instance"].to_numpy(int), "approximate": True,
                            "outcome": "carried out"}, index=range(len(out)))
    bars = pd.concat([bars, carried], ignore_index=True)
    bars["row"] = _rows(bars)
    return bars


def _rows(bars: pd.DataFrame) -> np.ndarray:
    """A row per bar: the first slot free when it started (interval colouring by start time: the rows are the
    concurrent sequences), instance by instance where the run recorded them (instance 0's slots, then 1's, ...)."""
    instance = bars["instance"].to_numpy() if len(bars) and (bars["instance"] >= 0).all() else np.zeros(len(bars), int)
    rows, offset = np.zeros(len(bars), dtype=int), 0
    for inst in np.unique(instance):
        on = np.flatnonzero(instance == inst)
        rows[on] = _slots(bars["start"].to_numpy()[on], bars["end"].to_numpy()[on]) + offset
        offset = int(rows[on].max()) + 1
    return rows


def _slots(start: np.ndarray, end: np.ndarray) -> np.ndarray:
    order = np.argsort(start, kind="stable")
    free_at: list[float] = []
    slots = np.zeros(len(start), dtype=int)
    for i in order:
        slot = next((k for k, t in enumerate(free_at) if t <= start[i] + 1e-12), None)
        if slot is None:
            slot = len(free_at)
            free_at.append(end[i])
        else:
            free_at[slot] = end[i]
        slots[i] = slot
    return slots


def _draw_timeline(ax, result, step: int, title: str) -> None:
    bars = step_bars(result, step)
    row = result.steps.set_index("step").loc[step]
    per_instance = len(bars) and (bars["instance"] >= 0).all()
    for outcome, group in bars.groupby("outcome", sort=False):
        _bars(ax, group, OUTCOME_COLORS.get(outcome, "black"), hatched=bool(group["approximate"].all()))
    ax.axvline(float(row["lower_bound_seconds"]), color="black", ls="--", lw=1.2, label="lower bound")
    ax.axvline(float(row["rollout_seconds"]), color="black", ls=":", lw=1, label="rollout end")
    ax.set(xlabel="seconds from the step's start", ylabel="slot, instance by instance" if per_instance else "slot (concurrent sequence)",
           title=title)



def _bars(ax, group: pd.DataFrame, color: str, hatched: bool) -> None:
    """One PolyCollection per outcome: a rectangle per response at its row."""
    from matplotlib.collections import PolyCollection

    x0, x1, y = group["start"].to_numpy(), group["end"].to_numpy(), group["row"].to_numpy()
    verts = [[(a, r - 0.4), (a, r + 0.4), (b, r + 0.4), (b, r - 0.4)] for a, b, r in zip(x0, x1, y)]
    coll = PolyCollection(verts, facecolors=color, edgecolors=color if not hatched else "#6a8f5e", linewidths=0.2,
                          hatch="//" if hatched else None, alpha=0.9)
    coll.set_gid(str(group["outcome"].iat[0]))
    ax.add_collection(coll)
    ax.autoscale_view()


def _legend(fig: Figure, outcomes: set[str]) -> None:
    handles = [Patch(color=OUTCOME_COLORS[o], label=OUTCOME_LABELS[o]) for o in OUTCOME_COLORS if o in outcomes]
    handles += [plt.Line2D([], [], color="black", ls="--", label="lower bound"),
                plt.Line2D([], [], color="black", ls=":", label="rollout end")]
    fig.legend(handles=handles, loc="lower center", ncol=min(4, len(handles)), fontsize=8, frameon=False)


def step_timeline(result, step: int, title: str | None = None) -> Figure:
    """One step of one run: a bar per response from submission to finish, coloured by how it ended, on its
    instance's row (or a slot's, where the run did not record instances); the step's lower bound dashed."""
    return compare_timelines({title or result.meta.get("policy", "run"): result}, step)


def compare_timelines(results: dict, step: int, policies: list[str] | None = None) -> Figure:
    """The same step under several policies side by side (default: every run given, baseline first), on one
    time axis so the tails compare at a glance."""
    names = policies or list(results)
    missing = [n for n in names if n not in results]
    if missing:
        raise ValueError(f"no run named {', '.join(missing)}; have {', '.join(results)}")
    fig, axes = plt.subplots(1, len(names), figsize=(6 * len(names), 4.6), sharex=True, squeeze=False)
    outcomes: set[str] = set()
    right = 0.0
    for ax, name in zip(axes[0], names):
        _draw_timeline(ax, results[name], step, f"{name}: step {step}")
        outcomes |= set(step_bars(results[name], step)["outcome"])
        row = results[name].steps.set_index("step").loc[step]
        right = max(right, float(row["rollout_seconds"]), float(row["lower_bound_seconds"]))
    axes[0][0].set_xlim(0, right * 1.03)  # shared: the longest run sets the axis
    _legend(fig, outcomes)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    return fig


def tokens_in_flight(results: dict, step: int, points: int = 400) -> Figure:
    """KV tokens held (prompt plus generated) and sequences running over one step, per run. A response's tokens
    are taken to grow linearly from its first token to its finish (the records keep no per-token times)."""
    fig, (ax_tok, ax_seq) = plt.subplots(2, 1, figsize=(8, 5.2), sharex=True)
    for name, res in results.items():
        bars = step_bars(res, step)
        r = res.responses
        ended = r[r["end_step"] == step]
        t_end = float(res.steps.set_index("step").loc[step, "rollout_seconds"])
        t = np.linspace(0, t_end, points)
        start, end = ended["submit_time"].to_numpy(float), ended["finish_time"].to_numpy(float)
        first = np.nan_to_num(ended["first_token_time"].to_numpy(float), nan=0.0)
        first = np.where(first > 0, first, start)
        gen0 = ended["tokens_before_resume"].to_numpy(float)
        gen = ended["response_len"].to_numpy(float) - gen0
        prog = np.clip((t[:, None] - first[None]) / np.maximum(end - first, 1e-9)[None], 0, 1)
        alive = (t[:, None] >= start[None]) & (t[:, None] < end[None])
        tokens = ((ended["prompt_len"].to_numpy(float) + gen0)[None] + gen[None] * prog) * alive
        carried = bars[bars["outcome"] == "carried out"]
        running = alive.sum(axis=1) + len(carried)
        (line,) = ax_tok.plot(t, tokens.sum(axis=1), label=name)
        ax_seq.plot(t, running, color=line.get_color(), label=name)
    ax_tok.set(ylabel="tokens in flight (KV)", title=f"step {step}: tokens and sequences in flight")
    ax_seq.set(ylabel="sequences running", xlabel="seconds from the step's start")
    ax_tok.legend(fontsize=8)
    fig.tight_layout()
    return fig


# --------------------------------------------------------------------------------------------------------------
# Across steps
# --------------------------------------------------------------------------------------------------------------


def length_cdf(responses: pd.DataFrame, steps: list[int] | None = None, column: str = "response_len",
               step_column: str = "step", title: str = "response-length CDF") -> Figure:
    """The empirical CDF of response lengths: one thin line per step (default: up to 12 steps spread over the
    run) and the whole run in black. Works on a trace as well as on a run's responses."""
    fig, ax = plt.subplots(figsize=(6.5, 4))
    all_steps = np.sort(responses[step_column].unique())
    chosen = steps if steps is not None else list(all_steps[np.linspace(0, len(all_steps) - 1, min(12, len(all_steps))).astype(int)])
    cmap = plt.get_cmap("viridis")
    for i, st in enumerate(chosen):
        x = np.sort(responses.loc[responses[step_column] == st, column].to_numpy(float))
        ax.plot(x, np.arange(1, len(x) + 1) / len(x), lw=0.9, alpha=0.7, color=cmap(i / max(1, len(chosen) - 1)),
                label=f"step {st}" if len(chosen) <= 6 else None)
    x = np.sort(responses[column].to_numpy(float))
    ax.plot(x, np.arange(1, len(x) + 1) / len(x), color="black", lw=2, label="all steps")
    ax.set(xlabel=f"{column} (tokens)", ylabel="fraction of responses", title=title)
    if x.size and x.max() > 20 * max(1.0, float(np.median(x))):
        ax.set_xscale("log")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def makespan_vs_bound(results: dict) -> Figure:
    """Per-step rollout makespan of each run against its own per-step lower bound (dashed, same colour)."""
    fig, ax = plt.subplots(figsize=(7.5, 4))
    for name, res in results.items():
        s = res.steps
        (line,) = ax.plot(s["step"], s["rollout_seconds"], marker=".", label=name)
        ax.plot(s["step"], s["lower_bound_seconds"], ls="--", lw=0.9, color=line.get_color(), label=f"{name} bound")
    ax.set(xlabel="step", ylabel="rollout seconds", title="per-step makespan (solid) vs lower bound (dashed)")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    return fig


def staleness_histogram(results: dict) -> Figure:
    """Tokens trained by how many weight versions behind they were generated (steps' staleness_histogram), per run."""
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    hists = {name: _histogram(res.steps) for name, res in results.items()}
    lags = sorted({lag for h in hists.values() for lag in h}) or [0]
    width = 0.8 / max(1, len(hists))
    for i, (name, h) in enumerate(hists.items()):
        total = max(1, sum(h.values()))
        ax.bar(np.arange(len(lags)) + i * width, [h.get(lag, 0) / total for lag in lags], width, label=name)
    ax.set_xticks(np.arange(len(lags)) + width * (len(hists) - 1) / 2, [str(lag) for lag in lags])
    ax.set(xlabel="versions behind the weights that trained them", ylabel="share of trained tokens",
           title="staleness of trained tokens")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def _histogram(steps: pd.DataFrame) -> dict[int, int]:
    out: dict[int, int] = {}
    for text in steps["staleness_histogram"]:
        for lag, n in json.loads(text).items():
            out[int(lag)] = out.get(int(lag), 0) + int(n)
    return out


def phase_breakdown(results: dict) -> Figure:
    """Seconds per phase summed over the run's steps, one stacked bar per run. In the pipelined modes the
    rollout and the training overlap, so a bar's height is work, not wall time (the run's wall time is marked)."""
    fig, ax = plt.subplots(figsize=(7.5, 4))
    names = list(results)
    bottom = np.zeros(len(names))
    colors = plt.get_cmap("tab10").colors
    for k, phase in enumerate(PHASES):
        vals = np.array([float(results[n].steps[f"{phase}_seconds"].sum()) for n in names])
        ax.bar(names, vals, bottom=bottom, label=phase, color=colors[k])
        bottom += vals
    wall = [float(results[n].steps["step_seconds"].sum()) for n in names]
    ax.scatter(names, wall, marker="_", s=900, color="black", zorder=3, label="wall time")
    ax.set(ylabel="seconds (summed over steps)", title="where the time goes")
    ax.tick_params(axis="x", rotation=20)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    return fig


# --------------------------------------------------------------------------------------------------------------
# Tables: sweeps and fidelity
# --------------------------------------------------------------------------------------------------------------


def pareto_front(table: pd.DataFrame, x: str = "off_policy_token_fraction", y: str = "speedup", label: int = 8) -> Figure:
    """A sweep's runs (rows of lssim.analysis.replay.summarize / lssim.analysis.sweep, indexed by policy): speedup against the price
    it costs (off-policy or stale token share), the non-dominated ones joined; up to `label` of them named."""
    for col in (x, y):
        if col not in table.columns:
            raise ValueError(f"pareto_front: no column {col!r}; have {', '.join(table.columns)}")
    xs, ys = table[x].to_numpy(float), table[y].to_numpy(float)
    front = pareto_mask(xs, ys)
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    ax.scatter(xs[~front], ys[~front], s=18, color="#999999", label="dominated")
    order = np.argsort(xs[front])
    ax.plot(xs[front][order], ys[front][order], marker="o", color="#c44e52", label="Pareto front")
    for name, a, b in list(zip(table.index[front], xs[front], ys[front]))[:label]:
        ax.annotate(str(name), (a, b), fontsize=7, xytext=(3, 3), textcoords="offset points")
    ax.axhline(1.0, color="black", lw=0.7)
    ax.set(xlabel=x.replace("_", " "), ylabel=y.replace("_", " "), title=f"{y} vs {x}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def sim_vs_real(steps: pd.DataFrame, band_pct: float | None = None) -> Figure:
    """Predicted against measured rollout seconds per step (lssim.analysis.fidelity frames, e.g.
    paper/experiments/validation/steps.parquet), one marker per policy, the diagonal and the ±band (default: the
    p90 target of `lssim validate`, lssim.analysis.fidelity.TARGET_P90_PCT)."""
    from lssim.analysis.fidelity.noise import TARGET_P90_PCT

    band = TARGET_P90_PCT if band_pct is None else band_pct
    fig, ax = plt.subplots(figsize=(5.8, 5.2))
    colors, markers = plt.get_cmap("tab20").colors, "osD^v<>p"
    for i, (name, s) in enumerate(steps.groupby("policy", sort=False)):
        ax.scatter(s["measured_seconds"], s["predicted_seconds"], s=18, label=name, color=colors[i % 20], marker=markers[i % 8])
    both = steps[["measured_seconds", "predicted_seconds"]].to_numpy(float)
    lo, hi = float(np.nanmin(both)) * 0.9, float(np.nanmax(both)) * 1.1
    ax.plot([lo, hi], [lo, hi], color="black", lw=0.8)
    ax.fill_between([lo, hi], [lo * (1 - band / 100), hi * (1 - band / 100)], [lo * (1 + band / 100), hi * (1 + band / 100)],
                    color="grey", alpha=0.2, label=f"±{band:g}%")
    inside = float((steps["ape_pct"] <= band).mean()) if "ape_pct" in steps else float("nan")
    ax.set(xlabel="measured rollout seconds (real engine)", ylabel="predicted rollout seconds (simulator)",
           xlim=(lo, hi), ylim=(lo, hi), title=f"sim vs real per step: {inside:.0%} within ±{band:g}%")
    ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    return fig


__all__ = ["step_timeline", "compare_timelines", "step_bars", "tokens_in_flight", "length_cdf", "makespan_vs_bound",
           "staleness_histogram", "phase_breakdown", "pareto_front", "pareto_mask", "sim_vs_real", "figure_png"]
