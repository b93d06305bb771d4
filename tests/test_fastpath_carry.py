"""end_rollout over a whole schedule (lssim.loop.rollout_cut, Policy.end_rollout_at) against the event engine.

A run of april or rollpacker is made on the event engine; before each step, the controller and its engine are copied, and the copy
runs the step's submission (carried responses first, with their tokens so far, then the plan's) to its end on the
batch route (lssim.sim.fastsim.run_batch). The policy's array form must cut that schedule at the very boundary where
the event engine's rollout ended: the same responses ended by then, at the same time to the last bit.
"""

import copy

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lssim.loop.columns import RequestColumns
from lssim.loop.rollout_cut import rollout_progress
from lssim.sim.fastsim import run_batch_boundaries
from lssim.loop.controller import Controller, RunConfig
from lssim.loop.modes import ModeConfig
from lssim.loop.policy import make_policy
from lssim.sim.trainer import SimTrainer
from lssim.sim.world import EngineConfig, SimEngine
from lssim.traces.workload import OracleLengths, Workload
from lssim.cost import ProfiledCostModel
from test_fastpath import PROFILED, ROOFLINE, TRAIN, assert_same_runs, make_trace, run

SLOW_ABORTS = ProfiledCostModel(c0=1e-3, c1=1e-5, c2=1e-9, p0=1e-4, p1=1e-6, f0=2e-4, f1=3e-5, abort_seconds=1e-3)

ENDING = ["april", "april(over_provision=1.5, max_carry_steps=1)", "april(over_provision=3.0, max_carry_steps=2)",
          "rollpacker", "rollpacker(ratio=2.0)", "rollpacker+april"]
ROUTED = ENDING + ["lpt+april"]  # lpt places and orders the submission: the cut route, not scheduled_cut, asks it


def scheduled_cut(ctl, step: int) -> tuple[set[int], float, bool]:
    """On a copy of the controller and its engine: the step's submission run whole on the batch route, cut where the
    policy's end_rollout_at says; (the rids ended by the cut, the rollout's seconds, whether it was cut)."""
    ctl = copy.deepcopy(ctl)
    s = ctl._start_step(step)
    ctx, proposal = ctl._proposal(s)
    fresh = ctl._make_requests(ctl._admit(ctl.policy.plan(ctx, proposal), s), s)
    carried = [r for r in s.carried_in if not r.done]
    submission = RequestColumns.concat([RequestColumns.of(carried), fresh]) if carried else fresh
    progress = rollout_progress(submission, *run_batch_boundaries(ctl.engine, submission))
    cut = ctl.policy.end_rollout_at(progress)
    # the event route asks end_rollout only while something is still in flight
    cut = cut if 0 <= cut and progress.boundary_end[cut] < len(submission) else -1
    if cut < 0:
        return set(progress.ended.rid.tolist()), float(progress.time[-1]) - s.started if len(progress) else 0.0, False
    return set(progress.ended.rid[:progress.boundary_end[cut]].tolist()), float(progress.time[cut]) - s.started, True


def event_step(ctl: Controller, step: int) -> tuple[set[int], float]:
    """The event route's step: (the rids that ended in its rollout before what still ran was settled, its rollout's
    seconds)."""
    ended = set()

    def settle(s):
        ended.update(r.rid for r in s.ended)
        Controller._settle_unfinished(ctl, s)

    ctl._settle_unfinished = settle
    row = ctl.run_step(step)
    del ctl._settle_unfinished
    return ended, row["rollout_seconds"]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31), prompts=st.integers(1, 6), group=st.integers(1, 4), max_len=st.integers(1, 300),
       n_instances=st.integers(1, 3), max_num_seqs=st.integers(1, 8), slack=st.integers(0, 400),
       policy=st.sampled_from(ENDING), cost=st.sampled_from([PROFILED, ROOFLINE]))
def test_end_rollout_cuts_the_whole_schedule_where_the_event_engine_ends_its_rollout(
        seed, prompts, group, max_len, n_instances, max_num_seqs, slack, policy, cost):
    trace = make_trace(np.random.default_rng(seed), 4, prompts, group, max_len)
    kv = int(trace["prompt_len"].max() + trace["max_tokens"].max()) + slack  # a request may ask the run's budget
    ctl = controller(trace, policy, cost, n_instances, max_num_seqs, kv)
    for step in range(ctl.config.steps):
        if ctl.groups_trained >= ctl.config.total_groups and not ctl.carried:
            break
        ended, seconds, _ = scheduled_cut(ctl, step)
        assert (ended, seconds) == event_step(ctl, step)


@pytest.mark.parametrize("policy", ["april(max_carry_steps=2)", "rollpacker(ratio=2.0)"])
def test_runs_are_cut_mid_rollout(policy):
    """The copies above are cut mid-rollout, and april's resume carried responses (the test is not vacuous)."""
    trace = make_trace(np.random.default_rng(5), 4, 6, 4, 300)
    ctl = controller(trace, policy, ROOFLINE, 2, 4, 2000)
    cuts = carried_in = 0
    for step in range(4):
        carried_in += len(ctl.carried)
        ended, seconds, was_cut = scheduled_cut(ctl, step)
        cuts += was_cut
        assert (ended, seconds) == event_step(ctl, step)
    assert cuts >= 2 and (carried_in > 0 or not policy.startswith("april"))


def controller(trace: pd.DataFrame, policy: str, cost, n_instances: int, max_num_seqs: int, kv: int) -> Controller:
    """test_fastpath.run's controller on the event engine (collocated), not yet run."""
    wl = Workload(trace)
    engine = SimEngine(wl, cost, EngineConfig(n_instances, max_num_seqs, kv), batch_route=False)
    n_steps = len(wl.steps)
    cfg = RunConfig(steps=2 * n_steps, groups_per_step=wl.groups_per_step, group_size=wl.group_size,
                    max_tokens=wl.max_tokens, total_groups=wl.groups_in(n_steps), seed=3)
    modes = ModeConfig(mode="collocated", rollout_devices=n_instances, train_devices=n_instances)
    return Controller(engine, SimTrainer(engine, TRAIN, n_devices=n_instances, collocated=True), wl, make_policy(policy),
                      cfg, mode=modes.build(), oracle_length=OracleLengths(wl))


def assert_same_cut_run(trace, policy, cost, n_instances, max_num_seqs, kv, mode="collocated"):
    """The run on the cut route (lssim.sim.cut_route) and on the event engine alone: the same frames and counters."""
    slow, slow_engine = run(trace, policy, cost, n_instances, max_num_seqs, kv, mode, batch_route=False)
    fast, fast_engine = run(trace, policy, cost, n_instances, max_num_seqs, kv, mode, batch_route=True)
    assert fast_engine._cut and not slow_engine._cut
    assert_same_runs(fast, fast_engine, slow, slow_engine)
    return fast, fast_engine


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31), steps=st.integers(1, 4), prompts=st.integers(1, 6), group=st.integers(1, 4),
       max_len=st.integers(1, 300), n_instances=st.integers(1, 3), max_num_seqs=st.integers(1, 8),
       slack=st.integers(0, 400), policy=st.sampled_from(ROUTED), cost=st.sampled_from([PROFILED, ROOFLINE]),
       mode=st.sampled_from(["collocated", "disaggregated"]))
def test_the_cut_route_equals_the_event_engine(seed, steps, prompts, group, max_len, n_instances, max_num_seqs, slack,
                                               policy, cost, mode):
    """(async interrupts rollouts and hybrid streams groups to training as they end: both stay on the event route)"""
    trace = make_trace(np.random.default_rng(seed), steps, prompts, group, max_len)
    kv = int(trace["prompt_len"].max() + trace["max_tokens"].max()) + slack  # a request may ask the run's budget
    assert_same_cut_run(trace, policy, cost, n_instances, max_num_seqs, kv, mode)


@pytest.mark.parametrize("kv, cost", [(100_000, ROOFLINE), (100_000, SLOW_ABORTS), (700, ROOFLINE)])
def test_the_cut_route_cuts_and_falls_back_where_it_must(monkeypatch, kv, cost):
    """Steps cut mid-rollout on the cut route (aborts that cost the caller time too: SimEngine.abort runs them); a
    schedule that preempts (a small cache) is left to the event engine for that step; the frames equal throughout."""
    import lssim.sim.cut_route as cut_route

    seen = {"cut": 0, "whole": 0, "event": 0}
    real = cut_route.run_cut

    def counted(engine, requests, columns, cut_at):
        ended = real(engine, requests, columns, cut_at)
        seen["event" if ended is None else "cut" if len(ended) < len(requests) else "whole"] += 1
        return ended

    monkeypatch.setattr(cut_route, "run_cut", counted)
    trace = make_trace(np.random.default_rng(7), 4, 6, 4, 300)
    assert_same_cut_run(trace, "april(max_carry_steps=2)", cost, 2, 4, kv)
    if kv < 1000:
        assert seen["event"] > 0, seen
    else:
        assert seen["cut"] >= 2 and seen["event"] == 0, seen
