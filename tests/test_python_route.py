"""The Python route (lssim.kernels.python_route): every kernel run from its Python source on numpy arrays, as a small
`lssim replay` runs them, must compute what numba's compiled code computes, to the last bit. Each world here is run
twice, compiled and on the Python route, on generated traces (varied lengths and budgets, loops and entropy labels,
small KV caches that preempt, several steps and instances) under the policies of every route: the batch route, its
stops (lssim.sim.event_kernels), the event engine; the steps and responses frames must be equal, not close."""

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lssim.kernels import I64S, KernelFunction, kernel, on_python_route, python_route, unowned
from lssim.traces.workload_index import _hash01_words, hash01, hash01_many
from test_fastpath import BATCH_POLICIES, PROFILED, ROOFLINE, run
from test_fastpath_events import ROUTED, labelled_trace

EVENT_ROUTE = ["april", "lpt+april"]  # policies that steer single events: the event engine's lookups and bound
REQUEUED = ["seer(chunk=16)"]  # compiled, the requeue route's kernel (roofline); on the Python route, the event engine


def _run_both(trace, policy, cost, n_instances, max_num_seqs, kv, mode):
    """The run compiled and on the Python route, each (result, engine); (None, None) twice where both refuse it (a
    policy that raises a budget past the KV cache: vade's tiers), with one message."""
    outcomes = []
    for python in (False, True):
        with python_route(python):
            try:
                outcomes.append(run(trace, policy, cost, n_instances, max_num_seqs, kv, mode, batch_route=True))
            except ValueError as refused:
                outcomes.append(str(refused))
    return outcomes


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31), steps=st.integers(1, 3), prompts=st.integers(1, 6), group=st.integers(1, 4),
       max_len=st.integers(1, 300), n_instances=st.integers(1, 3), max_num_seqs=st.integers(1, 8),
       slack=st.integers(0, 400), policy=st.sampled_from(BATCH_POLICIES + ROUTED + EVENT_ROUTE + REQUEUED),
       cost=st.sampled_from([PROFILED, ROOFLINE]), mode=st.sampled_from(["collocated", "disaggregated", "hybrid"]))
def test_the_python_route_runs_as_the_compiled_kernels_bit_for_bit(seed, steps, prompts, group, max_len, n_instances,
                                                                   max_num_seqs, slack, policy, cost, mode):
    trace = labelled_trace(np.random.default_rng(seed), steps, prompts, group, max_len)
    kv = int(trace["prompt_len"].max() + trace["max_tokens"].max()) + slack  # a request may ask the run's budget  # small: most runs preempt
    compiled, python = _run_both(trace, policy, cost, n_instances, max_num_seqs, kv, mode)
    if isinstance(compiled, str) or isinstance(python, str):
        assert compiled == python  # refused alike, with one message
        return
    (fast, fast_engine), (slow, slow_engine) = compiled, python
    pd.testing.assert_frame_equal(fast.steps, slow.steps, check_exact=True)
    pd.testing.assert_frame_equal(fast.responses, slow.responses, check_exact=True)
    assert (fast_engine.preemptions, fast_engine.sources, fast_engine.clock) == \
        (slow_engine.preemptions, slow_engine.sources, slow_engine.clock)


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(-2**63, 2**63 - 1), words=st.lists(st.integers(-2**63, 2**63 - 1), min_size=2, max_size=3))
def test_the_hashes_wrap_alike_on_both_routes_and_equal_the_scalar_hash(seed, words):
    """Over arrays (hash01_many) and word by word from Python ints (resampled_rows' _hash01_words), any int64."""
    parts = [np.array([w], np.int64) for w in words]
    padded = (*words, 0)[:3]
    compiled = hash01_many(seed, *parts), _hash01_words(seed, *padded, len(words))
    with python_route():
        python = hash01_many(seed, *parts), _hash01_words(seed, *padded, len(words))
    assert compiled[0].tolist() == python[0].tolist() == [hash01(seed, *words)]
    assert compiled[1] == python[1] == hash01(seed, *words)


def test_python_route_is_a_scope_and_a_kernel_keeps_its_name():
    from lssim.sim.assign import _least_work

    assert isinstance(_least_work, KernelFunction) and _least_work.__name__ == "_least_work"
    assert not on_python_route()
    with python_route():
        assert on_python_route()
        with python_route(False):
            assert not on_python_route()
        assert _least_work(np.zeros(2, np.int64), np.array([3, 1, 1], np.int64)).tolist() == [0, 1, 1]
    assert not on_python_route()


def test_a_refused_call_on_the_python_route_leaves_the_route_as_it_was():
    with pytest.raises(ZeroDivisionError):
        with python_route():
            raise ZeroDivisionError
    assert not on_python_route()


@kernel(I64S)
def _doubled_through_views(values):
    """Doubles `values` in place through a view with no owner, passed on to another kernel: the sum then."""
    view = unowned(values)
    _double(view)
    return unowned(view).sum()


@kernel(I64S)
def _double(values):
    for i in range(len(values)):
        values[i] *= 2


def test_a_view_with_no_owner_reads_and_writes_its_arrays_memory_on_both_routes():
    for python in (False, True):
        values = np.arange(5, dtype=np.int64)
        with python_route(python):
            assert _doubled_through_views(values) == 20
        assert values.tolist() == [0, 2, 4, 6, 8]
