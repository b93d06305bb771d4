"""Execution modes (lssim.loop.modes): the invariants in every mode, and what each mode does to a step's timing."""

import json

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lssim.sim.bounds import make_lower_bound
from lssim.loop.controller import Controller, RunConfig
from lssim.loop.modes import ModeConfig
from lssim.loop.policy import make_policy
from lssim.sim.trainer import SimTrainer, TrainTimeModel
from lssim.sim.world import EngineConfig, SimEngine
from lssim.traces.workload import Workload

from test_sim import COST, make_trace

# A train phase long enough to matter beside the rollout: 20 ms + 10 us per token, 5 ms sync.
TRAIN = TrainTimeModel(seconds_per_token=1e-5, fixed_seconds=0.02, sync_seconds=0.005)
MODES = [ModeConfig("collocated", 2), ModeConfig("disaggregated", 2, 2), ModeConfig("async", 2, 2, staleness=1),
         ModeConfig("async", 2, 2, staleness=2), ModeConfig("async", 2, 2, staleness=1, variant="areal"),
         ModeConfig("hybrid", 2, 2), ModeConfig("hybrid", 2, 1, elastic=False)]
POLICIES = ["baseline", "hadb", "oracle", "april", "april+breaker"]


def run(trace, mode: ModeConfig, policy="baseline", seqs=8, kv=10**7, seed=0):
    wl = Workload(trace, seed=seed)
    engine = SimEngine(wl, COST, EngineConfig(mode.rollout_devices, seqs, kv))
    n = len(wl.steps)
    cfg = RunConfig(steps=3 * n + 2, groups_per_step=wl.groups_per_step, group_size=wl.group_size, max_tokens=wl.max_tokens,
                    total_groups=wl.groups_in(n), seed=seed)
    ctl = Controller(engine, SimTrainer(engine, TRAIN, n_devices=mode.train_devices, collocated=mode.collocated), wl,
                     make_policy(policy), cfg, oracle_length=lambda s, p, k, b: wl.response(s, p, k, b).length,
                     mode=mode.build())
    ctl.lower_bound = make_lower_bound(engine.cost, mode.rollout_devices, seqs)
    res = ctl.run()
    res.meta["mode"] = {**vars(mode), "label": mode.label()} if hasattr(mode, "__dict__") else {}
    return res


traces = st.builds(
    lambda steps, prompts, group, seed, tail: make_trace(
        np.minimum(np.random.default_rng(seed).lognormal(3.5, tail, size=(steps, prompts, group)).astype(int) + 1, 300),
        max_tokens=300).assign(loop_start=-1, entropy_mean=0.6),  # labelled (no loops): breaker may read its signals
    steps=st.integers(1, 4), prompts=st.integers(1, 6), group=st.integers(1, 4), seed=st.integers(0, 10**6),
    tail=st.floats(0.2, 1.5))
FAST = settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(trace=traces, mode=st.sampled_from(MODES), policy=st.sampled_from(POLICIES), kv=st.sampled_from([400, 10**6]))
def test_every_response_accounted_for_in_every_mode(trace, mode, policy, kv):
    res = run(trace, mode, policy, kv=kv)
    s, r = res.steps, res.responses
    assert (s["responses_in"] == s["finished"] + s["truncated"] + s["policy_stopped"] + s["dropped"] + s["carried_out"]).all()
    assert len(r) == s["responses_in"].sum() - s["carried_in"].sum()  # every response ends exactly once
    assert not r.duplicated(["step", "prompt_id", "sample_idx"]).any()
    assert s["carried_out"].iloc[-1] == 0  # the run ends with nothing left in flight
    # staleness, as the step rows count it, is what the response rows say
    assert s["max_staleness"].max() >= 0


@FAST
@given(trace=traces, mode=st.sampled_from(MODES), policy=st.sampled_from(POLICIES))
def test_staleness_never_exceeds_the_modes_bound(trace, mode, policy):
    s = run(trace, mode, policy).steps
    carried = policy.startswith("april")  # partial rollouts add their own off-policy tokens in any mode
    if mode.mode == "async" and mode.variant == "roll":
        assert s["max_staleness"].max() <= mode.staleness
    elif mode.mode == "disaggregated" and not carried:
        assert s["max_staleness"].max() <= 1
    elif mode.mode in ("collocated", "hybrid") and not carried:
        assert s["max_staleness"].max() == 0


@FAST
@given(trace=traces, mode=st.sampled_from(MODES), policy=st.sampled_from(POLICIES), seed=st.integers(0, 3))
def test_same_seed_same_result_in_every_mode(trace, mode, policy, seed):
    a, b = run(trace, mode, policy, seed=seed), run(trace, mode, policy, seed=seed)
    pd.testing.assert_frame_equal(a.responses, b.responses)
    pd.testing.assert_frame_equal(a.steps, b.steps)


@FAST
@given(trace=traces)
def test_a_baseline_trains_the_same_tokens_in_every_mode_that_drops_nothing(trace):
    def trained(mode):
        r = run(trace, mode).responses
        t = r[r["trained"]]
        return sorted(zip(t["prompt_id"], t["response_len"])), t["exact"].all()

    reference, exact = trained(MODES[0])
    assert exact
    for mode in MODES[1:]:
        if mode.mode == "async" and mode.variant == "roll":
            continue  # ROLL's variant drops stale groups: other groups train in their place
        assert trained(mode) == (reference, True), mode.label()


@FAST
@given(trace=traces, mode=st.sampled_from(MODES), policy=st.sampled_from(["baseline", "hadb", "oracle"]),
       kv=st.sampled_from([400, 10**6]))
def test_no_rollout_is_shorter_than_its_lower_bound_in_any_mode(trace, mode, policy, kv):
    s = run(trace, mode, policy, kv=kv).steps
    assert (s["rollout_seconds"] >= s["lower_bound_seconds"] * (1 - 1e-9)).all()


@FAST
@given(trace=traces, mode=st.sampled_from(MODES))
def test_steps_tile_the_run_and_no_step_ends_before_its_training(trace, mode):
    s = run(trace, mode).steps
    assert s["step_seconds"].sum() == pytest.approx(s["train_end"].max())
    assert (s["train_end"] >= s["train_start"] - 1e-12).all() and (s["train_start"] >= s["rollout_end"] - 1e-12).all() or \
        mode.mode == "hybrid"  # hybrid's training starts during the rollout, on groups as they finish
    assert (s["train_end"] >= s["rollout_end"] - 1e-12).all()


# -- what each mode does ----------------------------------------------------------------------------

TRACE = make_trace([[[40, 60, 200, 50], [30, 40, 30, 20], [250, 20, 20, 20], [30, 30, 30, 30]]] * 6)  # 6 steps, 2 long groups


def test_collocated_is_rollout_then_train_and_on_policy():
    s = run(TRACE, MODES[0]).steps
    assert (s["max_staleness"] == 0).all() and (s["wait_seconds"] == 0).all()
    assert s["step_seconds"].to_numpy() == pytest.approx((s["rollout_seconds"] + s["train_seconds"]).to_numpy())


def test_disaggregated_overlaps_train_with_the_next_rollout_one_step_stale():
    col, dis = run(TRACE, MODES[0]).steps, run(TRACE, MODES[1]).steps
    assert dis["max_staleness"].tolist() == [0] + [1] * 5  # the first batch is generated by the first weights
    assert dis["weights_version"].tolist() == [0, 0, 1, 2, 3, 4]
    assert dis["step_seconds"].sum() < col["step_seconds"].sum()  # training hides behind the next rollout
    assert dis["step_seconds"].sum() >= max(dis["rollout_seconds"].sum(), dis["train_seconds"].sum())


def test_async_keeps_generating_and_interrupts_with_new_weights():
    res = run(TRACE, MODES[2])
    s, r = res.steps, res.responses
    assert s["carried_out"].iloc[:-1].sum() > 0  # unfinished responses ran on into the next step
    assert (r["policy_version_last"] > r["policy_version_first"]).any()  # new weights arrived mid-generation
    hist = {}
    for text in s["staleness_histogram"]:
        for k, v in json.loads(text).items():
            hist[int(k)] = hist.get(int(k), 0) + v
    assert max(hist) <= 1


def test_hybrid_streams_training_into_the_rollout():
    hyb, dis = run(TRACE, MODES[5]).steps, run(TRACE, MODES[1]).steps
    assert (hyb["max_staleness"] == 0).all()
    assert (hyb["train_start"] < hyb["rollout_end"]).any()  # groups trained while others still generate


def test_mode_config_refuses_what_cannot_be():
    with pytest.raises(ValueError, match="unknown mode"):
        ModeConfig("pipelined")
    with pytest.raises(ValueError, match="share the devices"):
        ModeConfig("collocated", 8, 4)
    with pytest.raises(ValueError, match="staleness"):
        ModeConfig("async", 8, 8, staleness=0)


def test_async_aborts_a_steps_stale_groups_in_one_call(monkeypatch):
    """ROLL's variant cancels the groups that would train too late (rollout_books.drop_stale): their members still
    generating are aborted in one call (a real engine's call into vLLM costs milliseconds), never one by one."""
    import sys

    from lssim.analysis.replay import SimSetup, simulate

    calls = []  # (the engine's method, who called it, how many requests)
    abort, abort_many = SimEngine.abort, SimEngine.abort_many

    def one(self, r):
        calls.append(("abort", sys._getframe(1).f_code.co_name, 1))
        return abort(self, r)

    def many(self, requests):
        calls.append(("abort_many", sys._getframe(1).f_code.co_name, len(requests)))
        return abort_many(self, requests)

    monkeypatch.setattr(SimEngine, "abort", one)
    monkeypatch.setattr(SimEngine, "abort_many", many)
    w = Workload(pd.read_parquet("traces/math7b.parquet"))
    result = simulate(w, "baseline", SimSetup(mode="async", train_devices=8, staleness=1, async_variant="roll"), steps=6)
    assert result.steps["dropped_stale"].sum() > 0
    from_drops = [(method, n) for method, caller, n in calls if caller == "drop_stale"]
    assert from_drops and all(method == "abort_many" for method, _ in from_drops)
    assert max(n for _, n in from_drops) > 1  # several members in the one call


def test_async_trains_a_batch_a_step_and_the_groups_completed_beyond_it_in_the_next():
    """AReaL's trainer takes batches of B finished groups: where more complete in the same instant (here every
    admitted group, all of one length), the ones beyond B wait whole for the next step, counted done in its rollout."""
    trace = make_trace(np.full((2, 4, 2), 50), max_tokens=300)  # 2 steps x 4 groups of 2, every response 50 tokens
    res = run(trace, ModeConfig("async", 2, 2, staleness=1))
    s, r = res.steps, res.responses
    assert (s["groups_trained"] <= 4).all() and s["groups_trained"].sum() == 8
    assert s["groups_trained"].iloc[0] == 4  # the gate let 2 batches in; both completed at once; one trained
    trained = r[r["trained"]]
    assert len(trained) == 16 and not trained.duplicated(["step", "prompt_id", "sample_idx"]).any()
    assert (s["max_staleness"] <= 1).all()


@FAST
@given(trace=traces, policy=st.sampled_from(POLICIES))
def test_async_never_trains_more_than_a_batch_in_a_step(trace, policy):
    res = run(trace, MODES[2], policy)
    assert (res.steps["groups_trained"] <= Workload(trace).groups_per_step).all()


@FAST
@given(steps=st.integers(2, 5), prompts=st.integers(2, 6), group=st.integers(1, 3), seed=st.integers(0, 10**6),
       staleness=st.integers(1, 2))
def test_roll_trains_no_token_staler_than_its_bound_when_groups_wait_a_step(steps, prompts, group, seed, staleness):
    """Responses that end at a few lengths (as the reference task's do) complete many groups in one instant; those
    beyond a batch wait a step, and ROLL's variant drops one that would then train too stale."""
    lengths = np.random.default_rng(seed).choice([20, 40, 60, 200], size=(steps, prompts, group))
    res = run(make_trace(lengths, max_tokens=300), ModeConfig("async", 2, 2, staleness=staleness))
    s = res.steps
    assert (s["max_staleness"] <= staleness).all()
    assert (s["groups_trained"] <= prompts).all()
    assert (s["responses_in"] == s["finished"] + s["truncated"] + s["policy_stopped"] + s["dropped"] + s["carried_out"]).all()
