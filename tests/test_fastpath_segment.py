"""segment's carries on the carry route (lssim.sim.carry_route, Policy.progress_carries) against the event engine.

Each run is made twice, on generated traces (several steps, so carried responses resume and are carried again; 1-3
instances; KV caches small enough to preempt), once with the route allowed and once on the event engine alone
(`batch_route=False`): every step and response row, bit for bit, and the engines' counters and clocks must agree.
"""

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lssim.sim.carry_route as carry_route
from lssim.kernels import python_route
from lssim.loop.history import LengthHistory
from lssim.loop.policy import make_policy
from test_fastpath import PROFILED, ROOFLINE, make_trace, run
from test_fastpath_carry import SLOW_ABORTS
from test_policy_arrays import DequeHistory, outcome, responses

SEGMENTS = ["segment(window=64)", "segment(window=50, extend=0.5, checks=5, refill=False)",
            "segment(window=32, extend=0.0, checks=1)", "segment(window=40, extend=1.0, checks=8, keep=2)",
            "segment(window=24, checks=3, bridge=True)", "lpt+segment(window=40)", "segment(window=48)+hadb"]


def assert_same_carried_run(trace, policy, cost, n_instances, max_num_seqs, kv, mode="collocated"):
    """The run on the carry route and on the event engine alone: the same frames to the last bit, the same counters."""
    slow, slow_engine = run(trace, policy, cost, n_instances, max_num_seqs, kv, mode, batch_route=False)
    fast, fast_engine = run(trace, policy, cost, n_instances, max_num_seqs, kv, mode, batch_route=True)
    assert fast_engine._cut and not slow_engine._cut
    pd.testing.assert_frame_equal(fast.steps, slow.steps, check_exact=True)
    pd.testing.assert_frame_equal(fast.responses, slow.responses, check_exact=True)
    assert (fast_engine.preemptions, fast_engine.sources) == (slow_engine.preemptions, slow_engine.sources)
    assert fast_engine.clock == slow_engine.clock
    assert fast_engine.utilization() == slow_engine.utilization()
    return fast, fast_engine


@pytest.fixture
def routes(monkeypatch) -> dict[str, int]:
    """How many submissions the carry route ran and how many it left to the event engine."""
    seen = {"carry": 0, "event": 0}
    real = carry_route.run_carried

    def counted(engine, requests, columns, carry_at):
        out = real(engine, requests, columns, carry_at)
        seen["event" if out is None else "carry"] += 1
        return out

    monkeypatch.setattr(carry_route, "run_carried", counted)
    return seen


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**31), steps=st.integers(1, 4), prompts=st.integers(1, 6), group=st.integers(1, 4),
       max_len=st.integers(1, 300), n_instances=st.integers(1, 3), max_num_seqs=st.integers(1, 8),
       slack=st.integers(0, 400), policy=st.sampled_from(SEGMENTS), cost=st.sampled_from([PROFILED, ROOFLINE]),
       mode=st.sampled_from(["collocated", "disaggregated"]))
def test_the_carry_route_equals_the_event_engine(routes, seed, steps, prompts, group, max_len, n_instances,
                                                 max_num_seqs, slack, policy, cost, mode):
    """(async interrupts rollouts and hybrid streams groups to training as they end: both stay on the event route)"""
    trace = make_trace(np.random.default_rng(seed), steps, prompts, group, max_len)
    kv = int(trace["prompt_len"].max() + trace["max_tokens"].max()) + slack  # a request may ask the run's budget
    assert_same_carried_run(trace, policy, cost, n_instances, max_num_seqs, kv, mode)
    assert routes["event"] == 0 and routes["carry"] > 0


@pytest.mark.parametrize("kv", [700, 100_000])
def test_responses_are_carried_resumed_and_carried_again(routes, kv):
    """The runs above are not vacuous: many carries, carried responses resumed and carried again in later steps, groups
    kept open across steps, and (a small cache) preemption, all on the carry route."""
    trace = make_trace(np.random.default_rng(5), 4, 6, 4, 300)
    fast, engine = assert_same_carried_run(trace, "segment(window=32, extend=0.5)", ROOFLINE, 2, 4, kv)
    carried = fast.responses["stop_reason"] == "segment: window"
    resumed = fast.responses["tokens_before_resume"] > 0
    assert carried.sum() > 20 and resumed.sum() > 10
    assert (fast.responses.loc[resumed, "tokens_before_resume"] >= 64).any()  # carried twice: 32 or more tokens each
    assert routes["event"] == 0 and routes["carry"] >= 4
    assert engine.preemptions > 0 if kv < 1000 else engine.preemptions == 0


@pytest.mark.parametrize("policy, cost", [("segment(window=32)", SLOW_ABORTS), ("segment(window=32)+spec_tail", ROOFLINE)])
def test_aborts_that_cost_time_and_speculation_leave_carries_to_the_event_engine(routes, policy, cost):
    """An abort that blocks the caller (cost.abort_time > 0) moves the clock under the other instances mid-rollout,
    which the schedule does not model, and the kernels do not price speculation: every submission goes to the event
    engine, with the same frames."""
    trace = make_trace(np.random.default_rng(7), 3, 6, 4, 300)
    assert_same_carried_run(trace, policy, cost, 2, 4, 100_000)
    assert routes["carry"] == 0 and routes["event"] > 0


def test_the_carry_route_on_the_python_route(routes):
    """The kernels' own Python source on numpy (lssim.kernels.python_route, a small replay's): the same frames."""
    trace = make_trace(np.random.default_rng(3), 3, 6, 4, 300)
    with python_route():
        assert_same_carried_run(trace, "segment(window=32, extend=0.5)", PROFILED, 2, 4, 700)
    assert routes["event"] == 0 and routes["carry"] > 0


def test_which_policies_carry_in_batches():
    """segment, alone or beside step-level and array-form hooks; not beside another on_progress rule, an end_rollout
    rule or top-ups (those react to events the schedule cannot answer ahead), nor a policy that never carries."""
    for policy in ("segment", "lpt+segment", "segment+hadb", "segment(bridge=True)+vade"):
        assert make_policy(policy).carries_in_batches(), policy
    for policy in ("segment+breaker", "segment+april", "dapo+segment", "segment+seer", "breaker", "april", "baseline"):
        assert not make_policy(policy).carries_in_batches(), policy


@settings(max_examples=150, deadline=None)
@given(keep=st.integers(1, 5), steps=st.lists(responses, max_size=6),
       asked=st.lists(st.tuples(st.integers(-1, 8), st.integers(0, 3000)), min_size=1, max_size=30))
def test_the_history_over_arrays_answers_what_a_deque_per_prompt_answers(keep, steps, asked):
    """LengthHistory.remainings (segment's carries for a whole submission): each pair's `remaining` from a list of the
    prompt's latest lengths, to the last bit, NaN for None."""
    h, ref = LengthHistory(keep), DequeHistory(keep)
    for step, rows in enumerate(steps):
        o = outcome(step, [p for p, _, _ in rows], [n for _, n, _ in rows], [r for _, _, r in rows])
        h.update(o)
        ref.update(o)
    pids, generated = np.array([p for p, _ in asked]), np.array([g for _, g in asked])
    expected = [np.nan if (left := ref.remaining(p, g)) is None else left for p, g in asked]
    np.testing.assert_array_equal(h.remainings(pids, generated), expected, strict=True)
