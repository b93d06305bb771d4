"""SimEngine.abort_many against SimEngine.abort one by one: the same requests, instances, clock and later events.

An engine runs a submission part way (some events popped, so instances run and queue), is copied, and the same
requests (running, waiting, finished ones, in a random order, some twice) are aborted in turn on one copy and at once
on the other; then both drain what is left, with a second submission on top. Every request's fields, every instance's
clocks and heaps and every later event must be equal to the last bit, with aborts that cost the caller time or not.
"""

import copy

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lssim.loop.plan_columns import plan_requests
from lssim.loop.core import GroupSpec
from lssim.loop.contracts import Engine
from lssim.sim.world import EngineConfig, SimEngine
from lssim.traces.workload import Workload
from test_fastpath import PROFILED, ROOFLINE, make_trace
from test_fastpath_carry import SLOW_ABORTS

REQUEST_STATE = ("generated", "finish_reason", "reward", "submit_time", "first_token_time", "finish_time", "ran_on", "exact")
INSTANCE_STATE = ("t", "it", "n", "ctx", "busy", "seq_seconds", "pending", "left_at", "left", "owed")


def requests_of(wl: Workload, step: int, first_rid: int, rng: np.random.Generator):
    plan = [GroupSpec(int(p), wl.group_size, wl.max_tokens) for p in wl.pool.prompt_id]
    cols, _ = plan_requests(plan, step=step, first_rid=first_rid, first_group=first_rid, version=0, rng=rng,
                            prompt_lens=wl.prompt_lens, samples_planned={}, batch_samples={})
    return cols.to_requests()


def engine_state(engine: SimEngine, requests) -> tuple:
    return (engine.clock, engine.utilization(), dict(engine.sources),
            [tuple(getattr(r, name) for name in REQUEST_STATE) for r in requests],
            [tuple(getattr(x, name) for name in INSTANCE_STATE) for x in engine.instances],
            [sorted((e[0], e[3], e[4].rid) for e in x.running if e[3] == engine._epoch.get(e[4].rid)) for x in engine.instances],
            [sorted((e[0], e[2], e[3].rid) for e in x.waiting if e[2] == engine._epoch.get(e[3].rid)) for x in engine.instances])


def drained(engine: SimEngine) -> list[tuple]:
    out = []
    while events := engine.next_events():
        out.extend((e.kind, e.request.rid, e.time) for e in events)
    return out


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31), prompts=st.integers(1, 6), group=st.integers(1, 4), max_len=st.integers(1, 300),
       n_instances=st.integers(1, 3), max_num_seqs=st.integers(1, 8), slack=st.integers(0, 400), popped=st.integers(0, 12),
       cost=st.sampled_from([PROFILED, ROOFLINE, SLOW_ABORTS]), interval=st.sampled_from([None, 7]))
def test_abort_many_is_abort_one_by_one(seed, prompts, group, max_len, n_instances, max_num_seqs, slack, popped, cost,
                                        interval):
    rng = np.random.default_rng(seed)
    trace = make_trace(rng, 2, prompts, group, max_len)
    wl = Workload(trace)
    kv = int(trace["prompt_len"].max() + trace["max_tokens"].max()) + slack
    one = SimEngine(wl, cost, EngineConfig(n_instances, max_num_seqs, kv), batch_route=False)
    one.set_progress_interval(interval)
    submitted = requests_of(wl, 0, 0, rng)
    one.submit(submitted)
    for _ in range(popped):
        one.next_events()
    chosen = list(rng.permutation(len(submitted))) + list(rng.integers(0, len(submitted), 2))  # some twice
    many, many_submitted = copy.deepcopy((one, submitted), {id(wl): wl, id(cost): cost})
    later = requests_of(wl, 1, len(submitted), rng)
    for engine, own, abort in ((one, submitted, lambda e, rs: [e.abort(r) for r in rs]),
                               (many, many_submitted, SimEngine.abort_many)):
        requests = [own[i] for i in chosen]
        abort(engine, requests)
        engine.after_aborts = engine_state(engine, sorted(set(requests), key=lambda r: r.rid))
        engine.submit(copy.deepcopy(later))
        engine.events_after = drained(engine)
    assert one.after_aborts == many.after_aborts
    assert one.events_after == many.events_after


def test_the_contracts_abort_many_aborts_each_in_order():
    class Recording(Engine):
        n_instances = 1

        def __init__(self):
            self.aborted = []

        def abort(self, request):
            self.aborted.append(request)

    engine = Recording()
    engine.abort_many(["a", "b", "a"])
    assert engine.aborted == ["a", "b", "a"]
