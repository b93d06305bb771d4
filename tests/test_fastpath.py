"""The batch route (lssim.sim.fastsim) against the event engine (lssim.sim.world): one set of semantics.

Every run here is made twice, once with the batch route allowed and once on the event engine alone, on generated
traces -- varied lengths, prompt lengths and per-member budgets, several steps, 1-3 instances, KV caches small
enough that requests are preempted -- under the policies and modes the batch route serves. The per-step rows
(rollout seconds, lower bound, utilization...), every response's row (finish and first-token times, lengths,
what trained) and the engine's counters must agree.
"""

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lssim.sim.bounds import make_lower_bound
from lssim.loop.controller import Controller, RunConfig
from lssim.cost import ProfiledCostModel, RooflineCostModel
from lssim.sim.fastsim import price_decode
from lssim.loop.modes import ModeConfig
from lssim.loop.policy import make_policy
from lssim.sim.trainer import SimTrainer, TrainTimeModel
from lssim.sim.world import EngineConfig, SimEngine
from lssim.traces.synth import get_preset, synthesize
from lssim.traces.workload import OracleLengths, Workload

# a profiled model with departures priced (the event engine's "owed" seconds), and the roofline
PROFILED = ProfiledCostModel(c0=1e-3, c1=1e-5, c2=1e-9, p0=1e-4, p1=1e-6, f0=2e-4, f1=3e-5)
ROOFLINE = RooflineCostModel("qwen2.5-7b", "H100")
TRAIN = TrainTimeModel(seconds_per_token=1e-6, fixed_seconds=0.5, sync_seconds=0.25)
BATCH_POLICIES = ["baseline", "hadb(warmup_fraction=0.2)", "oracle", "vade", "ar3po", "alc", "ebs"]


def make_trace(rng: np.random.Generator, steps: int, prompts: int, group: int, max_len: int) -> pd.DataFrame:
    """A trace with per-prompt prompt lengths, per-member budgets (some responses cut by theirs) and rewards."""
    s, p, k = (a.ravel() for a in np.meshgrid(np.arange(steps), np.arange(prompts), np.arange(group), indexing="ij"))
    natural = rng.integers(1, max_len + 1, len(s))
    budget = np.where(rng.random(len(s)) < 0.3, rng.integers(1, max_len + 1, len(s)), max_len)
    cut = natural >= budget
    return pd.DataFrame({
        "step": s, "prompt_id": p, "sample_idx": k, "prompt_len": rng.integers(1, 48, prompts)[p],
        "response_len": np.minimum(natural, budget), "reward": np.where(cut, 0.0, (natural % 2).astype(float)),
        "finish_reason": np.where(cut, "length", "stop"), "max_tokens": budget,
        "loop_start": -1, "entropy_mean": 0.6,  # labelled: no loops (signal source synthetic), breaker may read them
    })


def run(trace, policy: str, cost, n_instances: int, max_num_seqs: int, kv: int, mode: str, batch_route: bool):
    wl = Workload(trace)
    engine = SimEngine(wl, cost, EngineConfig(n_instances, max_num_seqs, kv), batch_route=batch_route)
    n_steps = len(wl.steps)
    cfg = RunConfig(steps=2 * n_steps, groups_per_step=wl.groups_per_step, group_size=wl.group_size,
                    max_tokens=wl.max_tokens, total_groups=wl.groups_in(n_steps), seed=3)
    modes = ModeConfig(mode=mode, rollout_devices=n_instances, train_devices=n_instances if mode == "collocated" else 2)
    ctl = Controller(engine, SimTrainer(engine, TRAIN, n_devices=modes.train_devices, collocated=modes.collocated), wl,
                     make_policy(policy), cfg, mode=modes.build(),
                     oracle_length=OracleLengths(wl))
    ctl.lower_bound = make_lower_bound(engine.cost, n_instances, max_num_seqs)
    return ctl.run(), engine


def assert_same_runs(fast, fast_engine, slow, slow_engine) -> None:
    """Two runs of one world agree: every step and response row, and the engines' counters and clocks."""
    pd.testing.assert_frame_equal(fast.steps, slow.steps, check_exact=False, rtol=1e-9, atol=0)
    pd.testing.assert_frame_equal(fast.responses, slow.responses, check_exact=False, rtol=1e-9, atol=0)
    assert fast_engine.preemptions == slow_engine.preemptions
    assert fast_engine.sources == slow_engine.sources
    assert fast_engine.clock == pytest.approx(slow_engine.clock, rel=1e-12)
    assert fast_engine.utilization() == pytest.approx(slow_engine.utilization(), rel=1e-12)


def assert_same_run(trace, policy, cost, n_instances, max_num_seqs, kv, mode):
    try:
        slow, slow_engine = run(trace, policy, cost, n_instances, max_num_seqs, kv, mode, batch_route=False)
    except ValueError as refused:  # a policy raised a budget past the KV cache (vade's tiers): both routes refuse it
        with pytest.raises(ValueError, match="KV tokens; an instance holds"):
            run(trace, policy, cost, n_instances, max_num_seqs, kv, mode, batch_route=True)
        assert "KV tokens; an instance holds" in str(refused)
        return None, None
    fast, fast_engine = run(trace, policy, cost, n_instances, max_num_seqs, kv, mode, batch_route=True)
    assert fast_engine._batch and not slow_engine._batch  # the two routes did run
    assert_same_runs(fast, fast_engine, slow, slow_engine)
    return fast, fast_engine


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31), steps=st.integers(1, 3), prompts=st.integers(1, 6), group=st.integers(1, 4),
       max_len=st.integers(1, 300), n_instances=st.integers(1, 3), max_num_seqs=st.integers(1, 8),
       slack=st.integers(0, 400), policy=st.sampled_from(BATCH_POLICIES), cost=st.sampled_from([PROFILED, ROOFLINE]),
       mode=st.sampled_from(["collocated", "disaggregated", "hybrid"]))
def test_batch_route_equals_event_engine(seed, steps, prompts, group, max_len, n_instances, max_num_seqs, slack, policy,
                                         cost, mode):
    trace = make_trace(np.random.default_rng(seed), steps, prompts, group, max_len)
    kv = int(trace["prompt_len"].max() + trace["max_tokens"].max()) + slack  # a request may ask the run's budget  # small: most runs preempt
    assert_same_run(trace, policy, cost, n_instances, max_num_seqs, kv, mode)


@pytest.mark.parametrize("policy", ["baseline", "oracle"])
def test_kv_bound_steps_preempt_and_agree(policy):
    """Long responses in a cache that holds a few of them: the regime where preemption decides the time."""
    trace = make_trace(np.random.default_rng(7), steps=3, prompts=16, group=8, max_len=2000)
    _, engine = assert_same_run(trace, policy, ROOFLINE, 2, 64, 6000, "collocated")
    assert engine.preemptions > 50


def test_a_batch_that_outgrows_its_first_room_is_run_again_with_more(monkeypatch):
    """`schedule_records` makes room for a fixed number of records and admissions and says when it ran out (preemptions
    make more); the batch route then runs it again with more room, and still agrees with the event engine."""
    import lssim.sim.fastsim as fastsim

    calls = []
    structure = fastsim.schedule_records

    def counted(*args):
        calls.append(args[-1])
        return structure(*args)

    monkeypatch.setattr(fastsim, "records_room", lambda n_requests, n_instances: 2)
    monkeypatch.setattr(fastsim, "schedule_records", counted)
    trace = make_trace(np.random.default_rng(7), steps=2, prompts=8, group=4, max_len=800)
    _, engine = assert_same_run(trace, "baseline", ROOFLINE, 2, 16, 2000, "collocated")
    assert engine.preemptions > 0 and 2 in calls and max(calls) >= 32  # ran out at first, then ran with more room


def test_event_hooks_keep_the_event_engine():
    """A policy that reacts to single events (APRIL's end of rollout, seer's requeues, rollpacker's finishes read
    mid-rollout) is not batched (tests/test_fastpath_events.py: the rollout hooks that are)."""
    trace = make_trace(np.random.default_rng(1), steps=2, prompts=4, group=4, max_len=100)
    for policy in ("april", "seer", "rollpacker"):
        _, engine = run(trace, policy, PROFILED, 2, 8, 10**6, "collocated", batch_route=True)
        assert not engine._batch
    _, engine = run(trace, "baseline", PROFILED, 2, 8, 10**6, "async", batch_route=True)
    assert not engine._batch  # an async mode ends rollouts early and keeps responses generating


@settings(max_examples=200, deadline=None)
@given(n=st.lists(st.integers(0, 512), min_size=1, max_size=20), ctx=st.lists(st.integers(0, 10**6), min_size=20, max_size=20),
       k=st.lists(st.integers(-1, 50_000), min_size=20, max_size=20))
def test_priced_spans_equal_the_scalar_roofline_bit_for_bit(n, ctx, k):
    m = len(n)
    n, ctx, k = np.array(n), np.array(ctx[:m]), np.array(k[:m])
    for cost in (ROOFLINE, RooflineCostModel("llama3-8b", "H100"), RooflineCostModel("qwen2.5-32b", "A100", tp=2)):
        expected = [cost.decode_time(int(a), int(b), int(c)) for a, b, c in zip(n, ctx, k)]
        assert price_decode(cost, n, ctx, k).tolist() == expected


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31), wl_seed=st.integers(0, 5))
def test_lookup_many_answers_as_the_scalar_lookup(seed, wl_seed):
    """Exact, truncated, resampled (other steps, more samples than recorded, longer budgets) and global answers."""
    from lssim.traces.workload import lookup_many

    rng = np.random.default_rng(seed)
    wl = Workload(make_trace(rng, steps=3, prompts=5, group=3, max_len=200), seed=wl_seed)
    n = 300
    step, pid, sample = rng.integers(0, 7, n), rng.integers(-2, 8, n), rng.integers(0, 6, n)
    budget = np.where(rng.random(n) < 0.3, 200, rng.integers(1, 400, n))
    got = lookup_many(wl, step, pid, sample, budget)
    for j in range(n):
        want = wl.lookup(int(step[j]), int(pid[j]), int(sample[j]), int(budget[j]))
        assert (got[0][j], got[1][j], got[3][j], got[4][j]) == (want.length, want.finish_reason, want.source, want.row)
        assert got[2][j] == want.reward or (np.isnan(got[2][j]) and np.isnan(want.reward))


@pytest.mark.parametrize("policy", ["oracle", "ebs"])
def test_a_priority_hook_leaves_the_trained_members_in_the_order_they_were_made(policy):
    """A priority hook reorders a batch-route step's rows; the groups handed to the trainer must still list their
    members as the event route does (the train-time model packs micro-batches in that order)."""
    from lssim.analysis.replay import SimSetup, simulate

    trace = synthesize(get_preset("math7b").replace(steps=5, prompts_per_step=37, group_size=5, max_tokens=20000,
                                                     length_median=3000.0))
    wl = Workload(trace)
    setup = SimSetup(model="llama3-8b", n_instances=2, max_num_seqs=64, kv_capacity_tokens=60000)
    fast, slow = simulate(wl, policy, setup), simulate(wl, policy, setup, batch_route=False)
    pd.testing.assert_frame_equal(fast.steps, slow.steps)
    pd.testing.assert_frame_equal(fast.responses, slow.responses)
