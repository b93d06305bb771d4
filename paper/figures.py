"""The paper's figures: lssim.analysis.plots functions over the build's fresh runs and the committed measurements, plus one
figure of its own (the GPU cost model's held-out points, which lssim.analysis.plots has no function for)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from lssim.analysis import plots  # noqa: E402

DPI = 100


def gpu_heldout(heldout) -> "plt.Figure":
    """Predicted against measured iteration time of every held-out GPU point: the kernel model and the roofline."""
    fig, ax = plt.subplots(figsize=(5.8, 5.0))
    marks = {"decode": "o", "prefill": "s", "decode layers": "^", "prefill layers": "v"}
    for (source, kind), g in heldout.groupby(["source", "kind"], sort=False):
        ax.scatter(g["measured_s"] * 1e3, g["predicted_s"] * 1e3, s=22, marker=marks.get(kind, "o"),
                   label=f"kernel model: {kind} ({'own H100' if source.startswith('lssim') else 'Vidur H100'})")
        if g["roofline_s"].notna().any():
            ax.scatter(g["measured_s"] * 1e3, g["roofline_s"] * 1e3, s=22, marker=marks.get(kind, "o"),
                       facecolors="none", edgecolors="grey", label=f"roofline: {kind} (own H100)")
    both = np.concatenate([heldout["measured_s"], heldout["predicted_s"]]) * 1e3
    lo, hi = float(both.min()) * 0.8, float(both.max()) * 1.25
    ax.plot([lo, hi], [lo, hi], color="black", lw=0.8)
    ax.fill_between([lo, hi], [lo * 0.9, hi * 0.9], [lo * 1.1, hi * 1.1], color="grey", alpha=0.15, label="±10%")
    ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi), xlabel="measured ms (H100)",
           ylabel="predicted ms", title="GPU cost model on held-out measurements")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def make_figures(sim_runs: dict, measured: dict, timeline_step: int, trace_name: str) -> dict[str, tuple[bytes, str]]:
    """name -> (PNG bytes, caption). Every figure is drawn from this build's runs or the committed measurements."""
    fig_runs = sim_runs["figure"]
    policy = [n for n in fig_runs if n not in ("baseline", "oracle")][0]
    table = sim_runs[f"table_{trace_name}"]
    figs = {
        "lengths": (plots.length_cdf(sim_runs["trace"], title=f"{trace_name}: response lengths as recorded"),
                    f"Response-length CDF of the {trace_name} trace, per step (thin) and over all steps (black)."),
        "timeline": (plots.compare_timelines(fig_runs, timeline_step, ["baseline", policy]),
                     f"Step {timeline_step} of {trace_name} under baseline and {policy}: a bar per response, "
                     "coloured by how it ended; dashed: the step's lower bound."),
        "bound": (plots.makespan_vs_bound(fig_runs), "Per-step rollout makespan (solid) against each run's own lower "
                                                     f"bound (dashed), {trace_name}."),
        "pareto": (plots.pareto_front(table, x="off_policy_token_fraction", y="rollout_speedup"),
                   "Rollout speedup against the share of trained tokens written by older weights, every policy and "
                   f"composition on {trace_name}."),
        "phases": (plots.phase_breakdown(sim_runs["modes"]), "Baseline under each execution mode: seconds per phase "
                                                            "summed over the steps, and the wall time."),
        "staleness": (plots.staleness_histogram(sim_runs["modes"]), "Trained tokens by weight versions behind, "
                                                                   "baseline under each execution mode."),
        "sim_vs_real": (plots.sim_vs_real(measured["fidelity_steps"]), "Predicted against measured rollout seconds "
                        "per step, vLLM on this CPU, every world (median of the repeats; committed validation run)."),
        "sim_vs_real_level": (plots.sim_vs_real(measured["fidelity_anchored"]), "The same steps with each prediction "
                              "scaled by its world's speed level from the baseline's runs (baselines left out)."),
        "gpu_cost": (gpu_heldout(measured["gpu_heldout"]), "The kernel-level GPU cost model and the roofline against "
                     "held-out H100 measurements (own torch decoder profiles and Vidur's Llama-2-7B layer kernels)."),
    }
    return {name: (plots.figure_png(fig, dpi=DPI), caption) for name, (fig, caption) in figs.items()}


__all__ = ["make_figures", "gpu_heldout"]
