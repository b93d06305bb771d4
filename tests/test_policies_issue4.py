"""Policies I (issue #4): april, breaker, vade, dapo, alc, ar3po -- their decision rules in the simulator,
hypothesis properties for their invariants, the shared signals, and check_policy for each."""

import dataclasses

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_sim import make_trace, run

from lssim.loop.checks import check_policy
from lssim.loop.core import Group, GroupSpec, PromptPool, Request, StepContext, off_policy_tokens
from lssim.loop.difficulty import PromptPosterior, samples_for_one_success
from lssim.loop.policy import Action, Policy, StepOutcome, make_policy
from lssim.loop.signals import DEFAULT, repetition_rate, signals_from_tokens, signals_from_trace

FAST = settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def ctx(step=0, pool_size=40, groups=4, group_size=8, max_tokens=1000, draw=None, carried=0, groups_left=10**6):
    ids = np.arange(pool_size)
    return StepContext(step=step, groups_per_step=groups, group_size=group_size, max_tokens=max_tokens, groups_left=groups_left,
                       carried_groups=carried, pool=PromptPool(ids, np.full(pool_size, 10)), rng=np.random.default_rng(0), draw=draw)


def outcome(step, pids, rewards, lengths=None):
    pids = np.asarray(pids, dtype=np.int64)
    n = len(pids)
    return StepOutcome(step, pids, np.arange(n), np.asarray(lengths if lengths is not None else [100] * n, dtype=np.int64),
                       np.full(n, 1000), np.asarray(rewards, dtype=float), np.array(["stop"] * n, dtype=object), 1.0, np.unique(pids))


# -- the shared controller's additions ---------------------------------------------------------------

def test_draw_continues_the_loader_and_the_run_drains_what_is_carried():
    trace = make_trace(np.random.default_rng(1).integers(5, 200, size=(4, 6, 3)))
    trace["prompt_id"] += 6 * trace["step"]  # every step its own prompts: the loader's stream is 0, 1, 2, ...
    res, _ = run(trace, "april")
    r, s = res.responses, res.steps
    # Over-provisioning draws the loader's next groups: each group of the stream is taken once, in order.
    used = sorted(r.drop_duplicates("group_id")["prompt_id"])
    assert used == list(range(len(used))) and len(used) == 24
    assert s["carried_out"].iloc[-1] == 0 and r["trained"].all()  # nothing left hanging, nothing discarded


def test_policy_stops_are_told_to_on_finish():
    seen = []

    class StopAll(Policy):
        name = "stop_all"
        progress_interval = 10

        def on_progress(self, request, state):
            return Action.stop("x")

        def on_finish(self, request, state):
            seen.append(request.finish_reason)

    run(make_trace([[[50, 5]]]), StopAll())
    assert sorted(seen) == ["policy_stop", "stop"]


def test_off_policy_tokens_counts_what_older_weights_wrote():
    r = Request(rid=0, group_id=0, step=0, prompt_id=0, sample_idx=0, prompt_len=1, max_tokens=100, generated=80,
                tokens_before_resume=30, last_version=2)
    assert off_policy_tokens(r, 2) == 30  # resumed at step 2: the 30 tokens before it are stale
    assert off_policy_tokens(r, 3) == 80  # ended at step 2, trained at 3: every token is stale


# -- APRIL ---------------------------------------------------------------------------------------------

def test_april_ends_at_the_target_and_carries_the_rest_with_their_tokens():
    # 2 groups per step, one of them with a long member; with 2x over-provisioning (the next step's batch
    # drawn early) the step ends once 2 groups are done.
    lengths = [[[300, 10], [12, 11]], [[13, 9], [400, 8]]] * 2
    trace = make_trace(lengths)
    trace["prompt_id"] += 2 * trace["step"]
    res, _ = run(trace, "april", n_instances=1, max_num_seqs=64)
    r, s = res.responses, res.steps
    assert s["groups_trained"].iloc[0] == 2 and s["carried_out"].iloc[0] > 0
    resumed = r[r["tokens_before_resume"] > 0]
    assert len(resumed) > 0 and (resumed["policy_version_last"] > resumed["policy_version_first"]).all()
    assert (r["finish_reason"].isin(["stop", "length"])).all() and r["trained"].all()
    # The step column is the stale share of what trained in the step, token for token.
    for step, row in s.set_index("step").iterrows():
        t = r[r["train_step"] == step]
        expected = t["off_policy_tokens"].sum() / t["response_len"].sum() if len(t) else 0.0
        assert row["off_policy_token_fraction"] == pytest.approx(expected)
    waited = r[(r["train_step"] > r["end_step"])]  # finished before its group: all its tokens are stale
    assert len(waited) > 0 and (waited["off_policy_tokens"] == waited["response_len"]).all()


from test_sim import traces  # noqa: E402  (the same small long-tailed traces as the core properties)


@FAST
@given(trace=traces, factor=st.floats(1.0, 3.0), bound=st.sampled_from([None, 1, 2, 3]), instances=st.integers(1, 2),
       seqs=st.integers(1, 6))
def test_april_loses_nothing_ends_everything_and_bounds_staleness(trace, factor, bound, instances, seqs):
    res, _ = run(trace, f"april(over_provision={factor}, max_carry_steps={bound})", n_instances=instances, max_num_seqs=seqs)
    s, r = res.steps, res.responses
    assert (s["responses_in"] == s["finished"] + s["truncated"] + s["policy_stopped"] + s["dropped"] + s["carried_out"]).all()
    assert s["dropped"].sum() == 0 and s["carried_out"].iloc[-1] == 0  # every carried response ended
    assert len(r) == s["responses_in"].sum() - s["carried_in"].sum() and not r.duplicated(["step", "prompt_id", "sample_idx"]).any()
    assert r["trained"].all()  # nothing discarded
    assert (r["off_policy_tokens"] <= r["response_len"]).all()
    if bound is not None:
        assert (r["policy_version_last"] - r["policy_version_first"] <= bound).all()
        assert (r["train_step"] - r["step"] <= bound + 1).all()


def test_april_exposes_the_stale_token_mask_for_the_trainer():
    assert make_policy("april").mask_stale_tokens is False
    assert make_policy("april(mask_stale_tokens=True)+breaker").policies[0].mask_stale_tokens is True


# -- signals and the breaker ---------------------------------------------------------------------------

def test_signals_from_tokens():
    loop = [7, 8, 9] * 100
    s = signals_from_tokens(loop, [-0.01] * 300, window=64, ngram=4)
    assert s["repetition"] == pytest.approx(1 - 3 / 61) and s["entropy"] == pytest.approx(0.01) and s["tokens"] == 64
    text = list(range(300))
    assert signals_from_tokens(text, [-2.0] * 300, window=64)["repetition"] == 0.0
    assert signals_from_tokens(text, [-9.0] * 300, window=64, entropies=[0.5] * 300)["entropy"] == pytest.approx(0.5)
    assert repetition_rate([1, 2], 4) == 0.0 and signals_from_tokens([], [], 8)["entropy"] != signals_from_tokens([], [], 8)["entropy"]


def test_signals_from_trace_model_a_loop_entering_the_window():
    before = signals_from_trace(100, loop_start=200, collapse_start=-1, entropy=0.1, text_entropy=0.6, window=100)
    half = signals_from_trace(250, 200, -1, 0.1, 0.6, window=100)
    full = signals_from_trace(300, 200, -1, 0.1, 0.6, window=100)
    assert (before["repetition"], before["entropy"]) == (0.0, pytest.approx(0.6))
    assert (half["repetition"], half["entropy"]) == (0.5, pytest.approx(0.35))
    assert (full["repetition"], full["entropy"]) == (1.0, pytest.approx(0.1))
    collapse = signals_from_trace(300, -1, 200, 0.05, 0.6, window=100)
    assert collapse["repetition"] == 0.0 and collapse["entropy"] == pytest.approx(0.05)


def loop_trace(loop_starts, rewards=None, collapse=None, entropy=None, max_tokens=2000):
    """One step, one group; a response with a loop runs to max_tokens (as in the synthetic traces)."""
    n = len(loop_starts)
    lengths = [max_tokens if ls >= 0 or (collapse and collapse[i] >= 0) else 300 + 50 * i for i, ls in enumerate(loop_starts)]
    df = make_trace([[lengths]], max_tokens=max_tokens, rewards=[[rewards or [1.0] * n]])
    df["loop_start"] = loop_starts
    df["entropy_collapse_start"] = collapse or [-1] * n
    df["entropy_mean"] = entropy or [0.6] * n
    return df


def test_breaker_stops_a_loop_with_a_soft_landing_and_reports_savings():
    res, _ = run(loop_trace([400, -1, -1]), "breaker(check_every=64, min_tokens=128)")
    r = res.responses.set_index("sample_idx")
    stopped = r.loc[0]
    # repetition = (g - 400) / 256 >= 0.5 first at the checkpoint 576 (a multiple of 64 past 528).
    assert (stopped["finish_reason"], stopped["stop_reason"], stopped["reward"], stopped["response_len"]) == ("policy_stop", "loop", -1.0, 576)
    assert stopped["natural_len"] == 2000 and stopped["natural_reward"] == 0.0
    assert (r.loc[[1, 2], "finish_reason"] == "stop").all()
    from lssim.analysis.replay import summarize

    row = summarize({"breaker": res}).iloc[0]
    assert row["tokens_saved_fraction"] == pytest.approx((2000 - 576) / (r["response_len"].sum() + 2000 - 576))
    assert row["stopped_correct_fraction"] == 0.0


def test_breaker_counts_a_stopped_response_that_would_have_been_right_as_a_false_positive():
    # A response whose entropy collapses but which (the trace says) would still have ended correct.
    df = loop_trace([-1, -1], rewards=[1.0, 1.0], collapse=[300, -1], entropy=[0.02, 0.6])
    df.loc[0, ["response_len", "finish_reason", "reward"]] = [1500, "stop", 1.0]
    res, _ = run(df, "breaker(check_every=64, min_tokens=128, patience=2)")
    r = res.responses.set_index("sample_idx")
    assert r.loc[0, "stop_reason"] == "entropy_collapse" and r.loc[0, "natural_reward"] == 1.0
    from lssim.analysis.replay import summarize

    assert summarize({"breaker": res}).iloc[0]["stopped_correct_fraction"] == 1.0


def first_fire(breaker, natural_len, loop, collapse, entropy, text, window, interval):
    """Where the breaker's rule fires on a response, checkpoint by checkpoint (None: never before its end)."""
    for c in range(interval, natural_len, interval):
        signals = signals_from_trace(c, loop, collapse, entropy, text, window)
        if breaker.decide(-1, c, signals):
            return c
    return None


@FAST
@given(seed=st.integers(0, 10**6), n=st.integers(2, 8), interval=st.sampled_from([32, 50, 64]),
       threshold=st.floats(0.2, 1.0), patience=st.integers(1, 3))
def test_breaker_never_stops_a_response_that_ends_before_its_rule_fires(seed, n, interval, threshold, patience):
    rng = np.random.default_rng(seed)
    max_tokens = 1500
    lengths = rng.integers(50, max_tokens, size=n)
    loops = np.where(rng.random(n) < 0.4, rng.integers(0, 1200, size=n), -1)
    collapse = np.where((rng.random(n) < 0.3) & (loops < 0), rng.integers(0, 1200, size=n), -1)
    entropy = np.round(rng.uniform(0.01, 3.0, size=n), 3)
    df = make_trace([[lengths.tolist()]], max_tokens=max_tokens)
    df["loop_start"] = np.minimum(loops, df["response_len"])
    df["entropy_collapse_start"] = np.minimum(collapse, df["response_len"])
    df["entropy_mean"] = entropy
    spec = f"breaker(check_every={interval}, repetition_above={threshold}, patience={patience}, min_tokens=0)"
    res, engine = run(df, spec)
    text = engine.workload.text_entropy
    for _, row in res.responses.iterrows():
        src = df[(df["sample_idx"] == row["sample_idx"])].iloc[0]
        fire = first_fire(make_policy(spec), int(src["response_len"]), int(src["loop_start"]), int(src["entropy_collapse_start"]),
                          float(src["entropy_mean"]), text, DEFAULT.window_for(max_tokens), interval)
        if fire is None:  # ends by itself (or at its budget) before the rule would fire: untouched
            assert row["finish_reason"] == src["finish_reason"] and row["response_len"] == src["response_len"]
        else:
            assert row["finish_reason"] == "policy_stop" and row["response_len"] == fire


# -- VADE ----------------------------------------------------------------------------------------------

def test_posterior_formulas():
    post = PromptPosterior(prior_a=1, prior_b=1, step_decay=0.5, visit_decay=0.25)
    post.update(0, np.array([7, 7, 7, 7]), np.array([1.0, 1.0, 0.0, -1.0]))  # -1 (a soft landing) counts as a failure
    a, b = post.params(np.array([7, 8]), 0)
    assert (a.tolist(), b.tolist()) == ([3.0, 1.0], [3.0, 1.0])
    a, b = post.params(np.array([7]), 2)  # two steps later: evidence x 0.5 ** 2
    assert (a[0], b[0]) == (1.5, 1.5)
    post.update(2, np.array([7]), np.array([1.0]))  # a visit: the old evidence x 0.25, then the new counts
    a, b = post.params(np.array([7]), 2)
    assert (a[0], b[0]) == (1 + 0.5 * 0.25 + 1, 1 + 0.5 * 0.25)


def test_vade_skips_easy_prompts_tiers_budgets_and_prefers_informative_ones():
    v = make_policy("vade(easy_above=0.9, hard_below=0.3, medium_budget=0.5)")
    easy, hard, medium = list(range(0, 10)), list(range(10, 20)), list(range(20, 30))
    for step in range(3):
        v.end_step(outcome(step, np.repeat(easy + hard + medium, 8),
                           np.concatenate([np.ones(80), np.zeros(80), np.tile([1.0, 0.0], 40)])))
    plan = v.plan(ctx(step=3, pool_size=40, group_size=8), [GroupSpec(0, 8, 1000) for _ in range(15)])
    chosen = {g.prompt_id: g.max_tokens for g in plan}
    assert len(plan) == 15 and not set(chosen) & set(easy)  # the proposal's size; easy prompts skipped
    assert set(medium) <= set(chosen)  # p ~ 0.5 beats p ~ 0 and the unknown prompts
    assert all(chosen[p] == 500 for p in medium) and all(chosen[p] == 1000 for p in chosen if p not in medium)
    assert v.last_tiers == {"easy": 10, "medium": 10, "hard": 20}  # prompts 30-39 are unknown: hard


def test_vade_raises_the_share_of_groups_with_signal():
    # 32 prompts, 8 per step, 4 samples: prompts 0-15 are always solved (no signal), 16-31 half the time.
    steps, per_step = 16, 8
    lengths = np.random.default_rng(0).integers(20, 200, size=(steps, per_step, 4))
    df = make_trace(lengths, max_tokens=400)
    df["prompt_id"] = (df["step"] * per_step + df["prompt_id"]) % 32
    df["reward"] = np.where(df["prompt_id"] < 16, 1.0, (df["sample_idx"] % 2).astype(float))
    df["finish_reason"] = "stop"
    base, _ = run(df, "baseline")
    vade, _ = run(df, "vade")
    late = slice(8, None)  # after a pass over the pool, VADE knows which prompts teach nothing
    assert base.steps["effective_groups"].iloc[late].mean() == pytest.approx(4, abs=1.5)
    assert vade.steps["effective_groups"].iloc[late].mean() >= 7


# -- DAPO ----------------------------------------------------------------------------------------------

def dapo_trace():
    # 2 groups per step of 4 samples; prompt 0 of each step has no reward variance, prompt 1 has.
    lengths = [[[20, 30, 40, 50], [25, 35, 45, 55]]] * 4
    rewards = [[[1, 1, 1, 1], [1, 0, 1, 0]]] * 4
    return make_trace(lengths, rewards=rewards)


def test_dapo_tops_up_until_the_step_has_its_effective_groups():
    res, _ = run(dapo_trace(), "dapo(max_gen_batches=10)", steps=2)
    s = res.steps
    assert (s["effective_groups"] == s["groups_trained"]).all() and (s["groups_trained"] == 2).all()
    assert (s["responses_in"] == 16).all()  # two generation batches of 2 groups each, every step
    one, _ = run(dapo_trace(), "dapo(max_gen_batches=1)", steps=2)
    assert (one.steps["responses_in"] == 8).all() and (one.steps["groups_trained"] == 1).all()  # the cap: train on what there is
    base, _ = run(dapo_trace(), "baseline", steps=2)
    assert (s["rollout_seconds"] > base.steps["rollout_seconds"]).all()  # the extra batch runs on the engine's clock


# -- ALC -----------------------------------------------------------------------------------------------

def test_alc_opens_the_budget_as_reward_rises_and_on_its_time_floor():
    a = make_policy("alc(start_fraction=0.25, growth=2.0, reward_gain=0.1, min_steps=2, max_steps=5)")
    budgets = []
    for step, mean in enumerate([0.2, 0.2, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5]):
        plan = a.plan(ctx(step=step, max_tokens=16000), [GroupSpec(1, 8, 16000)])
        budgets.append(plan[0].max_tokens)
        a.end_step(outcome(step, [1, 1], [mean, mean]))
    # 4000 for 3 steps (the reward rises at the 3rd), then 8000 for its time floor of 5 steps, then 16000.
    assert budgets[:3] == [4000] * 3 and budgets[3:8] == [8000] * 5 and set(budgets[8:]) == {16000}


def test_alc_penalizes_truncated_members_on_copies():
    a = make_policy("alc(truncation_penalty=0.25)")
    r1 = Request(rid=1, group_id=0, step=0, prompt_id=3, sample_idx=0, prompt_len=5, max_tokens=10, generated=10,
                 finish_reason="length", reward=0.0)
    r2 = Request(rid=2, group_id=0, step=0, prompt_id=3, sample_idx=1, prompt_len=5, max_tokens=10, generated=4,
                 finish_reason="stop", reward=1.0)
    [g] = a.select([Group(3, 0, [r1, r2])], 0)
    assert [m.reward for m in g.requests] == [-0.25, 1.0] and r1.reward == 0.0 and g.requests[1] is r2


# -- AR3PO ---------------------------------------------------------------------------------------------

def test_ar3po_gives_easy_prompts_fewer_samples_and_hard_ones_more():
    a = make_policy("ar3po(confidence=0.9, min_samples=2, max_samples=16)")
    a.end_step(outcome(0, np.repeat([1, 2, 3], 8), np.concatenate([np.ones(8), np.zeros(8), np.tile([1.0, 0.0], 4)])))
    plan = a.plan(ctx(step=1), [GroupSpec(p, 8, 1000) for p in (1, 2, 3, 4)])
    n = {g.prompt_id: g.n_samples for g in plan}
    assert n[1] == 2 and n[3] == 4 and n[4] == 8 and n[2] > 8  # easy, medium, unknown (unchanged), hard
    assert sum(n.values()) <= 32
    assert samples_for_one_success(np.array([0.5]), 0.9)[0] == 4


@FAST
@given(seed=st.integers(0, 10**6), groups=st.integers(1, 12), size=st.integers(2, 16))
def test_ar3po_stays_within_the_sample_budget_and_is_monotone_in_difficulty(seed, groups, size):
    rng = np.random.default_rng(seed)
    a = make_policy("ar3po")
    p = rng.uniform(0, 1, size=groups)
    pids = np.arange(groups)
    a.end_step(outcome(0, np.repeat(pids, 8), (rng.random((groups, 8)) < p[:, None]).astype(float).ravel()))
    counts = a.allocate(pids, np.full(groups, size), 1)
    assert counts.sum() <= groups * size and (counts >= a.min_samples).all() and (counts <= 2 * size).all()
    mean, _ = a.posterior.mean(pids, 1)
    harder = mean[:, None] < mean[None, :]
    assert (counts[:, None] >= counts[None, :])[harder].all()  # harder (lower mean) never gets fewer samples


# -- the contract ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("spec", ["april", "april(max_carry_steps=1)", "breaker", "vade", "dapo", "alc", "ar3po",
                                  "vade+april+breaker", "april+vade+breaker", "april+dapo+alc+ar3po"])
def test_issue4_policies_pass_check_policy(spec):
    assert check_policy(make_policy(spec))["groups_trained"] > 0


def test_check_policy_refuses_a_reshaped_copy_that_changes_more_than_the_reward():
    from lssim.loop.checks import PolicyCheckError

    class Sneaky(Policy):
        name = "sneaky"

        def select(self, groups, step):
            return [Group(g.prompt_id, g.step, [dataclasses.replace(r, generated=1) for r in g.requests]) for g in groups]

    with pytest.raises(PolicyCheckError, match="only the reward may differ"):
        check_policy(Sneaky())


def test_trace_schema_has_the_collapse_column_and_synth_can_make_collapses():
    from lssim.traces.synth import SynthConfig, synthesize
    from lssim.traces.trace import validate_trace

    df = synthesize(SynthConfig(n_prompts=32, steps=2, prompts_per_step=16, group_size=4, max_tokens=2048, collapse_fraction=0.2))
    c = df[df["entropy_collapse_start"] >= 0]
    assert len(c) > 0 and (c["finish_reason"] == "length").all() and (c["reward"] == 0).all() and (c["loop_start"] == -1).all()
    with pytest.raises(ValueError, match="entropy_collapse_start"):
        validate_trace(df.assign(entropy_collapse_start=df["response_len"] + 1))
    pd.testing.assert_frame_equal(synthesize(SynthConfig(n_prompts=32, steps=2, prompts_per_step=16, group_size=4)).drop(
        columns="entropy_collapse_start"), synthesize(SynthConfig(n_prompts=32, steps=2, prompts_per_step=16, group_size=4,
                                                                  collapse_fraction=0.0)).drop(columns="entropy_collapse_start"))
