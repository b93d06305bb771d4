"""Each figure of lssim.analysis.plots, drawn from a small simulated run, carries the artists it promises."""

import json

import numpy as np
import pandas as pd
import pytest
from matplotlib.collections import PolyCollection
from matplotlib.figure import Figure

from lssim.analysis import plots
from lssim.analysis.replay import SimSetup, replay, summarize
from lssim.traces.synth import get_preset, synthesize

ROOT = __import__("pathlib").Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def results():
    cfg = get_preset("longtail32k").replace(steps=4, prompts_per_step=16, group_size=8, n_prompts=64, max_tokens=8192)
    return replay(synthesize(cfg), ["april"], SimSetup(n_instances=2, max_num_seqs=32), steps=3)


def _close(fig):
    import matplotlib.pyplot as plt

    plt.close(fig)


def test_step_bars_cover_every_response_that_ran_in_the_step(results):
    run = results["april"]
    steps = run.steps.set_index("step")
    for step in steps.index:
        bars = plots.step_bars(run, step)
        # every response in the step: those that ended in it plus those carried out of it
        assert len(bars) == int(steps.loc[step, "finished"] + steps.loc[step, "truncated"] + steps.loc[step, "policy_stopped"]
                                + steps.loc[step, "dropped"] + steps.loc[step, "carried_out"])
        assert (bars["outcome"] == "carried out").sum() == steps.loc[step, "carried_out"]
        assert (bars["end"] <= steps.loc[step, "rollout_seconds"] + 1e-9).all()
        # a slot never holds two bars at once
        for _, g in bars.groupby("row"):
            g = g.sort_values("start")
            assert (g["start"].to_numpy()[1:] >= g["end"].to_numpy()[:-1] - 1e-9).all()


def test_timeline_has_a_collection_per_outcome_and_the_bound(results):
    fig = plots.compare_timelines(results, 1, ["baseline", "april"])
    assert isinstance(fig, Figure) and len(fig.axes) == 2
    april_ax = fig.axes[1]
    outcomes = set(plots.step_bars(results["april"], 1)["outcome"])
    gids = {c.get_gid() for c in april_ax.collections if isinstance(c, PolyCollection)}
    assert gids == outcomes and "carried out" in gids
    bound = float(results["april"].steps.set_index("step").loc[1, "lower_bound_seconds"])
    assert any(line.get_xdata()[0] == pytest.approx(bound) for line in april_ax.lines)
    legend = {t.get_text() for t in fig.legends[0].get_texts()}
    assert "lower bound" in legend and plots.OUTCOME_LABELS["carried out"] in legend
    _close(fig)
    with pytest.raises(ValueError, match="step 99"):
        plots.step_timeline(results["april"], 99)


def test_tokens_in_flight_ends_at_the_rollout_end(results):
    fig = plots.tokens_in_flight(results, 0)
    ax_tok, ax_seq = fig.axes
    assert len(ax_tok.lines) == len(results) and len(ax_seq.lines) == len(results)
    for line, (name, res) in zip(ax_seq.lines, results.items()):
        x, y = line.get_data()
        assert x[-1] == pytest.approx(res.steps["rollout_seconds"].iloc[0])
        assert y[0] == res.steps["responses_in"].iloc[0]  # every submitted response runs or waits at t=0
    _close(fig)


def test_length_cdf_reaches_one(results):
    r = results["baseline"].responses
    fig = plots.length_cdf(r)
    ax = fig.axes[0]
    assert len(ax.lines) == r["step"].nunique() + 1
    assert all(line.get_ydata()[-1] == pytest.approx(1.0) for line in ax.lines)
    _close(fig)


def test_makespan_vs_bound_draws_a_run_and_its_bound(results):
    fig = plots.makespan_vs_bound(results)
    ax = fig.axes[0]
    assert len(ax.lines) == 2 * len(results)
    for line, bound in zip(ax.lines[::2], ax.lines[1::2]):
        assert (line.get_ydata() >= bound.get_ydata() - 1e-9).all()  # no run beats its own bound
    _close(fig)


def test_staleness_and_phases(results):
    fig = plots.staleness_histogram(results)
    heights = [p.get_height() for p in fig.axes[0].patches]
    assert len(fig.axes[0].containers) == len(results)
    for c in fig.axes[0].containers:
        assert sum(p.get_height() for p in c) == pytest.approx(1.0)
    assert heights
    _close(fig)
    fig = plots.phase_breakdown(results)
    assert len(fig.axes[0].containers) == len(plots.PHASES)
    tops = np.sum([[p.get_height() for p in c] for c in fig.axes[0].containers], axis=0)
    for top, res in zip(tops, results.values()):  # collocated: phases add up to the wall time
        assert top == pytest.approx(float(res.steps["step_seconds"].sum()), rel=1e-6)
    _close(fig)


def test_pareto_mask_is_the_non_dominated_set():
    x = np.array([0.0, 0.1, 0.2, 0.05, 0.3])
    y = np.array([1.0, 1.5, 1.4, 1.0, 2.0])
    assert plots.pareto_mask(x, y).tolist() == [True, True, False, False, True]


def test_pareto_front_figure(results):
    table = summarize(results)
    fig = plots.pareto_front(table)
    front = plots.pareto_mask(table["off_policy_token_fraction"], table["speedup"])
    assert len(fig.axes[0].lines[0].get_xdata()) == front.sum()
    _close(fig)
    with pytest.raises(ValueError, match="no column"):
        plots.pareto_front(table, x="nope")


def test_sim_vs_real_reads_the_shipped_validation():
    steps = pd.read_parquet(ROOT / "paper" / "experiments" / "validation" / "full1" / "steps.parquet")
    fig = plots.sim_vs_real(steps)
    ax = fig.axes[0]
    assert len(ax.collections) == steps["policy"].nunique() + 1  # a scatter per policy and the band
    inside = (steps["ape_pct"] <= 8.0).mean()
    assert f"{inside:.0%} within" in ax.get_title()
    _close(fig)


def test_figure_png_is_a_png(results):
    data = plots.figure_png(plots.makespan_vs_bound(results))
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
