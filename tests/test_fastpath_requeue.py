"""The requeue route (lssim.sim.requeue_route: seer's rollout in one numba kernel) against the event engine.

Every run is made twice on a generated trace, once with the route allowed and once on the event engine alone: several
steps, the modes that run a rollout whole, 1-4 instances, KV caches small enough that requests are preempted, chunks small enough that most responses
reach several checkpoints, every_chunk. The step and response frames must be equal to the last bit, and so must the
engines' counters and clocks.
"""

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lssim.kernels import python_route
from lssim.loop.controller import Controller, RunConfig
from lssim.loop.policy import make_policy
from lssim.sim.requeue_rules import RequeueRules, moves, rank
from lssim.sim.trainer import SimTrainer
from lssim.sim.world import EngineConfig, SimEngine
from lssim.traces.workload import Workload
from policies.seer import Seer
from test_fastpath import PROFILED, ROOFLINE, TRAIN, make_trace, run

SEERS = ["seer", "seer(chunk=16)", "seer(chunk=5, every_chunk=True)", "seer(chunk=40, rebalance=3)",
         "seer(chunk=24, every_chunk=True, rebalance=2)"]


def assert_bit_equal(trace, policy, n_instances, max_num_seqs, kv, mode="collocated"):
    slow, slow_engine = run(trace, policy, ROOFLINE, n_instances, max_num_seqs, kv, mode, batch_route=False)
    fast, fast_engine = run(trace, policy, ROOFLINE, n_instances, max_num_seqs, kv, mode, batch_route=True)
    assert fast_engine._requeue and not slow_engine._requeue  # the two routes did run
    pd.testing.assert_frame_equal(fast.steps, slow.steps, check_exact=True)
    pd.testing.assert_frame_equal(fast.responses, slow.responses, check_exact=True)
    assert fast_engine.preemptions == slow_engine.preemptions
    assert fast_engine.sources == slow_engine.sources
    assert fast_engine.clock == slow_engine.clock
    assert fast_engine.utilization() == slow_engine.utilization()
    return slow_engine


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31), steps=st.integers(1, 3), prompts=st.integers(1, 6), group=st.integers(1, 5),
       max_len=st.integers(1, 300), n_instances=st.integers(1, 4), max_num_seqs=st.integers(1, 8),
       slack=st.integers(0, 400), policy=st.sampled_from(SEERS),
       mode=st.sampled_from(["collocated", "disaggregated", "hybrid"]))
def test_requeue_route_equals_event_engine(seed, steps, prompts, group, max_len, n_instances, max_num_seqs, slack,
                                           policy, mode):
    trace = make_trace(np.random.default_rng(seed), steps, prompts, group, max_len)
    kv = int(trace["prompt_len"].max() + trace["max_tokens"].max()) + slack  # a request may ask the run's budget
    assert_bit_equal(trace, policy, n_instances, max_num_seqs, kv, mode)


@pytest.mark.parametrize("n_instances", [2, 4])
def test_requeues_and_preemption_happen_and_stay_equal(n_instances):
    """A world where seer moves responses and a small cache preempts them, on 2 and 4 instances: the route is taken
    and equal to the event engine (the checks above are not vacuous)."""
    trace = make_trace(np.random.default_rng(11), steps=3, prompts=6, group=4, max_len=600)
    kv = int(trace["prompt_len"].max() + trace["max_tokens"].max()) + 50
    engine = assert_bit_equal(trace, "seer(chunk=32, every_chunk=True)", n_instances, 8, kv)
    assert engine.preemptions > 0
    moved = run(trace, "seer(chunk=32, every_chunk=True)", ROOFLINE, n_instances, 8, kv, "collocated", True)[0]
    assert (moved.responses["submit_time"] > 0).any()  # some response was submitted again mid-rollout


def test_the_kernels_python_source_equals_the_compiled_kernels():
    """The kernels' Python source (python_route) gives the compiled kernels' frames: the route chosen compiled, the
    run made on the Python route (a replay on the Python route keeps seer on the event engine: faster there)."""
    trace = make_trace(np.random.default_rng(5), steps=2, prompts=5, group=4, max_len=200)
    kv = int(trace["prompt_len"].max() + trace["max_tokens"].max()) + 30
    runs = []
    for python in (False, True):
        ctl, engine = controller(trace, "seer(chunk=8)", ROOFLINE, 3, 4, kv)
        assert engine._requeue
        with python_route(python):
            runs.append(ctl.run())
    pd.testing.assert_frame_equal(runs[1].responses, runs[0].responses, check_exact=True)
    pd.testing.assert_frame_equal(runs[1].steps, runs[0].steps, check_exact=True)
    with python_route():
        assert not controller(trace, "seer(chunk=8)", ROOFLINE, 3, 4, kv)[1]._requeue


def controller(trace, policy, cost, n_instances, max_num_seqs, kv):
    """test_fastpath.run's controller and engine (the route chosen), not run yet."""
    wl = Workload(trace)
    engine = SimEngine(wl, cost, EngineConfig(n_instances, max_num_seqs, kv))
    cfg = RunConfig(steps=2 * len(wl.steps), groups_per_step=wl.groups_per_step, group_size=wl.group_size,
                    max_tokens=wl.max_tokens, total_groups=wl.groups_in(len(wl.steps)), seed=3)
    return Controller(engine, SimTrainer(engine, TRAIN), wl, make_policy(policy), cfg), engine


class WatchingSeer(Seer):
    """A seer extended to change its on_progress: its array forms no longer answer for it."""

    def on_progress(self, request, state):
        return super().on_progress(request, state)


def test_who_takes_the_route():
    """seer alone, with its own hooks and the roofline; not a subclass that changes a hook, not seer composed, not
    another cost model (the kernel prices with the roofline)."""
    assert Seer().requeues_in_batches()
    assert not WatchingSeer().requeues_in_batches()
    for spec in ("seer+hadb", "seer+spec_tail", "hadb", "segment", "april"):
        assert not make_policy(spec).requeues_in_batches(), spec
    trace = make_trace(np.random.default_rng(1), steps=1, prompts=3, group=3, max_len=100)
    _, engine = run(trace, "seer", PROFILED, 2, 8, 10**6, "collocated", batch_route=True)
    assert not engine._requeue and not engine._batch
    _, engine = run(trace, "seer", ROOFLINE, 2, 8, 10**6, "async", batch_route=True)
    assert not engine._requeue  # an async mode keeps responses generating across steps


@settings(max_examples=200, deadline=None)
@given(probe=st.lists(st.booleans(), min_size=1, max_size=20), seed=st.integers(0, 2**31))
def test_the_rules_on_arrays_equal_the_rules_on_numbers(probe, seed):
    """rank and moves, written once: elementwise on arrays what they are on each request's numbers."""
    rng = np.random.default_rng(seed)
    n = len(probe)
    p, generated, estimate = np.array(probe), rng.integers(0, 5000, n), rng.integers(0, 5000, n)
    here, least = rng.integers(0, 50, n), rng.integers(0, 50, n)
    ranks, moved = rank(p, generated, estimate), moves(here, least, 2, False)
    for j in range(n):
        assert ranks[j] == rank(bool(p[j]), int(generated[j]), int(estimate[j]))
        assert moved[j] == moves(int(here[j]), int(least[j]), 2, False)


def test_rules_refuse_mismatched_rows():
    with pytest.raises(ValueError, match="one entry per row"):
        RequeueRules(np.zeros(2, bool), np.zeros(3, np.int64), np.zeros(2, bool), np.zeros(2, np.int64), 2, False)
