"""Tests for real_backend.token_pruning (G2TP, micro-entropy pruning, compaction) and the factors the simulator
takes from its measurement (lssim.sim.training.ScaledTrainCost). No vLLM: the trainer runs on synthetic batches."""

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lssim.sim.training import AnalyticTrainCost, ScaledTrainCost

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "lssim" / "sim" / "data" / "pruning_cpu.json"

torch = pytest.importorskip("torch")
from real_backend.token_pruning import compact_samples, entropy_masks, g2tp_masks  # noqa: E402
from real_backend.trainer import Sample  # noqa: E402


def sample(behaviour, advantage=1.0, mask=None, prompt=(1, 5, 6)):
    n = len(behaviour)
    return Sample(list(prompt), list(range(4, 4 + n)), list(behaviour), list(mask or [1.0] * n), advantage, 0)


logprobs = st.lists(st.floats(-6.0, 0.0), min_size=1, max_size=40)


@settings(max_examples=60, deadline=None)
@given(batch=st.lists(st.tuples(logprobs, st.floats(-3, 3)), min_size=1, max_size=8), fraction=st.floats(0, 0.95))
def test_g2tp_prunes_the_lowest_scores(batch, fraction):
    samples = [sample(lp, adv, mask=[float(i % 3 != 0) for i in range(len(lp))]) for lp, adv in batch]
    masks = g2tp_masks(samples, fraction)
    live = np.concatenate([np.asarray(s.mask) > 0 for s in samples])
    keep = np.concatenate(masks) > 0
    assert not (keep & ~live).any()  # a token out of the loss stays out
    assert (live & ~keep).sum() == int(np.floor(fraction * live.sum()))
    scores = np.concatenate([abs(s.advantage) * (1 - np.exp(s.behaviour)) for s in samples])
    if (live & ~keep).any() and (live & keep).any():
        assert scores[live & ~keep].max() <= scores[live & keep].min()


def test_entropy_pruning_masks_low_surprisal_windows():
    s = sample([-0.001] * 4 + [-2.0] * 4 + [-0.001] * 2)
    (mask,) = entropy_masks([s], window=4, threshold=0.05)
    assert mask.tolist() == [0] * 4 + [1] * 4 + [0] * 2
    with pytest.raises(ValueError, match="window"):
        entropy_masks([s], window=0, threshold=0.1)


def test_compaction_drops_empty_samples_and_cuts_pruned_suffixes():
    a = sample([-1.0] * 5, mask=[1, 0, 1, 0, 0])
    b = sample([-1.0] * 3, mask=[0, 0, 0])
    out = compact_samples([a, b])
    assert len(out) == 1
    assert out[0].response == a.response[:3] and out[0].mask == [1, 0, 1] and out[0].behaviour == a.behaviour[:3]
    assert out[0].n_loss == a.n_loss


def _batch(rng, n_groups=6, vocab=18):
    from lssim.loop.core import Group, Request

    prompts, groups = {}, []
    for g in range(n_groups):
        prompts[g] = [1] + rng.integers(4, vocab, size=6).tolist()
        members = []
        for k in range(4):
            n = int(rng.integers(5, 60))
            r = Request(rid=4 * g + k, group_id=g, step=0, prompt_id=g, sample_idx=k, prompt_len=7, max_tokens=n)
            r.tokens, r.generated, r.reward = rng.integers(4, vocab, size=n).tolist(), n, float(k % 2 if g else k == 0)
            r.signals["logprobs"] = np.where(rng.random(n) < 0.7, -1e-3, -rng.exponential(1.0, n)).tolist()
            members.append(r)
        groups.append(Group(prompt_id=g, step=0, requests=members))
    return groups, prompts


class _Prompts:
    def __init__(self, tokens):
        self.tokens = tokens

    def prompt_tokens(self, pid):
        return self.tokens[pid]


@pytest.mark.parametrize("method", ["g2tp", "entropy"])
def test_compacting_changes_the_time_not_the_update(real_model_dir, method):
    """Masked or compacted, the kept tokens, their advantages and the loss's normalisation are the same: one
    step from the same weights gives the same weights (up to float rounding of other batch shapes)."""
    from real_backend.token_pruning import PruningGRPOTrainer

    groups, tokens = _batch(np.random.default_rng(0))
    lr, trained = 1e-3, {}
    for compact in (False, True):
        tr = PruningGRPOTrainer(str(real_model_dir), None, _Prompts(tokens), method=method, fraction=0.5,
                                threshold=0.05, window=8, compact=compact, lr=lr, threads=1, recompute_logprobs=True)
        before = {k: v.detach().clone() for k, v in tr.model.state_dict().items()}
        metrics = tr.train(groups, 0)
        trained[compact] = ({k: v.detach() - before[k] for k, v in tr.model.state_dict().items()}, metrics)
    (masked, m0), (compacted, m1) = trained[False], trained[True]
    assert m0["loss_tokens_after"] == m1["loss_tokens_after"] > 0
    assert m1["forward_tokens_after"] < m0["forward_tokens_after"] == m0["forward_tokens_before"]
    assert m0["loss"] == pytest.approx(m1["loss"], rel=1e-4, abs=1e-7)
    # Adam's first step moves each weight by about lr: the two steps agree within 2% of it everywhere.
    assert max(float(masked[k].abs().max()) for k in masked) > 0.5 * lr
    for name in masked:
        torch.testing.assert_close(masked[name], compacted[name], rtol=0, atol=0.02 * lr)


# -- the factors ---------------------------------------------------------------------------------


def test_scaled_cost_scales_forward_and_update_only():
    base = AnalyticTrainCost(reference=True)
    seq, prompt = np.full(64, 3000), np.full(64, 100)
    scaled = ScaledTrainCost(base, logprob_factor=0.5, update_factor=0.8)
    b, s = base.phases(seq, prompt, 8, collocated=True), scaled.phases(seq, prompt, 8, collocated=True)
    assert s.logprob == pytest.approx(0.5 * b.logprob) and s.reference == pytest.approx(0.5 * b.reference)
    assert s.update == pytest.approx(0.8 * b.update) and (s.sync, s.switch) == (b.sync, b.switch)
    assert scaled.micro_batch_seconds(seq) == pytest.approx(0.8 * base.micro_batch_seconds(seq))
    with pytest.raises(ValueError, match="update_factor"):
        ScaledTrainCost(base, update_factor=1.5)


def test_bad_pruning_files(tmp_path):
    base = AnalyticTrainCost()
    with pytest.raises(ValueError, match="does not exist"):
        ScaledTrainCost.from_measurement(base, tmp_path / "none.json", "g2tp-compact")
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"kind": "PruningMeasurement", "variants": {"a": {"update_factor": 0.9}}}))
    with pytest.raises(ValueError, match="no variant 'b'"):
        ScaledTrainCost.from_measurement(base, path, "b")
    with pytest.raises(ValueError, match="logprob_factor"):
        ScaledTrainCost.from_measurement(base, path, "a")


def test_shipped_pruning_measurement():
    """Masking alone saves nothing; compaction saves what its shorter batches predict."""
    payload = json.loads(SHIPPED.read_text())
    v = payload["variants"]
    for name in ("g2tp-mask", "entropy-mask"):
        assert v[name]["computed_token_fraction"] == 1.0
        assert 0.85 < v[name]["update_factor"] < 1.15, name
    for name in ("g2tp-compact", "entropy-compact"):
        assert v[name]["computed_token_fraction"] < 1.0
        assert abs(v[name]["update_factor"] - v[name]["predicted_update_factor"]) < 0.15, name
        model = ScaledTrainCost.from_measurement(AnalyticTrainCost(), SHIPPED, name)
        assert model.update_factor == pytest.approx(min(1.0, v[name]["update_factor"]))


def test_token_basis_prices_a_packing_trainer():
    v = json.loads(SHIPPED.read_text())["variants"]["entropy-compact"]
    model = ScaledTrainCost.from_measurement(AnalyticTrainCost(), SHIPPED, "entropy-compact", basis="tokens")
    assert model.update_factor == model.logprob_factor == pytest.approx(v["computed_token_fraction"])
    # The padded CPU trainer saves less than the tokens it no longer runs: its longest sequences stay.
    assert v["update_factor"] > v["computed_token_fraction"]
    with pytest.raises(ValueError, match="basis"):
        ScaledTrainCost.from_measurement(AnalyticTrainCost(), SHIPPED, "entropy-compact", basis="flops")
