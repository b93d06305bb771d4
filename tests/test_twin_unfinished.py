"""The simulated twin of a run that ends with responses still carried (segment, april): the trace has no row for
them, so the twin must be told (RecordedRun.unfinished, lssim.analysis.fidelity.twin_trace) or it fills them in from the
members that ended, finishes groups the run left open and predicts a speedup the run never had (issue 16:
segment's +56.7 points in the tail world). A run recorded from the simulator is the reference: its twin must
reproduce its books exactly."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lssim.loop.controller import RunConfig
from lssim.analysis.fidelity.compare import compare
from lssim.analysis.fidelity.run import UNFINISHED_AT_END, UNFINISHED_COLUMNS, RecordedRun, replay_run, twin_trace
from lssim.analysis.replay import simulate
from lssim.traces.trace import load_trace
from lssim.traces.workload import Workload
from policies.segment import Segment

from fidelity_helpers import REAL_TRACE, profile, twin_setup  # noqa: F401 (profile: the validation tests' profile fixture)

SPEC = "segment(window=32)"


class _Watched(Segment):
    """segment(window=32) that keeps every request it saw: those not done when the run ends are its unfinished."""

    def __init__(self):
        super().__init__(window=32)
        self.seen = {}

    def on_progress(self, request, state):
        self.seen[request.rid] = request
        return super().on_progress(request, state)


def _recorded(profile, seed: int, steps: int = 4) -> RecordedRun:
    """A 'real' run that is a simulation of segment, with the responses it left unfinished, as `lssim real` records."""
    from real_backend.recorder import to_trace

    source = load_trace(REAL_TRACE)
    config = RunConfig(steps=steps, groups_per_step=8, group_size=4, max_tokens=256, seed=seed)
    policy = _Watched()
    result = simulate(Workload(source, seed=seed), policy, twin_setup(profile), config=config, prompts=Workload(source, seed=seed))
    left = [r for r in policy.seen.values() if not r.done]
    unfinished = pd.DataFrame([(r.step, r.prompt_id, r.sample_idx, r.group_id, r.prompt_len, r.generated,
                                r.tokens_before_resume, r.max_tokens) for r in left], columns=UNFINISHED_COLUMNS)
    return RecordedRun(name=SPEC, trace=to_trace(result.responses, result.steps), steps=result.steps,
                       responses=result.responses, config=config, unfinished=unfinished)


def _replay(run, profile, seed):
    return replay_run(run, twin_setup(profile), prompts=Workload(load_trace(REAL_TRACE), seed=seed))


@settings(max_examples=6, deadline=None)
@given(seed=st.integers(0, 2**16))
def test_a_run_ending_with_carried_responses_is_replayed_with_the_same_books(profile, seed):
    run = _recorded(profile, seed)
    assert len(run.unfinished) == run.steps["carried_out"].iloc[-1]
    sim = _replay(run, profile, seed)
    for col in ("groups_trained", "carried_out", "finished", "tokens"):
        assert sim.steps[col].tolist() == run.steps[col].tolist(), col
    steps, _ = compare(run, sim)
    assert np.allclose(steps["predicted_seconds"], steps["measured_seconds"], rtol=1e-9)


def test_without_its_unfinished_responses_the_twin_finishes_groups_the_run_left_open(profile):
    # The bug of issue 16, kept as the contrast: the same run, its unfinished responses unknown to the twin.
    run = _recorded(profile, seed=0)
    assert run.steps["carried_out"].iloc[-1] > 0  # the run ends with responses still carried
    blind = RecordedRun(name=run.name, trace=run.trace, steps=run.steps, responses=run.responses, config=run.config)
    sim = _replay(blind, profile, 0)
    assert sim.steps["groups_trained"].sum() > run.steps["groups_trained"].sum()


def test_twin_trace_censors_each_unfinished_response_where_the_run_left_it(profile):
    run = _recorded(profile, seed=1)
    trace = twin_trace(run)
    added = trace[trace["stop_reason"] == UNFINISHED_AT_END]
    assert len(added) == len(run.unfinished) > 0
    merged = added.merge(run.unfinished, on=["step", "prompt_id", "sample_idx"])
    assert (merged["response_len"] == merged["generated"]).all()
    assert (merged["max_tokens_x"] == merged["generated"]).all()  # recorded up to here: natural length beyond it
    assert (merged["finish_reason"] == "length").all() and not merged["trained"].any()
    # Each asked with the real budget, the Workload runs it past where the run left it.
    wl = Workload(trace, seed=1)
    for r in merged.itertuples():
        assert wl.lookup(r.step, r.prompt_id, r.sample_idx, r.max_tokens_y).length > r.generated
    assert twin_trace(RecordedRun(name=run.name, trace=run.trace, steps=run.steps, responses=run.responses,
                                  config=run.config)) is run.trace


def test_twin_trace_refuses_a_response_both_ended_and_unfinished(profile):
    run = _recorded(profile, seed=2)
    ended = run.responses.iloc[:1]  # a response that ended (the response table has its group)
    bad = pd.concat([run.unfinished, pd.DataFrame({
        **{c: ended[c].to_numpy() for c in ["step", "prompt_id", "sample_idx", "group_id", "prompt_len", "max_tokens"]},
        "generated": [1], "tokens_before_resume": [0]})], ignore_index=True)
    with pytest.raises(ValueError, match="both ended in the trace and left unfinished"):
        twin_trace(RecordedRun(name=run.name, trace=run.trace, steps=run.steps, responses=run.responses,
                               config=run.config, unfinished=bad))


def _steps(rows):
    steps = pd.DataFrame(rows, columns=["policy", "repeat", "step", "measured_seconds", "predicted_seconds"])
    steps["ape_pct"] = (steps["predicted_seconds"] - steps["measured_seconds"]).abs() / steps["measured_seconds"] * 100
    for col in ("measured_tokens", "predicted_tokens"):
        steps[col] = 100
    steps["exact_fraction"], steps["finish_order_spearman"] = 1.0, 1.0
    return steps


def test_the_speedup_error_is_split_into_groups_and_seconds():
    from lssim.analysis.fidelity.compare import fidelity_table

    responses = pd.DataFrame(columns=["policy", "end_step_measured", "end_step_predicted", "finish_time_measured",
                                      "finish_time_predicted"])
    steps = _steps([("baseline", 0, 0, 2.0, 2.2), ("p", 0, 0, 1.0, 1.0)]).drop(columns="repeat")
    # p: the twin trained 10 groups where the run trained 8 (segment's miss), and its seconds are right while the
    # baseline's are 10% slow.
    table = fidelity_table(steps, responses, groups={"baseline": (10, 10), "p": (8, 10)})
    assert table.loc["p", "speedup_measured"] == pytest.approx((2.0 / 10) / (1.0 / 8))
    assert table.loc["p", "speedup_points_groups"] == pytest.approx(((2.0 / 10) / (1.0 / 10) - 1.6) * 100)
    assert table.loc["p", "speedup_points_seconds"] == pytest.approx(((2.2 / 10) / (1.0 / 10) - 2.0) * 100)
    parts = table[["speedup_points_groups", "speedup_points_seconds"]].sum(axis=1)
    assert np.allclose(parts, table["speedup_error_points"])
    assert table.loc["baseline", ["speedup_points_groups", "speedup_points_seconds"]].abs().max() < 1e-9


def test_the_seconds_part_is_split_again_into_the_drivers_points_and_the_engines_where_the_runs_recorded_the_driver():
    """A twin that prices the engine exactly but not the driver's own time: the policy's run spent 0.3 s of its 1.3 s
    in the driver, the baseline's 0.1 of 2.1. The seconds part of its speedup error is all the driver's; and the two
    parts add up to the seconds part. Without the driver's column there is no split."""
    from lssim.analysis.fidelity.compare import fidelity_table

    responses = pd.DataFrame(columns=["policy", "end_step_measured", "end_step_predicted", "finish_time_measured",
                                      "finish_time_predicted"])
    steps = _steps([("baseline", 0, 0, 2.1, 2.0), ("p", 0, 0, 1.3, 1.0)]).drop(columns="repeat")
    steps["measured_driver_seconds"] = [0.1, 0.3]
    table = fidelity_table(steps, responses, groups={"baseline": (10, 10), "p": (8, 9)})
    assert table.loc["p", "speedup_points_engine"] == pytest.approx(0.0, abs=1e-9)
    assert table.loc["p", "speedup_points_driver"] == pytest.approx(table.loc["p", "speedup_points_seconds"])
    assert table.loc["p", "speedup_points_driver"] > 0  # the twin, pricing no driver, over-predicts the policy's speedup
    steps["measured_driver_seconds"] = [0.05, 0.1]
    table = fidelity_table(steps, responses, groups={"baseline": (10, 10), "p": (8, 9)})
    parts = table[["speedup_points_driver", "speedup_points_engine"]].sum(axis=1)
    assert np.allclose(parts, table["speedup_points_seconds"])
    plain = fidelity_table(steps.drop(columns="measured_driver_seconds"), responses, groups={"baseline": (10, 10), "p": (8, 9)})
    assert "speedup_points_driver" not in plain


@settings(max_examples=25, deadline=None)
@given(base=st.lists(st.floats(1.0, 3.0), min_size=3, max_size=3), pol=st.lists(st.floats(0.3, 3.0), min_size=3, max_size=3),
       groups=st.lists(st.integers(5, 12), min_size=3, max_size=3))
def test_speedup_by_repeat_pairs_each_repeat_with_the_baselines_and_the_summary_shows_the_range(base, pol, groups):
    from lssim.analysis.fidelity.compare import speedup_by_repeat
    from lssim.analysis.fidelity.report import fidelity_markdown
    from lssim.analysis.fidelity.summary import policy_summary

    steps = _steps([("baseline", k, 0, base[k], base[k]) for k in range(3)] + [("p", k, 0, pol[k], pol[k]) for k in range(3)])
    g = pd.DataFrame({"policy": ["baseline"] * 3 + ["p"] * 3, "repeat": [0, 1, 2] * 2, "measured_groups": [10] * 3 + groups})
    by = speedup_by_repeat(steps, g).set_index("repeat")["speedup_measured"]
    assert np.allclose(by.sort_index().to_numpy(), [(base[k] / 10) / (pol[k] / groups[k]) for k in range(3)])
    summary = pd.DataFrame({"makespan_median_ape_pct": [0.0, 0.0], "makespan_p90_ape_pct": [0.0, 0.0],
                            "speedup_measured": [1.0, by.median()], "speedup_predicted": [1.0, by.median()],
                            "speedup_error_points": [0.0, 0.0], "steps": [1, 1]}, index=pd.Index(["baseline", "p"], name="policy"))
    out = policy_summary(summary, pd.DataFrame(), None, speedups=speedup_by_repeat(steps, g))
    assert out.loc["p", "speedup_spread_points"] == pytest.approx((by.max() - by.min()) * 100)
    assert np.isnan(out.loc["baseline", "speedup_spread_points"])
    row = [line for line in fidelity_markdown(out).splitlines() if line.startswith("| `p`")][0]
    if round(by.min(), 2) != round(by.max(), 2):
        assert f"({by.min():.2f}-{by.max():.2f})" in row


def test_a_trace_with_a_missing_sample_answers_the_others_with_their_own_responses():
    trace = pd.DataFrame({"step": [0] * 3, "prompt_id": [7] * 3, "sample_idx": [0, 2, 3], "prompt_len": [5] * 3,
                          "response_len": [10, 20, 30], "reward": [1.0, 0.0, 1.0], "finish_reason": ["stop"] * 3,
                          "max_tokens": [64] * 3})
    wl = Workload(trace, seed=0)
    assert [wl.lookup(0, 7, k, 64).length for k in (0, 2, 3)] == [10, 20, 30]


def test_a_trace_of_measured_signals_gives_its_unfinished_responses_measured_rows_with_no_value_yet(profile):
    """A real run's trace holds the signals measured from its tokens; an unfinished response has none recorded. Its
    row in the twin's trace is measured at the trace's window, n-gram and stride with no value yet (the run never
    stopped it), so that a policy that reads the signals replays (a row of another source broke the trace's index)."""
    run = _recorded(profile, seed=1)
    trace = run.trace.assign(signal_source="measured", signal_window=32, signal_ngram=4, signal_stride=16)
    trace["signal_repetition"] = [np.zeros(n // 16, np.float32) for n in trace["response_len"]]
    trace["signal_entropy"] = [np.full(n // 16, np.nan, np.float32) for n in trace["response_len"]]
    run.trace = trace
    twin = twin_trace(run)
    added = twin[twin["stop_reason"] == UNFINISHED_AT_END]
    assert len(added) == len(run.unfinished) > 0 and (added["signal_source"] == "measured").all()
    assert (added["signal_window"] == 32).all() and (added["signal_stride"] == 16).all()
    assert all(len(a) == 0 for a in added["signal_repetition"])
    sim = _replay(run, profile, 1)
    assert sim.steps["groups_trained"].sum() > 0
