"""The simulated world and the shared controller: small scenarios that assert what happened, and
hypothesis properties for the invariants (books balance, determinism, the lower bound)."""

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lssim.sim.bounds import make_lower_bound
from lssim.loop.controller import Controller, RunConfig
from lssim.loop.core import GroupSpec
from lssim.cost import ProfiledCostModel, solo_decode_time
from lssim.loop.policy import Action, Policy, make_policy
from lssim.sim.trainer import SimTrainer, TrainTimeModel
from lssim.sim.world import EngineConfig, SimEngine
from lssim.traces.workload import Workload

# 1 ms + 10 us per running sequence + 1 ns per context token per iteration; prefill 0.1 ms + 1 us/token.
COST = ProfiledCostModel(c0=1e-3, c1=1e-5, c2=1e-9, p0=1e-4, p1=1e-6)
NO_TRAIN = TrainTimeModel(seconds_per_token=0.0, fixed_seconds=0.0, sync_seconds=0.0)


def make_trace(lengths, prompt_len=16, max_tokens=None, rewards=None):
    """A trace from an array lengths[step, prompt, sample]."""
    lengths = np.asarray(lengths)
    steps, prompts, group = lengths.shape
    max_tokens = max_tokens or int(lengths.max())
    s, p, k = np.meshgrid(np.arange(steps), np.arange(prompts), np.arange(group), indexing="ij")
    flat = lengths.ravel()
    reward = np.asarray(rewards).ravel() if rewards is not None else (flat % 2).astype(float)
    return pd.DataFrame({
        "step": s.ravel(), "prompt_id": p.ravel(), "sample_idx": k.ravel(), "prompt_len": prompt_len,
        "response_len": np.minimum(flat, max_tokens), "reward": np.where(flat >= max_tokens, 0.0, reward),
        "finish_reason": np.where(flat >= max_tokens, "length", "stop"), "max_tokens": max_tokens,
    })


def run(trace, policy="baseline", n_instances=2, max_num_seqs=64, kv=10**7, seed=0, steps=None, train=NO_TRAIN,
        batch_route=True):
    wl = Workload(trace, seed=seed)
    engine = SimEngine(wl, COST, EngineConfig(n_instances, max_num_seqs, kv), batch_route=batch_route)
    n_steps = steps or len(wl.steps)
    cfg = RunConfig(steps=2 * n_steps, groups_per_step=wl.groups_per_step, group_size=wl.group_size, max_tokens=wl.max_tokens,
                    total_groups=n_steps * wl.groups_per_step, seed=seed)
    policy = make_policy(policy) if isinstance(policy, str) else policy
    ctl = Controller(engine, SimTrainer(engine, train), wl, policy, cfg,
                     oracle_length=lambda st_, pid, sidx, b: wl.response(st_, pid, sidx, b).length)
    # Priced with the engine's cost model once the controller has set the policy's execution features up
    # (speculation wraps it), as lssim.analysis.replay.simulate does.
    ctl.lower_bound = make_lower_bound(engine.cost, n_instances, max_num_seqs)
    return ctl.run(), engine


# -- tiny scenarios ------------------------------------------------------------------------------

def test_one_sequence_alone_takes_its_solo_time():
    res, _ = run(make_trace([[[100]]]), n_instances=1)
    assert res.steps["rollout_seconds"].iloc[0] == pytest.approx(solo_decode_time(COST, 16, 100))
    assert res.responses["response_len"].tolist() == [100]


def test_one_slot_takes_the_sum_of_solo_times():
    lengths = [[[50, 10, 30], [70, 5, 1]]]
    res, _ = run(make_trace(lengths), n_instances=1, max_num_seqs=1)
    expected = sum(solo_decode_time(COST, 16, n) for n in np.ravel(lengths))
    assert res.steps["rollout_seconds"].iloc[0] == pytest.approx(expected)


def test_batched_sequences_finish_in_length_order_and_share_iterations():
    res, _ = run(make_trace([[[30, 10, 20]]]), n_instances=1)
    r = res.responses.sort_values("finish_time")
    assert r["response_len"].tolist() == [10, 20, 30]
    # All three run together for 10 iterations, two for the next 10, one for the last 10.
    t = COST.prefill_time(48) + COST.decode_time(3, 48, 10)
    assert r["finish_time"].iloc[0] == pytest.approx(t)
    t += COST.decode_time(2, 16 * 2 + 20 + 30 - 20, 10)  # contexts at iteration 10: 16+10 and 16+10 after the first left
    assert r["finish_time"].iloc[1] == pytest.approx(t, rel=1e-3)


def test_kv_overflow_preempts_and_still_finishes_everything():
    trace = make_trace([[[200] * 8]], max_tokens=400)
    res, engine = run(trace, n_instances=1, kv=1000)
    assert engine.preemptions > 0
    assert (res.responses["response_len"] == 200).all() and (res.responses["finish_reason"] == "stop").all()


def test_request_larger_than_the_cache_is_refused_clearly():
    with pytest.raises(ValueError, match="KV tokens"):
        run(make_trace([[[500]]]), n_instances=1, kv=100)


def test_truncation_and_resampling_are_counted():
    trace = make_trace(np.arange(1, 1 + 2 * 3 * 4).reshape(2, 3, 4) * 10)

    class Budget(Policy):
        name = "budget"

        def plan(self, ctx, proposal):
            return [GroupSpec(g.prompt_id, g.n_samples + 2, 100) for g in proposal]

    res, engine = run(trace, Budget(), n_instances=1)
    assert engine.sources["truncated"] > 0 and engine.sources["resampled"] == 2 * 3 * 2
    assert res.responses["response_len"].max() == 100
    assert (res.responses.loc[res.responses["finish_reason"] == "length", "reward"] == 0).all()


def test_policy_stop_and_carry_are_booked():
    trace = make_trace([[[300, 20, 20, 20]]] * 3)

    class StopLong(Policy):
        name = "stop_long"
        progress_interval = 50

        def on_progress(self, request, state):
            if request.generated >= 100:
                return Action.stop("too long", reward=-1.0)
            return Action.carry("pause") if request.step == 0 and request.generated >= 50 else None

    res, _ = run(trace, StopLong(), n_instances=1)
    s = res.steps
    assert (s["responses_in"] == s["finished"] + s["truncated"] + s["policy_stopped"] + s["dropped"] + s["carried_out"]).all()
    assert s["carried_out"].iloc[0] == 1 and s["carried_in"].iloc[1] == 1
    stopped = res.responses[res.responses["finish_reason"] == "policy_stop"]
    assert len(stopped) == 3 and (stopped["reward"] == -1.0).all() and (stopped["stop_reason"] == "too long").all()
    assert (stopped["response_len"] == 100).all()
    carried = stopped[stopped["step"] == 0].iloc[0]
    assert carried["policy_version_first"] == 0 and carried["policy_version_last"] == 1 and carried["tokens_before_resume"] == 50


def test_train_phase_advances_the_clock():
    res, _ = run(make_trace([[[10, 10]]] * 2), train=TrainTimeModel(seconds_per_token=0.0, fixed_seconds=5.0, sync_seconds=1.0))
    assert res.steps["train_seconds"].tolist() == pytest.approx([6.0, 6.0])
    assert res.responses["submit_time"].max() == pytest.approx(0.0)  # relative to each step's start


# -- properties ----------------------------------------------------------------------------------

traces = st.builds(
    lambda steps, prompts, group, seed, tail: make_trace(
        np.minimum(np.random.default_rng(seed).lognormal(3.5, tail, size=(steps, prompts, group)).astype(int) + 1, 400),
        max_tokens=400),
    steps=st.integers(1, 3), prompts=st.integers(1, 6), group=st.integers(1, 4), seed=st.integers(0, 10**6),
    tail=st.floats(0.2, 1.5))
POLICIES = ["baseline", "hadb", "oracle", "hadb+oracle"]
FAST = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(trace=traces, policy=st.sampled_from(POLICIES), instances=st.integers(1, 3), seqs=st.integers(1, 8),
       kv=st.sampled_from([500, 2000, 10**6]))
def test_every_response_accounted_for_exactly_once(trace, policy, instances, seqs, kv):
    res, _ = run(trace, policy, n_instances=instances, max_num_seqs=seqs, kv=kv)
    s, r = res.steps, res.responses
    assert (s["responses_in"] == s["finished"] + s["truncated"] + s["policy_stopped"] + s["dropped"] + s["carried_out"]).all()
    assert not r.duplicated(["step", "prompt_id", "sample_idx"]).any()
    assert len(r) == s["responses_in"].sum() - s["carried_in"].sum()
    assert s["groups_trained"].sum() == res.steps["groups_trained"].sum() == len(r.groupby("group_id"))


@FAST
@given(trace=traces, policy=st.sampled_from(POLICIES), seed=st.integers(0, 3))
def test_same_seed_same_result(trace, policy, seed):
    a, _ = run(trace, policy, seed=seed)
    b, _ = run(trace, policy, seed=seed)
    pd.testing.assert_frame_equal(a.responses, b.responses)
    pd.testing.assert_frame_equal(a.steps, b.steps)


@FAST
@given(trace=traces, policy=st.sampled_from(POLICIES), instances=st.integers(1, 3), seqs=st.integers(1, 8),
       kv=st.sampled_from([500, 2000, 10**6]))
def test_no_step_is_shorter_than_its_lower_bound(trace, policy, instances, seqs, kv):
    res, _ = run(trace, policy, n_instances=instances, max_num_seqs=seqs, kv=kv)
    s = res.steps
    assert (s["rollout_seconds"] >= s["lower_bound_seconds"] * (1 - 1e-9)).all()


@FAST
@given(trace=traces, instances=st.integers(1, 3), batch_route=st.booleans())
def test_the_trace_says_which_instance_each_response_ran_on(trace, instances, batch_route):
    """The baseline pins nothing: the engine's dispatcher chooses, and the trace records its choice (not -1)."""
    r = run(trace, n_instances=instances, max_num_seqs=8, batch_route=batch_route)[0].responses
    assert r["instance"].between(0, instances - 1).all()
    first = r[r["step"] == r["step"].min()]
    assert first["instance"].nunique() == min(instances, len(first))  # an idle cluster spreads its first requests


@FAST
@given(trace=traces, instances=st.integers(1, 3))
def test_more_instances_never_make_the_oracle_slower(trace, instances):
    few, _ = run(trace, "oracle", n_instances=instances, max_num_seqs=4)
    more, _ = run(trace, "oracle", n_instances=instances + 1, max_num_seqs=4)
    assert more.steps["rollout_seconds"].sum() <= few.steps["rollout_seconds"].sum() * (1 + 1e-9)


# -- departures: what a batch costs when its members leave -----------------------------------------

DEPARTING = ProfiledCostModel(c0=2e-3, c1=3e-5, c2=3e-7, c3=2e-7, p0=3e-3, p1=2e-5, f0=1e-3, f1=2e-4)


@settings(max_examples=60, deadline=None)
@given(lengths=st.lists(st.integers(1, 60), min_size=1, max_size=24), prompt_len=st.integers(1, 40))
def test_a_batch_takes_what_its_features_say(lengths, prompt_len):
    """The profiler fits coefficients to batch makespans through `batch_features`; that fit means something
    only if the simulator runs a batch exactly as the features price it (departures included)."""
    trace = make_trace([[lengths]], prompt_len=prompt_len, max_tokens=61)  # none at the cap: every length is exact
    wl = Workload(trace, seed=0)
    engine = SimEngine(wl, DEPARTING, EngineConfig(1, 256, 10**7))
    ctl = Controller(engine, SimTrainer(engine, NO_TRAIN), wl, make_policy("baseline"),
                     RunConfig(steps=1, groups_per_step=1, group_size=len(lengths), max_tokens=61, seed=0))
    res = ctl.run()
    assert res.steps["rollout_seconds"].iloc[0] == pytest.approx(DEPARTING.makespan(lengths, prompt_len), rel=1e-9)
    assert res.steps["busy_fraction"].iloc[0] <= 1 + 1e-9  # a departure that empties the batch costs nothing


def test_departures_at_one_boundary_cost_once():
    # two finishing at 10 and two at 20: one departure of two sequences at iteration 10 (the last ends the batch)
    together = DEPARTING.makespan([10, 10, 20, 20], 8) - ProfiledCostModel(**{**DEPARTING.coefficients, "f0": 0, "f1": 0}).makespan([10, 10, 20, 20], 8)
    assert together == pytest.approx(DEPARTING.departure_time(2))


@pytest.mark.parametrize("policy", ["april", "seer(chunk=8)", "segment(window=16)", "rollpacker"])
def test_departures_keep_busy_within_the_rollout(policy):
    """Aborts at a rollout's end leave an empty batch: nothing to re-pack, no busy time past the step."""
    rng = np.random.default_rng(3)
    trace = make_trace(rng.integers(1, 60, size=(4, 8, 4)), max_tokens=61)
    wl = Workload(trace, seed=0)
    engine = SimEngine(wl, DEPARTING, EngineConfig(2, 64, 10**7))
    cfg = RunConfig(steps=4, groups_per_step=8, group_size=4, max_tokens=61, seed=0)
    res = Controller(engine, SimTrainer(engine, NO_TRAIN), wl, make_policy(policy), cfg).run()
    assert (res.steps["busy_fraction"] <= 1 + 1e-9).all()


def test_no_busy_time_before_any_time_passes():
    """An admission charges its whole prefill at once; until the clock gets there, none of it has been spent
    (a rollout that ends earlier, aborting the prefilling requests, must not count it)."""
    from lssim.loop.core import Request

    wl = Workload(make_trace([[[50, 60]]], prompt_len=1000, max_tokens=61), seed=0)
    engine = SimEngine(wl, ProfiledCostModel(c0=1e-3, c1=1e-5, c2=1e-9, p0=0.5, p1=1e-3), EngineConfig(1, 64, 10**7))
    engine.submit([Request(rid=i, group_id=0, step=0, prompt_id=0, sample_idx=i, prompt_len=1000, max_tokens=61) for i in range(2)])
    assert engine.utilization() == (0.0, 0.0)
    engine.next_events()  # the first finish: prefill and 50 iterations have passed, all of it busy
    busy, _ = engine.utilization()
    assert busy == pytest.approx(engine.now())


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lengths=st.lists(st.integers(5, 300), min_size=16, max_size=16), a1=st.sampled_from([1e-4, 2e-4, 1e-3]))
def test_each_abort_blocks_the_caller_for_the_profiles_abort_time(lengths, a1):
    """A rollout that ends with requests running (april: carried) pays a1 seconds per request it aborts before its step
    can end; the engine runs on meanwhile (the requests aborted last carry a few more tokens, as on vLLM), so later
    steps move a little, but the first step's decisions are the same and its rollout is exactly that much longer."""
    import dataclasses

    trace = make_trace(np.array(lengths).reshape(2, 2, 4), max_tokens=300)

    def with_abort(a):
        c = COST.coefficients
        model = ProfiledCostModel(**c, abort_seconds=a)
        wl = Workload(trace, seed=0)
        engine = SimEngine(wl, model, EngineConfig(1, 64, 10**7))
        cfg = RunConfig(steps=4, groups_per_step=2, group_size=4, max_tokens=300, total_groups=6, seed=0)
        return Controller(engine, SimTrainer(engine, NO_TRAIN), wl, make_policy("april"), cfg).run().steps

    plain, charged = with_abort(0.0), with_abort(a1)
    first, again = plain.iloc[0], charged.iloc[0]
    assert again["carried_out"] == first["carried_out"] and again["finished"] == first["finished"]
    assert again["tokens"] >= first["tokens"]  # generated while the caller was blocked
    aborted = first["carried_out"] + first["dropped"]
    assert again["rollout_seconds"] - first["rollout_seconds"] == pytest.approx(a1 * aborted, abs=1e-12)
    assert ProfiledCostModel(**COST.coefficients).abort_time(5) == 0.0
