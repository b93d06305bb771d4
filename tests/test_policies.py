"""Policies: the composition rules, HADB's decisions, the oracle, loading by name, check_policy."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lssim.loop.checks import PolicyCheckError, check_policy
from lssim.loop.core import GroupSpec, PromptPool, StepContext
from lssim.loop.policy import CARRY, DROP, Action, Compose, Policy, StepOutcome, available_policies, make_policy


def ctx(step=0, pool_size=40, groups=4, max_tokens=1000, rng_seed=0):
    ids = np.arange(pool_size)
    return StepContext(step=step, groups_per_step=groups, group_size=2, max_tokens=max_tokens, groups_left=10**6, carried_groups=0,
                       pool=PromptPool(ids, np.full(pool_size, 10)), rng=np.random.default_rng(rng_seed))


def outcome(step, lengths: dict, rewards: dict | None = None):
    pids = np.repeat(list(lengths), 2)
    lens = np.repeat(list(lengths.values()), 2)
    rew = np.repeat([rewards.get(p, 1.0) if rewards else 1.0 for p in lengths], 2)
    return StepOutcome(step, pids, np.tile([0, 1], len(lengths)), lens, np.full(len(pids), 1000), rew.astype(float),
                       np.array(["stop"] * len(pids), dtype=object), 1.0, np.array(list(lengths)))


class Stopper(Policy):
    name = "stopper"
    progress_interval = 10

    def on_progress(self, request, state):
        return Action.stop("s")


class Carrier(Policy):
    name = "carrier"
    progress_interval = 5

    def on_progress(self, request, state):
        return Action.carry()

    def on_unfinished(self, request):
        return CARRY


class Doubler(Policy):
    name = "doubler"

    def plan(self, ctx, proposal):
        return [GroupSpec(g.prompt_id, g.n_samples * 2, g.max_tokens) for g in proposal]


class Halver(Policy):
    name = "halver"

    def plan(self, ctx, proposal):
        return [GroupSpec(g.prompt_id, g.n_samples, g.max_tokens // 2) for g in proposal]


def test_composition_rules():
    both = Carrier() + Stopper()
    assert isinstance(both, Compose) and both.name == "carrier+stopper"
    assert both.progress_interval == 5  # the finest interval any member asks for
    assert both.on_progress(None, None).kind == "stop"  # stop beats carry, whatever the order
    assert (Stopper() + Carrier()).on_progress(None, None).kind == "stop"
    assert both.on_unfinished(None) == CARRY and Compose([Stopper()]).on_unfinished(None) == DROP
    plan = (Doubler() + Halver()).plan(ctx(), [GroupSpec(1, 2, 1000)])
    assert (plan[0].n_samples, plan[0].max_tokens) == (4, 500)  # plans chain left to right
    assert not Compose([Doubler()]).overrides("on_progress") and Compose([Doubler()]).overrides("plan")
    assert len((Doubler() + (Halver() + Stopper())).members) == 3  # compositions flatten


def test_make_policy_parses_names_parameters_and_refuses_bad_specs():
    p = make_policy("hadb(short_batch_factor=3, ema=1.0)+oracle")
    assert p.name == "hadb+oracle" and p.policies[0].short_batch_factor == 3
    assert {"baseline", "hadb", "oracle"} <= set(available_policies())
    for bad, msg in [("nope", "unknown policy 'nope'"), ("hadb(x=1)", "unexpected keyword"), ("hadb(3)", "must be named"),
                     ("hadb(short_quantile=2)", "short_quantile"), ("", "empty policy")]:
        with pytest.raises(ValueError, match=msg):
            make_policy(bad)


def test_hadb_defers_to_the_proposal_until_it_knows_the_pool():
    h = make_policy("hadb")
    proposal = [GroupSpec(i, 2, 1000) for i in range(4)]
    assert h.plan(ctx(), proposal) == proposal


def test_hadb_buckets_steps_by_history_and_cuts_hopeless_long_prompts():
    h = make_policy("hadb(short_quantile=0.5, long_quantile=0.8, short_batch_factor=2.0, zero_reward_groups=1)")
    lengths = {pid: 100 + 50 * pid for pid in range(40)}  # prompt id orders predicted length
    h.end_step(outcome(0, lengths, rewards={39: 0.0, 38: 0.0}))
    seen, sizes = [], {}
    for step in range(1, 40):
        plan = h.plan(ctx(step), [])
        if not plan:
            break
        pids = [g.prompt_id for g in plan]
        seen += pids
        bucket = "short" if max(pids) < 20 else "long" if min(pids) >= 32 else "medium"
        assert bucket == "short" or min(pids) >= 20, f"step mixes buckets: {pids}"
        sizes.setdefault(bucket, []).append(len(pids))
        budgets = {g.prompt_id: g.max_tokens for g in plan}
        for pid in (38, 39):
            if pid in budgets:
                assert budgets[pid] == 500  # long and zero reward: half the budget
        assert all(b == 1000 for p, b in budgets.items() if p not in (38, 39))
        if len(seen) >= 40:
            break
    assert sorted(seen) == list(range(40))  # every prompt once per epoch
    assert max(sizes["short"]) == 8 and max(sizes["long"]) == 4  # 2x groups for short steps


def test_hadb_scoreboard_is_an_exponential_average_of_log_length():
    h = make_policy("hadb(ema=0.5)")
    h.end_step(outcome(0, {1: 100}))
    h.end_step(outcome(1, {1: 400}))
    assert h.predicted_length(1) == pytest.approx(200.0)  # exp(0.5 log 400 + 0.5 log 100)
    assert h.predicted_length(2) is None


def test_oracle_refuses_a_world_without_lengths():
    with pytest.raises(ValueError, match="simulator"):
        make_policy("oracle").plan(ctx(), [])


@pytest.mark.parametrize("spec", ["baseline", "hadb", "oracle", "hadb+oracle"])
def test_shipped_policies_pass_check_policy(spec):
    assert check_policy(make_policy(spec))["groups_trained"] > 0


def test_check_policy_catches_contract_breaches():
    class Mutates(Policy):
        name = "mutates"

        def on_finish(self, request, state):
            request.reward = 2.0

    class BadPlace(Policy):
        name = "bad_place"

        def place(self, request, loads):
            return 99

    class Unseeded(Policy):
        name = "unseeded"

        def plan(self, ctx, proposal):
            return [GroupSpec(int(np.random.choice(ctx.pool.prompt_id)), 2, 100) for _ in proposal]

    for policy, msg in [(Mutates(), "read-only"), (BadPlace(), "instance index"), (Unseeded(), "same seed")]:
        with pytest.raises(PolicyCheckError, match=msg):
            check_policy(policy)


def test_requeue_resumes_in_the_same_step_and_loses_nothing():
    from test_sim import make_trace, run

    class Migrate(Policy):
        name = "migrate"
        progress_interval = 20

        def on_progress(self, request, state):
            return Action.requeue(priority=-request.generated, instance=(request.instance or 0) + 1)

    res, engine = run(make_trace([[[95, 30, 61, 7]]] * 2), Migrate(), n_instances=3)
    s, r = res.steps, res.responses
    assert (s["carried_out"] == 0).all() and r["finish_reason"].isin(["stop", "length"]).all()
    assert sorted(r["response_len"]) == sorted([95, 30, 61, 7] * 2)
    from types import SimpleNamespace
    request = SimpleNamespace(generated=20, instance=None)
    assert (Migrate() + Stopper()).on_progress(request, None).kind == "stop"
    assert (Migrate() + Carrier()).on_progress(request, None).kind == "carry"


def test_select_may_train_on_a_subset_of_a_group():
    class FirstTwo(Policy):
        name = "first_two"

        def select(self, groups, step):
            from lssim.loop.core import Group
            return [Group(g.prompt_id, g.step, g.requests[:2]) for g in groups]

    summary = check_policy(FirstTwo())
    assert summary["groups_trained"] > 0


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), prompts=st.integers(3, 12), steps=st.integers(3, 9), group=st.integers(1, 5),
       warmup=st.sampled_from([0.1, 0.5, 0.9]), short=st.sampled_from([1.0, 2.0, 3.0]))
def test_hadb_scoreboard_as_arrays_plans_as_the_dict_one_did(seed, prompts, steps, group, warmup, short):
    """The array scoreboard (one slot per prompt, grown as prompts appear) against hadb as it was (dicts): the same
    frames on small pools where epochs start before every prompt was seen."""
    import pandas as pd

    from hadb_reference import HADBReference
    from lssim.analysis.replay import SimSetup, simulate
    from lssim.traces.synth import get_preset, synthesize
    from lssim.traces.workload import Workload

    trace = synthesize(get_preset("math7b").replace(steps=steps, prompts_per_step=prompts, group_size=group, max_tokens=512,
                                                    length_median=120.0, seed=seed))
    kw = dict(warmup_fraction=warmup, short_batch_factor=short, zero_reward_groups=1)
    got = simulate(Workload(trace), make_policy(f"hadb(warmup_fraction={warmup}, short_batch_factor={short}, zero_reward_groups=1)"),
                   SimSetup(), steps=steps * 2)
    want = simulate(Workload(trace), HADBReference(**kw), SimSetup(), steps=steps * 2)
    pd.testing.assert_frame_equal(got.responses, want.responses, check_exact=True)
    pd.testing.assert_frame_equal(got.steps, want.steps, check_exact=True)
