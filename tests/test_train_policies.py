"""Training-side policies (Policy.train_mask): G2TP and micro-entropy pruning in the simulator and on the real
trainer, and how they compose."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lssim.loop.core import Group, Request
from lssim.loop.policy import Compose, Policy, TrainBatch, TrainMask, make_policy
from lssim.sim.trainer import SimTrainer, TrainTimeModel
from lssim.sim.train_policy import measured_mask, price_masked, sim_batch
from lssim.sim.training import AnalyticTrainCost
from policies.entropy_prune import EntropyPrune, entropy_keep
from policies.g2tp import G2TP, g2tp_keep


@st.composite
def token_batches(draw, max_seqs=12):
    n = draw(st.integers(1, max_seqs))
    lens = draw(st.lists(st.integers(1, 40), min_size=n, max_size=n))
    seed = draw(st.integers(0, 2**16))
    rng = np.random.default_rng(seed)
    logprobs = tuple(np.where(rng.random(k) < 0.6, -rng.exponential(0.01, k), -rng.exponential(1.5, k)) for k in lens)
    in_loss = tuple(rng.random(k) < 0.9 for k in lens) if draw(st.booleans()) else None
    return TrainBatch(0, rng.integers(1, 30, n).astype(np.int64), np.array(lens, np.int64), rng.normal(size=n),
                      np.arange(n, dtype=np.int64) // 4, logprobs, in_loss)


def _live(batch):
    return [np.ones(int(n), bool) if batch.in_loss is None else batch.in_loss[i] for i, n in enumerate(batch.response_len)]


# -- what the policies decide ------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(token_batches(), st.floats(0, 0.95), st.booleans())
def test_g2tp_prunes_the_lowest_scores_and_never_adds(batch, fraction, compact):
    mask = G2TP(fraction=fraction, compact=compact).train_mask(batch).check(batch)
    live = np.concatenate(_live(batch))
    keep = np.concatenate(mask.keep)
    assert not (keep & ~live).any()
    assert live.sum() - keep.sum() == int(np.floor(fraction * live.sum()))
    scores = np.concatenate([abs(a) * (1 - np.exp(lp)) for a, lp in zip(batch.advantage, batch.logprobs)])
    pruned = live & ~keep
    if pruned.any() and keep.any():
        assert scores[pruned].max() <= scores[keep].min()
    assert (mask.computed <= batch.response_len).all() and (mask.loss_tokens <= mask.computed).all()
    if not compact:
        assert (mask.computed == batch.response_len).all()


@settings(max_examples=60, deadline=None)
@given(token_batches(), st.integers(1, 12), st.floats(0, 2))
def test_entropy_prune_drops_exactly_the_low_surprisal_windows(batch, window, threshold):
    mask = EntropyPrune(window=window, threshold=threshold).train_mask(batch).check(batch)
    for i, lp in enumerate(batch.logprobs):
        for start in range(0, len(lp), window):
            low = (-lp[start:start + window]).mean() < threshold
            kept = mask.keep[i][start:start + window]
            assert not kept.any() if low else (kept == _live(batch)[i][start:start + window]).all()
        kept_at = np.flatnonzero(mask.keep[i])
        assert mask.computed[i] == (kept_at[-1] + 1 if len(kept_at) else 0)  # compacted: cut after the last kept


@settings(max_examples=40, deadline=None)
@given(token_batches(), st.floats(0, 0.9), st.integers(1, 8), st.floats(0, 1))
def test_composed_masks_keep_what_every_member_keeps(batch, fraction, window, threshold):
    a, b = G2TP(fraction=fraction), EntropyPrune(window=window, threshold=threshold, compact=False)
    both = (a + b).train_mask(batch).check(batch)
    for ka, kb, k in zip(g2tp_keep(batch, fraction), entropy_keep(batch, window, threshold), both.keep):
        np.testing.assert_array_equal(k, ka & kb)
    # g2tp compacts, so the composition is cut after the last token both keep
    np.testing.assert_array_equal(both.computed, TrainMask.from_keep(both.keep).computed)


def test_mask_check_refuses_a_mask_that_adds():
    batch = TrainBatch(0, np.array([3]), np.array([4]), np.array([1.0]), np.array([0]), (np.zeros(4),),
                       (np.array([True, True, False, True]),))
    with pytest.raises(ValueError, match="outside"):
        TrainMask.from_keep([np.array([True, True, True, False])]).check(batch)
    with pytest.raises(ValueError, match="loss_tokens <= computed"):
        TrainMask.from_counts([5], [1]).check(batch)


@pytest.mark.parametrize("spec, message", [
    ("g2tp(fraction=1.0)", "fraction"), ("g2tp(compact=1)", "compact"), ("g2tp(computed_fraction=0)", "computed_fraction"),
    ("entropy_prune(window=0)", "window"), ("entropy_prune(threshold=-1)", "threshold"),
    ("entropy_prune(pruned_fraction=2)", "pruned_fraction"),
])
def test_parameters_are_validated(spec, message):
    with pytest.raises(ValueError, match=message):
        make_policy(spec)


def test_without_a_matching_measurement_the_simulator_asks_for_one(tmp_path):
    batch = TrainBatch(0, np.array([3]), np.array([4]), np.array([1.0]), np.array([0]))
    with pytest.raises(ValueError, match="no measurement of g2tp"):
        G2TP(fraction=0.2).train_mask(batch)
    assert G2TP(fraction=0.2, computed_fraction=0.9).train_mask(batch) is not None
    with pytest.raises(ValueError, match="does not exist"):
        EntropyPrune(measurement=str(tmp_path / "none.json")).train_mask(batch)


# -- the simulator -----------------------------------------------------------------------------------


def _groups(rng, n_groups, group_size=4):
    groups, rid = [], 0
    for g in range(n_groups):
        members = []
        for k in range(group_size):
            r = Request(rid=rid, group_id=g, step=0, prompt_id=g, sample_idx=k, prompt_len=int(rng.integers(1, 200)),
                        max_tokens=4096)
            r.generated, r.reward = int(rng.integers(1, 4096)), float(rng.integers(0, 2))
            members.append(r)
            rid += 1
        groups.append(Group(g, 0, members))
    return groups


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 12), st.integers(0, 2**16), st.floats(0.05, 1), st.floats(0, 1), st.sampled_from([1, 8, 64]))
def test_sim_prices_only_the_computed_tokens_and_never_more(n_groups, seed, computed, pruned, devices):
    groups = _groups(np.random.default_rng(seed), n_groups)
    model = AnalyticTrainCost()
    plain = SimTrainer(None, model, n_devices=devices).train(groups, 0)
    policy = G2TP(fraction=min(pruned, 0.95), computed_fraction=computed)
    trainer = SimTrainer(None, model, n_devices=devices)
    trainer.set_train_mask(policy.train_mask)
    m = trainer.train(groups, 0)
    assert m["seconds"] <= plain["seconds"] + 1e-9
    assert m["pruning_saved_seconds"] == pytest.approx(plain["seconds"] - m["seconds"], abs=1e-9)
    batch = sim_batch(groups, 0)
    mask = policy.train_mask(batch)
    kept = mask.computed > 0
    priced = model.phases(batch.prompt_len[kept] + mask.computed[kept], batch.prompt_len[kept], devices, collocated=True)
    assert m["seconds"] == pytest.approx(min(priced.total, plain["seconds"]))
    assert m["loss_tokens_after"] <= m["loss_tokens_before"] and m["forward_tokens_after"] <= m["forward_tokens_before"]


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 10), st.integers(0, 2**16), st.floats(0.05, 1), st.floats(0, 1))
def test_measured_mask_removes_at_most_the_measured_share(n_groups, seed, computed, pruned):
    batch = sim_batch(_groups(np.random.default_rng(seed), n_groups), 0)
    mask = measured_mask(batch, computed, pruned).check(batch)
    total = (batch.prompt_len + batch.response_len).sum()
    after = (batch.prompt_len + mask.computed)[mask.computed > 0].sum()
    assert after >= computed * total - 1 - len(batch)  # rounded down per sequence: a token each at most
    assert after <= total


def test_a_trainer_that_cannot_prune_refuses_the_policy():
    from lssim.loop.controller import Controller, RunConfig
    from lssim.analysis.replay import SimSetup
    from lssim.sim.world import EngineConfig, SimEngine
    from lssim.traces.synth import SynthConfig, synthesize
    from lssim.traces.workload import Workload

    from lssim.loop.contracts import Trainer

    class Plain(Trainer):  # no set_train_mask of its own: the contract's answer, False
        def train(self, groups, step):
            return {}

    workload = Workload(synthesize(SynthConfig(n_prompts=8, steps=2, prompts_per_step=4, group_size=2, max_tokens=256)))
    engine = SimEngine(workload, SimSetup().cost_model(), EngineConfig(n_instances=1))
    with pytest.raises(ValueError, match="train_mask"):
        Controller(engine, Plain(), workload, make_policy("g2tp"), RunConfig(steps=1, groups_per_step=4, group_size=2, max_tokens=256))


def test_replay_reports_what_pruning_saved_and_leaves_the_rollout_alone(tmp_path, capsys):
    from lssim.cli import main

    main(["replay", "traces/math7b.parquet", "--policy", "hadb", "--policy", "hadb+g2tp", "--policy", "entropy_prune",
          "--steps", "3", "--json"])
    out = json.loads(capsys.readouterr().out)
    hadb, pruned, entropy = out["hadb"], out["hadb+g2tp"], out["entropy_prune"]
    assert pruned["rollout_seconds"] == pytest.approx(hadb["rollout_seconds"])  # pruning is training-side only
    assert pruned["pruned_loss_fraction"] == pytest.approx(0.4, abs=0.01)
    assert 0 < pruned["train_seconds_saved"] == pytest.approx(hadb["train_seconds"] - pruned["train_seconds"], rel=1e-6)
    assert pruned["computed_token_fraction"] < 1 and entropy["computed_token_fraction"] < pruned["computed_token_fraction"]
    assert entropy["train_seconds"] < hadb["train_seconds"] or entropy["train_seconds_saved"] > 0


# -- the real trainer ----------------------------------------------------------------------------------


def _token_groups(rng, n_groups=5, vocab=18):
    prompts, groups = {}, []
    for g in range(n_groups):
        prompts[g] = [1] + rng.integers(4, vocab, size=5).tolist()
        members = []
        for k in range(4):
            n = int(rng.integers(4, 40))
            r = Request(rid=4 * g + k, group_id=g, step=0, prompt_id=g, sample_idx=k, prompt_len=6, max_tokens=n)
            r.tokens, r.generated, r.reward = rng.integers(4, vocab, size=n).tolist(), n, float(k % 2)
            r.signals["logprobs"] = np.where(rng.random(n) < 0.6, -1e-3, -rng.exponential(1.0, n)).tolist()
            members.append(r)
        groups.append(Group(g, 0, members))
    return groups, prompts


class _Prompts:
    def __init__(self, tokens):
        self.tokens = tokens

    def prompt_tokens(self, pid):
        return self.tokens[pid]


@pytest.mark.parametrize("spec", ["g2tp", "entropy_prune(window=4, threshold=0.05)", "g2tp(compact=False)+entropy_prune(window=4)"])
def test_the_real_trainer_trains_exactly_the_tokens_the_policy_kept(real_model_dir, spec):
    pytest.importorskip("torch")
    from real_backend.trainer import GRPOTrainer

    groups, prompts = _token_groups(np.random.default_rng(1))
    trainer = GRPOTrainer(str(real_model_dir), None, _Prompts(prompts), threads=1)
    full = trainer._samples(groups, 0)
    policy = make_policy(spec)
    trainer.set_train_mask(policy.train_mask)
    pruned = trainer._samples(groups, 0)
    batch = TrainBatch(0, np.array([len(s.prompt) for s in full]), np.array([len(s.response) for s in full]),
                       np.array([s.advantage for s in full]), np.array([s.group for s in full]),
                       tuple(np.array(s.behaviour) for s in full), tuple(np.array(s.mask) > 0 for s in full))
    mask = policy.train_mask(batch)
    kept = [i for i in range(len(full)) if mask.computed[i] > 0]
    assert len(pruned) == len(kept) and len(kept) < len(full) or (mask.computed < batch.response_len).any()
    for s, i in zip(pruned, kept):
        assert len(s.response) == mask.computed[i] and s.response == full[i].response[:mask.computed[i]]
        np.testing.assert_array_equal(np.array(s.mask) > 0, mask.keep[i][:mask.computed[i]])
    assert trainer.last_pruning["loss_tokens_after"] == sum(s.n_loss for s in pruned) == int(mask.loss_tokens.sum())


@pytest.mark.real
def test_g2tp_runs_through_the_real_backend(vllm_engine, real_model_dir, tmp_path):
    from lssim.loop.controller import RunConfig
    from real_backend.world import RealSetup, prepare, run_real

    setup = RealSetup(model_dir=str(real_model_dir), n_prompts=8)
    config = RunConfig(steps=2, groups_per_step=2, group_size=4, max_tokens=48, seed=0)
    prompts, policy = prepare(setup, "hadb+g2tp", config)
    prompts.reward = lambda r: float(r.sample_idx % 2 == 0)  # signal in every group, whatever the model
    result = run_real(setup, policy, config, tmp_path / "run", engine=vllm_engine, prompts=prompts, checkpoint=False)
    s = result.steps
    assert len(s) == 2 and (s["trainer_optimizer_steps"] > 0).all()
    assert s["trainer_pruned_loss_fraction"].between(0.35, 0.45).all()  # floor(0.4 x tokens) of each batch
    assert (s["trainer_loss_tokens_after"] < s["trainer_loss_tokens_before"]).all()
    assert (s["trainer_forward_tokens_after"] <= s["trainer_forward_tokens_before"]).all()


# -- segment's value bridging --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def carried_workload():
    from lssim.traces.synth import SynthConfig, synthesize
    from lssim.traces.workload import Workload

    trace = synthesize(SynthConfig(n_prompts=64, steps=6, prompts_per_step=16, group_size=4, max_tokens=4096, seed=3))
    return Workload(trace, seed=3)


def test_bridging_trains_each_token_once_earlier_and_leaves_the_rollout_alone(carried_workload):
    from lssim.loop.controller import RunConfig
    from lssim.analysis.replay import SimSetup, simulate

    setup = SimSetup(n_instances=2, max_num_seqs=64, kv_capacity_tokens=200_000)
    config = RunConfig(steps=40, groups_per_step=16, group_size=4, max_tokens=4096, total_groups=64)  # runs until none is carried
    plain = simulate(carried_workload, "segment(window=512)", setup, seed=0, config=config)
    bridged = simulate(carried_workload, "segment(window=512, bridge=True)", setup, seed=0, config=config)
    assert plain.steps["carried_out"].sum() > 0  # there is something to bridge
    # Bridging is training-side: the rollout and the books are the same run.
    for col in ("response_len", "finish_reason", "trained", "train_step"):
        assert bridged.responses[col].tolist() == plain.responses[col].tolist()
    assert bridged.steps["rollout_seconds"].tolist() == pytest.approx(plain.steps["rollout_seconds"].tolist())
    s, r = bridged.steps, bridged.responses
    assert s["trainer_bridged_tokens"].sum() > 0
    # every token in the loss once: segments while carried, the rest when the group completes
    assert s["carried_out"].iloc[-1] == 0 and r["trained"].all()
    assert s["trainer_loss_tokens_after"].sum() == r["response_len"].sum()
    # re-running each bridged response's prefix is what it costs
    assert s["train_seconds"].sum() > plain.steps["train_seconds"].sum()


def test_bridged_groups_carry_bootstrapped_values_and_train_only_new_segments():
    seg = make_policy("segment(window=8, bridge=True)")
    members = []
    for k, (gen, done, reward) in enumerate([(10, True, 1.0), (12, True, 0.0), (20, False, float("nan"))]):
        r = Request(rid=k, group_id=0, step=0, prompt_id=7, sample_idx=k, prompt_len=5, max_tokens=64)
        r.generated, r.reward, r.finish_reason = gen, reward, "stop" if done else ""
        members.append(r)
    assert seg.bridge([Group(7, 0, members)], step=0) == []  # no history, no value: nothing bridged
    # past responses: prompt 7 ran 25 tokens (reward 0) and 40 (reward 1); another prompt ran 50 (reward 1)
    seg.end_step(_outcome(step=-1, prompt_id=[7, 7, 3], response_len=[25, 40, 50], reward=[0.0, 1.0, 1.0]))
    (group,) = seg.bridge([Group(7, 0, members)], step=0)
    assert [m.reward for m in group.requests] == [1.0, 0.0, 0.5]  # the prompt's past responses longer than 20
    assert members[2].reward != members[2].reward  # the request itself is untouched (a copy carries the value)
    batch = sim_batch([group], 0)
    mask = seg.train_mask(batch).check(batch)
    assert mask.computed.tolist() == [0, 0, 20] and mask.loss_tokens.tolist() == [0, 0, 20]  # ended: baseline only
    seg.end_step(_outcome(step=0))
    members[2].generated = 30  # carried again: 10 more tokens
    (group,) = seg.bridge([Group(7, 0, members)], step=1)
    assert group.requests[2].reward == 1.0  # only the 40-token response ran longer than 30
    mask = seg.train_mask(sim_batch([group], 1))
    assert mask.computed.tolist() == [0, 0, 30] and mask.loss_tokens.tolist() == [0, 0, 10]
    seg.end_step(_outcome(step=1))
    members[2].finish_reason, members[2].reward, members[2].generated = "stop", 1.0, 35
    mask = seg.train_mask(sim_batch([Group(7, 0, members)], 2))  # completed: the prefix stays out of the loss
    assert mask.computed.tolist() == [10, 12, 35] and mask.loss_tokens.tolist() == [10, 12, 5]


def _outcome(step, prompt_id=(), response_len=(), reward=()):
    from lssim.loop.policy import StepOutcome

    n = len(prompt_id)
    return StepOutcome(step, np.array(prompt_id, int), np.arange(n), np.array(response_len, int), np.full(n, 64),
                       np.array(reward, float), np.array(["stop"] * n, dtype=str), 1.0, np.array(prompt_id, int))


def test_segment_without_bridging_has_no_training_opinion():
    assert not make_policy("segment").overrides("train_mask") and not make_policy("segment").overrides("bridge")
    assert make_policy("segment(bridge=True)").overrides("train_mask")
    assert not Compose([make_policy("hadb"), make_policy("segment")]).overrides("train_mask")
    with pytest.raises(ValueError, match="bridge"):
        make_policy("segment(bridge=1)")


def test_the_real_trainer_trains_a_bridged_segment_with_its_value(real_model_dir):
    pytest.importorskip("torch")
    from real_backend.trainer import GRPOTrainer

    groups, prompts = _token_groups(np.random.default_rng(2), n_groups=1)
    members = groups[0].requests
    members[3].finish_reason, members[3].reward = "", float("nan")  # still carried: generated so far, no reward
    members[0].reward, members[1].reward, members[2].reward = 1.0, 0.0, 1.0
    seg = make_policy("segment(window=8, bridge=True)")
    seg.end_step(_outcome(-1, [0, 0, 0], [100, 100, 2], [0.0, 0.0, 1.0]))  # the prompt's longer responses failed
    trainer = GRPOTrainer(str(real_model_dir), None, _Prompts(prompts), threads=1)
    trainer.set_train_mask(seg.train_mask)
    for r in members[:3]:
        r.finish_reason = "stop"
    bridged = seg.bridge([Group(0, 0, members)], step=0)
    samples = trainer._samples(bridged, 0)
    assert [s.rid for s in samples] == [members[3].rid]  # the ended members give the baseline only
    (s,) = samples
    rewards = np.array([1.0, 0.0, 1.0, 0.0])  # the value: the mean reward of the prompt's longer responses
    assert s.advantage == pytest.approx((0.0 - rewards.mean()) / (rewards.std() + trainer.eps)) and s.advantage < 0
    assert s.n_loss == members[3].generated and trainer.last_pruning["bridged_tokens"] == members[3].generated
    metrics = trainer.train(bridged, 0)
    assert metrics["optimizer_steps"] == 1 and metrics["bridged_sequences"] == 1


@pytest.mark.real
def test_segment_bridging_runs_through_the_real_backend(vllm_engine, real_model_dir, tmp_path):
    from lssim.loop.controller import RunConfig
    from real_backend.world import RealSetup, prepare, run_real

    setup = RealSetup(model_dir=str(real_model_dir), n_prompts=8)
    # The reference model's responses: median ~55 tokens (traces/real_cpu_baseline.parquet). A window of 64 carries
    # some and lets groups of two complete (a step whose every group stays open leaves no trace row to write).
    # Values come from responses that ended longer than a carried one is: none at step 0, some from step 1 on.
    config = RunConfig(steps=4, groups_per_step=6, group_size=2, max_tokens=192, seed=0)
    prompts, policy = prepare(setup, "segment(window=64, checks=2, bridge=True)", config)
    prompts.reward = lambda r: float(r.sample_idx % 2 == 0)
    result = run_real(setup, policy, config, tmp_path / "run", engine=vllm_engine, prompts=prompts, checkpoint=False)
    s = result.steps
    assert s["carried_out"].sum() > 0  # something was carried, so something could be bridged
    assert s["trainer_bridged_tokens"].fillna(0).sum() > 0
