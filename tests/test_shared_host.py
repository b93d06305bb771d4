"""The simulator on a shared host (lssim.sim.shared_host): the trainer beside the rollout and the driver's price.
The default twin (independent devices) stays bit-identical; a shared host is priced only where the setup says so."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from lssim.analysis.replay import SimSetup, simulate
from lssim.cost import ProfiledCostModel
from lssim.sim.shared_host import DriverCost, DriverPrice, ScaledCost, TrainingShare
from lssim.sim.training import ProfiledTrainCost
from lssim.traces.workload import Workload

from test_sim import make_trace

COST = ProfiledCostModel(c0=1e-3, c1=1e-5, c2=1e-9, p0=1e-4, p1=1e-6)
MODES = ("collocated", "disaggregated", "async", "hybrid")
FAST = settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
traces = st.builds(
    lambda steps, prompts, group, seed: make_trace(
        np.minimum(np.random.default_rng(seed).lognormal(3.5, 0.8, size=(steps, prompts, group)).astype(int) + 1, 200),
        max_tokens=200),
    steps=st.integers(2, 4), prompts=st.integers(2, 5), group=st.integers(2, 4), seed=st.integers(0, 10**6))


def _train():
    # a CPU trainer's fit (the shipped one): an update of tens of ms beside rollouts of tens of ms
    return ProfiledTrainCost.from_json("real_backend/data/profile_trainer_cpu.json")


def _run(trace, mode, **shared):
    setup = SimSetup(model="tiny-ref", n_instances=1, max_num_seqs=64, kv_capacity_tokens=10**6, profile=COST,
                     train=_train(), mode=mode, train_devices=None if mode == "collocated" else 1, **shared)
    return simulate(Workload(trace, seed=0), "baseline", setup)


@FAST
@given(trace=traces, mode=st.sampled_from(MODES))
def test_a_host_shared_at_no_cost_is_the_default_twin(trace, mode):
    plain = _run(trace, mode)
    free = _run(trace, mode, host_slowdown=(1.0,), shared_training=TrainingShare(1.0, 1.0), driver=DriverPrice())
    for col in ("step_seconds", "rollout_seconds", "train_end"):  # a repricing splits a span: the last bits may move
        np.testing.assert_allclose(plain.steps[col].to_numpy(), free.steps[col].to_numpy(), rtol=1e-12)
    assert plain.steps["groups_trained"].tolist() == free.steps["groups_trained"].tolist()


@FAST
@given(trace=traces, mode=st.sampled_from(MODES), engine=st.floats(1.0, 3.0), trainer=st.floats(1.0, 3.0),
       per_finish=st.floats(0, 2e-3))
def test_sharing_the_host_never_makes_a_run_faster_and_collocated_pays_only_the_driver(trace, mode, engine, trainer,
                                                                                      per_finish):
    plain = _run(trace, mode)
    shared = _run(trace, mode, shared_training=TrainingShare(engine, trainer))
    # async's roll variant drops a group once it would train too stale: a slower host can drop one the plain run
    # trained, and end sooner for training less; the claim is about the same work
    assume(shared.steps["dropped"].sum() == plain.steps["dropped"].sum())
    assert shared.steps["train_end"].iloc[-1] >= plain.steps["train_end"].iloc[-1] - 1e-9
    if mode == "collocated":  # no priced job beside a rollout: nothing to share
        np.testing.assert_array_equal(plain.steps["step_seconds"].to_numpy(), shared.steps["step_seconds"].to_numpy())
    driven = _run(trace, mode, driver=DriverPrice(per_finish=per_finish))
    assert driven.steps["rollout_seconds"].sum() >= plain.steps["rollout_seconds"].sum() - 1e-9


def test_a_job_beside_the_rollout_runs_slower_by_the_trainers_factor_and_slows_the_rollout_it_overlaps():
    trace = make_trace(np.full((3, 4, 4), 150), max_tokens=200)
    plain = _run(trace, "disaggregated").steps
    only_trainer = _run(trace, "disaggregated", shared_training=TrainingShare(1.0, 2.0)).steps
    # the job is priced as if the engine decoded throughout it: twice its time alone; the run's last step's job has
    # no rollout beside it (the run ends) and takes its time alone, as a real run's last update does
    np.testing.assert_allclose((only_trainer["train_end"] - only_trainer["train_start"]).to_numpy(),
                               [2, 2, 1] * (plain["train_end"] - plain["train_start"]).to_numpy())
    both = _run(trace, "disaggregated", shared_training=TrainingShare(1.5, 1.0)).steps
    # step 0's rollout has no job beside it; step 1's overlaps step 0's job, and is slower by at most 1.5x
    assert both["rollout_seconds"].iloc[0] == pytest.approx(plain["rollout_seconds"].iloc[0])
    assert plain["rollout_seconds"].iloc[1] < both["rollout_seconds"].iloc[1] <= 1.5 * plain["rollout_seconds"].iloc[1] + 1e-9
    # step 1's rollout starts with step 0's job: over the job the engine does 1 / 1.5 of its work, after it all of it
    # (off by at most an iteration at each of the job's two boundaries)
    job, work = plain["train_end"].iloc[0] - plain["train_start"].iloc[0], plain["rollout_seconds"].iloc[1]
    assert both["rollout_start"].iloc[1] == pytest.approx(both["train_start"].iloc[0])
    expected = 1.5 * work if job / 1.5 >= work else job + (work - job / 1.5)
    assert both["rollout_seconds"].iloc[1] == pytest.approx(expected, rel=0.02)


def test_the_driver_price_is_charged_per_request_per_token_and_per_finish():
    trace = make_trace(np.full((1, 2, 4), 100), max_tokens=200)
    plain = _run(trace, "collocated").steps["rollout_seconds"].iloc[0]
    # 8 requests on one instance, 100 tokens each: per token streamed 800 x, per request submitted 8 x
    per_token = _run(trace, "collocated", driver=DriverPrice(per_token=1e-5)).steps["rollout_seconds"].iloc[0]
    assert per_token - plain == pytest.approx(800 * 1e-5, rel=1e-6)
    per_request = _run(trace, "collocated", driver=DriverPrice(per_request=1e-3)).steps["rollout_seconds"].iloc[0]
    assert per_request - plain == pytest.approx(8 * 1e-3, rel=1e-6)
    # all 8 finish at one boundary, the batch's last: nothing left to re-pack, so a finish there costs nothing
    per_finish = _run(trace, "collocated", driver=DriverPrice(per_finish=1e-3)).steps["rollout_seconds"].iloc[0]
    assert per_finish == pytest.approx(plain)
    staggered = make_trace(np.array([[[50, 100, 100, 100], [100, 100, 100, 100]]]), max_tokens=200)
    before = _run(staggered, "collocated").steps["rollout_seconds"].iloc[0]
    after = _run(staggered, "collocated", driver=DriverPrice(per_finish=1e-3)).steps["rollout_seconds"].iloc[0]
    assert after - before == pytest.approx(1e-3, rel=1e-6)  # the one that left early


@given(n=st.integers(1, 64), ctx=st.integers(0, 10**5), seconds=st.floats(0, 5), per_token=st.floats(0, 1e-3),
       scale=st.floats(0.5, 3))
def test_driver_cost_iterations_within_inverts_its_decode_time(n, ctx, seconds, per_token, scale):
    cost = DriverCost(COST, scale, DriverPrice(per_token=per_token))
    k = cost.iterations_within(n, ctx, seconds)
    assert cost.decode_time(n, ctx, k) <= seconds < cost.decode_time(n, ctx, k + 1)
    assert cost.decode_time(n, ctx, k) == pytest.approx(ScaledCost(COST, scale).decode_time(n, ctx, k) + per_token * n * k)


def test_bad_sharing_factors_and_prices_are_refused_naming_the_field():
    with pytest.raises(ValueError, match="TrainingShare.engine_slowdown"):
        TrainingShare(0.0, 1.0)
    with pytest.raises(ValueError, match="DriverPrice.per_token"):
        DriverPrice(per_token=-1.0)
    with pytest.raises(ValueError, match="SimSetup.shared_training"):
        SimSetup(shared_training=(1.2, 1.3))


@FAST
@given(trace=traces, first=st.floats(0, 0.5), per_step=st.floats(0, 0.5))
def test_the_driver_between_steps_lengthens_each_collocated_step_by_its_price_and_leaves_the_rollouts(trace, first,
                                                                                                    per_step):
    plain = _run(trace, "collocated").steps
    priced = _run(trace, "collocated", driver=DriverPrice(per_step=per_step, first_step=first)).steps
    # the driver works before each rollout starts: the rollouts are the same, each step longer by its gap
    np.testing.assert_allclose(priced["rollout_seconds"].to_numpy(), plain["rollout_seconds"].to_numpy(), rtol=1e-9)
    gaps = np.r_[first, np.full(len(plain) - 1, per_step)]
    np.testing.assert_allclose((priced["step_seconds"] - plain["step_seconds"]).to_numpy(), gaps, atol=1e-9)
    np.testing.assert_allclose(priced["rollout_start"].to_numpy(), plain["rollout_start"].to_numpy() + np.cumsum(gaps),
                               atol=1e-9)


def test_the_driver_between_steps_is_off_the_rollout_when_training_runs_beside_it():
    trace = make_trace(np.full((3, 4, 4), 150), max_tokens=200)
    plain = _run(trace, "disaggregated").steps
    priced = _run(trace, "disaggregated", driver=DriverPrice(per_step=0.05, first_step=0.2)).steps
    np.testing.assert_allclose(priced["rollout_seconds"].to_numpy(), plain["rollout_seconds"].to_numpy(), rtol=1e-9)
    assert priced["rollout_start"].iloc[0] == pytest.approx(0.2)
    # the next rollout starts once the driver is done with the last one's step, and then waits for its weights (one
    # step old) where they are not ready: the driver's seconds overlap that wait
    np.testing.assert_allclose(priced["rollout_start"].iloc[1:].to_numpy(), priced["rollout_end"].iloc[:-1].to_numpy()
                               + 0.05 + priced["wait_seconds"].iloc[1:].to_numpy(), atol=1e-9)
    assert priced["wait_seconds"].sum() < plain["wait_seconds"].sum()


@pytest.mark.parametrize("mode", ["disaggregated", "async"])
def test_the_drivers_seconds_between_steps_hold_a_job_on_the_host_it_shares_and_no_job_on_devices_of_their_own(mode):
    trace = make_trace(np.full((3, 4, 4), 150), max_tokens=200)
    share = TrainingShare(1.0, 1.0)  # sharing at no cost: only the driver's hold moves a job

    def updates(**shared):
        steps = _run(trace, mode, **shared).steps
        return (steps["train_end"] - steps["train_start"]).to_numpy()

    apart = updates(driver=DriverPrice(per_step=0.05))
    np.testing.assert_allclose(updates(shared_training=share, driver=DriverPrice(per_step=0.0)), apart, atol=1e-9)
    # every job starts with the rollout's end, and its work once the driver's seconds between steps are past
    np.testing.assert_allclose(updates(shared_training=share, driver=DriverPrice(per_step=0.05)), apart + 0.05,
                               atol=1e-9)
