"""A cut's aborts on its held arrays (lssim.sim.cut_aborts, lssim.sim.cut_abort_kernels) against the same aborts on
the event engine's heaps built at the cut (HeldCut.materialize, then SimEngine.abort_many).

An engine runs a submission on the cut route and is cut at a random boundary; it is copied, and every request still in
flight (running or queued) is aborted in a random order on both copies: on one its heaps are built first, on the other
the aborts run on the arrays. Every request's fields, every instance's clocks and heaps, and every event of a second
submission after must be equal to the last bit, with aborts that cost the caller time (so instances run between them)
or not. Aborting only some of them builds the heaps and aborts there.
"""

import copy
from unittest import mock

import numpy as np
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from lssim.cost.roofline import RooflineCostModel
from lssim.loop.columns import RequestColumns
from lssim.loop.row_requests import RowRequests
from lssim.sim.cut_aborts import HeldCut
from lssim.sim.world import EngineConfig, SimEngine
from lssim.traces.workload import Workload
from test_abort_many import drained, engine_state, requests_of
from test_fastpath import make_trace


def cut_engine(seed: int, prompts: int, group: int, max_len: int, n_instances: int, max_num_seqs: int, slack: int,
               cut_fraction: float):
    """An engine cut on the cut route, the requests still in flight, the workload, the cost and the rng; None where
    the step ran to its end or was left to the event engine."""
    rng = np.random.default_rng(seed)
    trace = make_trace(rng, 2, prompts, group, max_len)
    wl, cost = Workload(trace), RooflineCostModel("qwen2.5-7b", "H100")
    kv = int(trace["prompt_len"].max() + trace["max_tokens"].max()) + slack
    engine = SimEngine(wl, cost, EngineConfig(n_instances, max_num_seqs, kv))
    engine.set_cut_rollout(True)
    columns = RequestColumns.of(requests_of(wl, 0, 0, rng))
    requests = RowRequests(columns.take(np.arange(len(columns))), [])
    ended = engine.run_cut(requests, columns, lambda progress: int(cut_fraction * (len(progress) - 1)))
    if ended is None or engine._held_cut is None:
        return None
    in_flight = np.setdiff1d(np.arange(len(columns)), ended)
    return engine, requests.make(rng.permutation(in_flight)), wl, cost, rng


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31), prompts=st.integers(1, 6), group=st.integers(1, 4), max_len=st.integers(1, 300),
       n_instances=st.integers(1, 3), max_num_seqs=st.integers(1, 8), slack=st.integers(0, 400),
       cut_fraction=st.floats(0, 1), abort_seconds=st.sampled_from([0.0, 1e-3, 0.05]), only_some=st.booleans())
def test_aborting_a_held_cut_is_abort_many_on_its_heaps(seed, prompts, group, max_len, n_instances, max_num_seqs, slack,
                                                        cut_fraction, abort_seconds, only_some):
    with mock.patch.object(RooflineCostModel, "abort_time", lambda self, n: abort_seconds * n):
        cut = cut_engine(seed, prompts, group, max_len, n_instances, max_num_seqs, slack, cut_fraction)
        assume(cut is not None)
        heaps, in_flight, wl, cost, rng = cut
        arrays, arrays_in_flight = copy.deepcopy((heaps, in_flight), {id(wl): wl, id(cost): cost})
        aborted = slice(0, len(in_flight) - 1 if only_some else len(in_flight))
        later = requests_of(wl, 1, 1000, rng)
        heaps._settle_cut()
        heaps.abort_many(in_flight[aborted])
        built = mock.patch.object(HeldCut, "materialize", side_effect=AssertionError("heaps built"))
        if only_some:
            arrays.abort_many(arrays_in_flight[aborted])
        else:
            with built:
                arrays.abort_many(arrays_in_flight[aborted])
        assert arrays._held_cut is None
        for engine, own in ((heaps, in_flight), (arrays, arrays_in_flight)):
            engine.after_aborts = engine_state(engine, sorted(own, key=lambda r: r.rid))
            engine.submit(copy.deepcopy(later))
            engine.events_after = drained(engine)
        assert heaps.after_aborts == arrays.after_aborts
        assert heaps.events_after == arrays.events_after


def test_any_other_command_builds_the_held_cuts_heaps_first():
    for seed in range(40):
        cut = cut_engine(seed, 4, 3, 200, 2, 4, 300, 0.3)
        if cut is not None:
            break
    engine, in_flight, *_ = cut
    loads = engine.loads()
    assert engine._held_cut is None
    assert sum(load.running + load.waiting for load in loads) == len(in_flight)
