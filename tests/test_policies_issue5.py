"""Policies II (where and how fast to run it): seer, rollpacker, segment, spec_tail, ebs, lpt; the engine-feature
mechanism (Speculation, SpeculativeCost) and the sweep command. Small scenarios that assert what happened, and
hypothesis properties for the invariants."""

import json
import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lssim.loop.checks import check_policy
from lssim.cli import main
from lssim.loop.controller import Controller, RunConfig
from lssim.loop.contracts import Engine
from lssim.loop.core import GroupSpec, InstanceLoad, PromptPool, Speculation, StepContext
from lssim.cost import RooflineCostModel, SpeculativeCost, solo_decode_time
from lssim.loop.history import LengthHistory
from lssim.loop.policy import StepOutcome, make_policy
from lssim.traces.workload import Workload
from test_sim import COST, make_trace, run

NEW = ["seer", "rollpacker", "segment", "spec_tail", "ebs", "lpt"]
FAST = settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def outcome(step, lengths: dict):
    """A StepOutcome: prompt -> list of response lengths."""
    pids = np.array([p for p, ls in lengths.items() for _ in ls], dtype=np.int64)
    lens = np.array([n for ls in lengths.values() for n in ls], dtype=np.int64)
    return StepOutcome(step, pids, np.zeros(len(pids), np.int64), lens, np.full(len(pids), 10**6), np.ones(len(pids)),
                       np.array(["stop"] * len(pids), dtype=object), 1.0, np.unique(pids))


def books_balance(res):
    s = res.steps
    return (s["responses_in"] == s["finished"] + s["truncated"] + s["policy_stopped"] + s["dropped"] + s["carried_out"]).all()


# -- history -------------------------------------------------------------------------------------

def test_length_history_predicts_from_a_prompts_past_responses():
    h = LengthHistory()
    h.update(outcome(0, {1: [100, 300], 2: [50]}))
    assert h.mean(1) == 200 and h.mean(3) is None and h.global_mean() == 150
    assert h.mean_square(1) == (100**2 + 300**2) / 2
    assert h.remaining(1, 150) == 150  # only the 300 was longer than 150: 150 to go
    assert h.remaining(1, 400) is None and h.remaining(3, 0) is None  # the history cannot say
    assert h.predict(3, default=7) == 150


# -- the engine feature: Speculation and its cost model -----------------------------------------

def test_speculation_validates_and_inverts_acceptance_counts():
    for bad in [dict(method="magic"), dict(alpha=1.5), dict(gamma=0), dict(max_batch=0), dict(draft_cost=-1),
                dict(layer_fraction=0.0)]:
        with pytest.raises(ValueError, match="Speculation"):
            Speculation(**bad)
    s = Speculation(alpha=0.6, gamma=3)
    assert s.tokens_per_verification() == pytest.approx(1 + 0.6 + 0.36 + 0.216)
    drafts = 1000
    accepted = round(drafts * (0.6 + 0.36 + 0.216))  # expected accepted per draft: alpha + alpha^2 + alpha^3
    assert Speculation.alpha_from_counts(drafts, accepted, 3) == pytest.approx(0.6, abs=1e-3)


def test_speculative_cost_is_the_papers_formula_and_only_under_the_threshold():
    spec = Speculation(alpha=0.5, gamma=4, draft_cost=0.05, max_batch=8)
    cost = SpeculativeCost(COST, spec)
    t = lambda m: COST.decode_time(m, 0, 1)  # noqa: E731
    for n in (1, 8):
        d, verify = spec.gamma * spec.draft_cost * t(n), t(n * 5)
        t_sd = (1 - 0.5) * (d + verify) / (1 - 0.5 ** 5)  # T_SD = (1-a)(D+T)/(1-a^(g+1)), per token
        assert cost.decode_time(n, 1000, 1) == pytest.approx(t_sd / t(n) * COST.decode_time(n, 1000, 1))
    assert cost.decode_time(9, 1000, 50) == COST.decode_time(9, 1000, 50)  # above max_batch: plain decoding
    layer = SpeculativeCost(COST, Speculation(method="layer_skip", layer_fraction=0.6))
    assert layer.decode_time(3, 500, 7) == pytest.approx(0.6 * COST.decode_time(3, 500, 7))
    # Never slower than plain decoding; and slower per token at larger batch, never faster.
    big = SpeculativeCost(RooflineCostModel("qwen2.5-7b", "H100"), Speculation(alpha=0.3, max_batch=256))
    factors = [big.factor(n) for n in range(1, 257)]
    assert all(f <= 1.0 for f in factors) and factors == sorted(factors) and factors[-1] == 1.0 and factors[0] < 0.8


@FAST
@given(n=st.integers(1, 40), ctx=st.integers(0, 10**6), a=st.integers(0, 3000), b=st.integers(0, 3000),
       alpha=st.floats(0.0, 0.95), gamma=st.integers(1, 8), max_batch=st.integers(1, 48), roofline=st.booleans())
def test_speculative_cost_is_exact_over_spans_and_inverts_exactly(n, ctx, a, b, alpha, gamma, max_batch, roofline):
    base = RooflineCostModel("qwen2.5-7b", "H100") if roofline else COST
    cost = SpeculativeCost(base, Speculation(alpha=alpha, gamma=gamma, max_batch=max_batch))
    whole = cost.decode_time(n, ctx, a + b)
    assert whole == pytest.approx(cost.decode_time(n, ctx, a) + cost.decode_time(n, ctx + n * a, b), rel=1e-9)
    seconds = cost.decode_time(n, ctx, a) * 1.0000001
    k = cost.iterations_within(n, ctx, seconds)
    assert cost.decode_time(n, ctx, k) <= seconds < cost.decode_time(n, ctx, k + 1)
    assert cost.decode_time(n, ctx, a) <= cost.decode_time(n + 1, ctx, a) * (1 + 1e-12)  # monotone in the batch


def test_spec_tail_speeds_a_lone_response_and_counts_what_it_speculated():
    trace = make_trace([[[400]]])
    plain, _ = run(trace, "baseline", n_instances=1)
    fast, engine = run(trace, "spec_tail(alpha=0.6)", n_instances=1)
    cost = engine.cost
    assert isinstance(cost, SpeculativeCost) and engine.speculated_tokens == 400
    assert fast.steps["rollout_seconds"].iloc[0] == pytest.approx(solo_decode_time(cost, 16, 400))
    assert fast.steps["rollout_seconds"].iloc[0] < plain.steps["rollout_seconds"].iloc[0]
    # Above the threshold nothing changes: three sequences, speculation only up to two.
    trace3 = make_trace([[[300, 300, 300]]])
    a, _ = run(trace3, "baseline", n_instances=1)
    b, engine = run(trace3, "spec_tail(max_batch=2)", n_instances=1)
    assert engine.speculated_tokens == 0
    assert b.steps["rollout_seconds"].iloc[0] == a.steps["rollout_seconds"].iloc[0]


def test_speculation_composes_and_is_refused_by_an_engine_that_cannot_speculate():
    both = make_policy("seer+spec_tail(alpha=0.7)")
    assert both.needs().speculation == Speculation(alpha=0.7) and make_policy("seer+lpt").needs().speculation is None
    assert make_policy("spec_tail+spec_tail").needs().speculation == Speculation()  # the same request twice is fine
    with pytest.raises(ValueError, match="different speculation"):
        make_policy("spec_tail(alpha=0.5)+spec_tail(alpha=0.6)")

    class NoSpecEngine(Engine):  # an engine that cannot speculate: Engine.set_speculation's default refuses
        n_instances = 1

        def set_progress_interval(self, tokens):
            pass

    wl = Workload(make_trace([[[10]]]))
    cfg = RunConfig(steps=1, groups_per_step=1, group_size=1, max_tokens=10)
    with pytest.raises(ValueError, match="cannot do"):
        Controller(NoSpecEngine(), None, wl, make_policy("spec_tail"), cfg)
    Controller(NoSpecEngine(), None, wl, make_policy("seer"), cfg)  # no speculation asked: fine


# -- seer ------------------------------------------------------------------------------------------

def test_seer_runs_probes_first_then_longest_estimate_first():
    # One slot: requests run one at a time, in priority order. Prompt 0 is short, prompt 1 long.
    trace = make_trace([[[10, 60, 70], [200, 120, 130]]] * 2)
    res, _ = run(trace, "seer(chunk=1000)", n_instances=1, max_num_seqs=1)
    for step, first_rest in ((0, 0), (1, 1)):
        r = res.responses[res.responses["step"] == step].sort_values("first_token_time")
        order = list(zip(r["prompt_id"], r["sample_idx"]))
        assert order[:2] == [(0, 0), (1, 0)]  # both probes first (shortest-first by tokens generated: a tie)
        # Then the other members, longest estimate first: nothing known at step 0 (the budget for all, so
        # in order); at step 1 the prompts' earlier lengths put prompt 1's members first.
        assert [p for p, _ in order[2:]] == [first_rest] * 2 + [1 - first_rest] * 2


def test_seer_moves_a_request_to_an_idle_instance_between_chunks():
    # Placement alternates, so instance 0 gets the three long responses and instance 1 the three short ones.
    trace = make_trace([[[300, 5, 300, 5, 300, 5]]])
    base, _ = run(trace, "baseline", n_instances=2)
    res, _ = run(trace, "seer(chunk=100)", n_instances=2)
    r = res.responses
    long = r[r["response_len"] == 300]
    assert sorted(long["instance"]) == [0, 0, 1]  # one moved at its first chunk boundary, then counts were even
    assert r["finish_reason"].isin(["stop", "length"]).all() and books_balance(res)
    assert res.steps["rollout_seconds"].iloc[0] < base.steps["rollout_seconds"].iloc[0]


# -- lpt and ebs -----------------------------------------------------------------------------------

def ctx(groups=4, group_size=2, max_tokens=1000):
    ids = np.arange(40)
    return StepContext(step=1, groups_per_step=groups, group_size=group_size, max_tokens=max_tokens, groups_left=10**6,
                       carried_groups=0, pool=PromptPool(ids, np.full(40, 10)), rng=np.random.default_rng(0))


class R:  # what place/priority read of a request
    def __init__(self, rid, prompt_id, generated=0, max_tokens=1000, group_id=0):
        self.rid, self.prompt_id, self.generated, self.max_tokens, self.group_id = rid, prompt_id, generated, max_tokens, group_id


def test_lpt_places_longest_predicted_first_on_the_least_loaded_instance():
    p = make_policy("lpt")
    p.end_step(outcome(0, {1: [900], 2: [500], 3: [400], 4: [100]}))
    p.plan(ctx(), [])
    loads = [InstanceLoad(0, 0, 0)] * 2
    reqs = sorted([R(i, pid) for i, pid in enumerate([4, 3, 1, 2])], key=p.priority)
    assert [r.prompt_id for r in reqs] == [1, 2, 3, 4]  # longest predicted first
    assert [p.place(r, loads) for r in reqs] == [0, 1, 1, 0]  # 900 | 500, then 400 to 1 (900 vs 900), 100 to 0
    assert p.priority(R(9, 77)) == -475  # never seen: the mean over every response seen


def test_ebs_buckets_by_prediction_and_spreads_the_long_batches():
    p = make_policy("ebs(batch_sizes=(4, 2, 1))")
    p.end_step(outcome(0, {1: [900], 2: [950], 3: [100], 4: [50], 5: [300]}))
    assert [p.bucket(p.predicted(pid, 1000), 1000) for pid in (1, 3, 5)] == [2, 0, 1]  # long, short, medium
    p.plan(ctx(), [GroupSpec(pid, 2, 1000) for pid in (1, 2, 3, 4, 5)])
    assert sorted(len(b[3]) for b in p.batches if b[2] == 2) == [1, 1, 1, 1]  # long: batches of one
    loads = [InstanceLoad(0, 0, 0)] * 4
    placed = {pid: [p.place(R(10 * pid + k, pid), loads) for k in range(2)] for pid in (1, 2)}
    assert len({i for v in placed.values() for i in v}) == 4  # the four long responses on four instances


# -- rollpacker --------------------------------------------------------------------------------------

def test_rollpacker_trains_n_of_r_and_every_dropped_prompt_comes_back_in_a_long_round():
    rng = np.random.default_rng(3)
    lengths = rng.integers(5, 60, size=(6, 16, 4))
    lengths[:, ::3, :] = rng.integers(300, 400, size=lengths[:, ::3, :].shape)  # some prompts are long
    policy = make_policy("rollpacker")
    res, _ = run(make_trace(lengths, max_tokens=400), policy, n_instances=2)
    r, s = res.responses, res.steps
    assert books_balance(res) and s["groups_trained"].sum() == 6 * 16  # as many groups as any policy
    long_steps = {step for step, _ in policy.long_rounds}
    short = r[~r["step"].isin(long_steps)]
    assert short.groupby("group_id").size().max() == math.ceil(1.25 * 4)  # R = 5 samples a prompt
    trained = r[r["trained"]]
    assert (trained.groupby("group_id").size() == 4).all()  # each trains on n = 4 of them
    assert (s.loc[~s["step"].isin(long_steps), "groups_trained"].iloc[:-1] == 16).all()  # P0 groups a short round
    # Every prompt sent to the queue came back, once, in a later long round, from scratch: n fresh samples at
    # that step's weights, all trained.
    assert policy.deferred and not policy.long_queue
    assert sorted(p for _, p in policy.deferred) == sorted(p for _, ps in policy.long_rounds for p in ps)
    for step, prompts in policy.long_rounds:
        assert all(d < step for d, p in policy.deferred if p in prompts)
        rows = r[r["step"] == step]
        assert sorted(rows["prompt_id"].unique()) == sorted(prompts) and rows["trained"].all()
        assert (rows["policy_version_first"] == step).all() and (rows.groupby("group_id").size() == 4).all()
    # The dropped responses of deferred prompts: ended by the rollout, none trained.
    for step, p in policy.deferred:
        rows = r[(r["step"] == step) & (r["prompt_id"] == p)]
        assert not rows["trained"].any() and (rows["finish_reason"] == "abort").any()


# -- segment ------------------------------------------------------------------------------------------

def test_segment_carries_past_its_window_and_reports_the_staleness():
    trace = make_trace([[[350, 20]]] * 4)
    res, _ = run(trace, "segment(window=100, checks=1, refill=False)", n_instances=1)
    r = res.responses
    long = r[(r["step"] == 0) & (r["response_len"] == 350)].iloc[0]
    assert long["end_step"] == 3 and long["tokens_before_resume"] == 300  # 100 tokens a step, then the last 50
    assert (long["policy_version_first"], long["policy_version_last"]) == (0, 3)
    assert books_balance(res) and (res.steps["carried_out"].iloc[:3] >= 1).all()
    assert res.steps["off_policy_token_fraction"].max() > 0


def test_segment_extends_the_window_of_a_response_predicted_to_finish_soon():
    trace = make_trace([[[120, 120]], [[120, 120]]])  # step 1's prompt was seen at step 0: 120 tokens
    cut, _ = run(trace, "segment(window=100, extend=0.0, checks=4, refill=False)", n_instances=1)
    ext, _ = run(trace, "segment(window=100, extend=0.25, checks=4, refill=False)", n_instances=1)
    # Steps 0 and 2 start a group (step 1 only finishes what step 0 carried, its group still open).
    assert cut.steps["carried_out"].tolist() == [2, 0, 2, 0]  # without extension: cut at 100 both times
    assert ext.steps["carried_out"].tolist() == [2, 0, 0]  # at step 2 the history says 20 to go: extended


# -- properties over the new policies ------------------------------------------------------------------

from test_sim import traces  # noqa: E402  (the same small long-tailed traces as the core properties)


@FAST
@given(trace=traces, policy=st.sampled_from(NEW + ["seer+spec_tail", "lpt+segment", "rollpacker+lpt"]),
       instances=st.integers(1, 3), seqs=st.integers(1, 8), kv=st.sampled_from([600, 10**6]))
def test_new_policies_lose_nothing_and_respect_the_bound(trace, policy, instances, seqs, kv):
    res, _ = run(trace, policy, n_instances=instances, max_num_seqs=seqs, kv=kv)
    s, r = res.steps, res.responses
    assert books_balance(res)
    assert not r.duplicated(["step", "prompt_id", "sample_idx"]).any()
    assert len(r) == s["responses_in"].sum() - s["carried_in"].sum()
    assert (s["rollout_seconds"] >= s["lower_bound_seconds"] * (1 - 1e-9)).all()


@FAST
@given(trace=traces, chunk=st.integers(5, 200))
def test_on_one_instance_seer_and_lpt_cost_at_most_the_re_prefill(trace, chunk):
    # One instance with room for everything: placement cannot help, and order cannot matter (all run at once);
    # seer requeueing every chunk costs at most the prefill of what each requeued request had.
    base, _ = run(trace, "baseline", n_instances=1)
    lpt, _ = run(trace, "lpt", n_instances=1)
    assert lpt.steps["rollout_seconds"].sum() <= base.steps["rollout_seconds"].sum() * (1 + 1e-9)
    seer, _ = run(trace, f"seer(chunk={chunk}, every_chunk=True)", n_instances=1)
    r = seer.responses
    reprefill = sum(COST.prefill_time(p + k * chunk) for p, n in zip(r["prompt_len"], r["response_len"])
                    for k in range(1, (n - 1) // chunk + 1))
    assert seer.steps["rollout_seconds"].sum() <= base.steps["rollout_seconds"].sum() + reprefill + 1e-9
    assert sorted(seer.responses["response_len"]) == sorted(base.responses["response_len"])


@pytest.mark.parametrize("spec", NEW + ["seer+rollpacker+spec_tail", "ebs+segment"])
def test_new_policies_pass_check_policy(spec):
    assert check_policy(make_policy(spec))["groups_trained"] > 0


# -- the sweep ----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def small_trace(tmp_path_factory):
    path = tmp_path_factory.mktemp("t") / "small.parquet"
    main(["synth", "--preset", "math7b", "--steps", "4", "--prompts-per-step", "16", "--n-prompts", "32", "--group-size", "4",
          "--out", str(path)])
    return path


def test_sweep_searches_compositions_and_reports_the_best_against_the_bound(small_trace, tmp_path, capsys):
    out = tmp_path / "sweep"
    assert main(["sweep", str(small_trace), "--policies", "lpt,seer,spec_tail", "--max-size", "2", "--instances", "2",
                 "--json", "--out", str(out)]) == 0
    data = json.loads(capsys.readouterr().out)
    names = [row["policy"] for row in data["results"]]
    assert set(names) == {"baseline", "lpt", "seer", "spec_tail", "lpt+seer", "lpt+spec_tail", "seer+spec_tail"}
    best = data["best"]
    assert best["policy"] in names and 0 < best["lower_bound_efficiency"] <= 1
    assert best["speedup"] == max(row["speedup"] for row in data["results"])
    assert (out / "sweep.csv").exists() and len(pd.read_csv(out / "sweep.csv")) == len(names)
