"""Hybrid's streamed update on the real trainer (real_backend.train_stream): groups fed to GRPOTrainer as they finish,
then the step's batch, give the update the whole batch gives at once. No vLLM: the reference model trains on
synthetic groups, on the trainer's own thread."""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from lssim.loop.core import Group, Request  # noqa: E402

LR = 1e-3


class _Prompts:
    def __init__(self, tokens):
        self.tokens = tokens

    def prompt_tokens(self, pid):
        return self.tokens[pid]


def _groups(rng, n_groups=5, vocab=18):
    """Groups of 4 responses of 5-60 tokens; one group with equal rewards (no signal: never trained)."""
    prompts, groups = {}, []
    for g in range(n_groups):
        prompts[g] = [1] + rng.integers(4, vocab, size=int(rng.integers(3, 9))).tolist()
        members = []
        for k in range(4):
            n = int(rng.integers(5, 60))
            r = Request(rid=4 * g + k, group_id=g, step=0, prompt_id=g, sample_idx=k, prompt_len=len(prompts[g]), max_tokens=n)
            r.tokens, r.generated = rng.integers(4, vocab, size=n).tolist(), n
            r.reward = 1.0 if g == 2 else float(rng.integers(0, 2) if k > 1 else k)
            r.signals["logprobs"] = (-rng.exponential(1.0, n)).tolist()
            members.append(r)
        groups.append(Group(prompt_id=g, step=0, requests=members))
    return groups, prompts


def _trainer(model_dir, prompts, **kw):
    from real_backend.trainer import GRPOTrainer

    return GRPOTrainer(str(model_dir), None, _Prompts(prompts), lr=LR, threads=1, seed=3, **kw)


def _step(trainer, groups, fed, step=0):
    """Step `step` through the lane as hybrid runs it: `fed` streamed in during the rollout, then the batch."""
    for g in fed:
        trainer.feed(g, step)
    job = trainer.start(groups, step)
    job.wait(None)
    grads = {n: p.grad.detach().clone() for n, p in trainer.model.named_parameters() if p.grad is not None}
    return job, grads, {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}


def _assert_same_update(a, b, grad_atol=1e-7, weight_atol=1e-3 * LR):
    (job_a, grads_a, weights_a), (job_b, grads_b, weights_b) = a, b
    assert grads_a.keys() == grads_b.keys() and grads_a
    for name in grads_a:  # the clipped gradient the optimizer stepped with
        torch.testing.assert_close(grads_a[name], grads_b[name], rtol=1e-4, atol=grad_atol)
    # Adam's first step moves a weight by lr * g / (|g| + 1e-8): where |g| is near that eps, a rounding-sized change of
    # g changes the step by a share of lr, so the weights are compared where the gradient is well above it.
    for name, grad in grads_a.items():
        clear = grad.abs() > 1e-6
        torch.testing.assert_close(weights_a[name][clear], weights_b[name][clear], rtol=0, atol=weight_atol)
    assert weights_a.keys() == weights_b.keys()
    for key in ("loss", "grad_norm", "clip_fraction", "logprob_gap"):
        assert job_a.metrics[key] == pytest.approx(job_b.metrics[key], rel=1e-4, abs=1e-7), key
    for key in ("samples", "tokens", "groups_with_signal", "optimizer_steps"):
        assert job_a.metrics[key] == job_b.metrics[key], key


@pytest.mark.parametrize("recompute", [False, True])
def test_streamed_groups_give_the_whole_batch_update(real_model_dir, recompute):
    groups, prompts = _groups(np.random.default_rng(0))
    whole = _step(_trainer(real_model_dir, prompts, recompute_logprobs=recompute), groups, fed=[])
    streamer = _trainer(real_model_dir, prompts, recompute_logprobs=recompute)
    order = [groups[i] for i in (3, 0, 2)]  # in the order they finished; 1 and 4 end with the rollout
    streamed = _step(streamer, groups, fed=order)
    assert whole[0].metrics["streamed_groups"] == 0 and streamed[0].metrics["streamed_groups"] == 3
    # each fed group's piece: its span on the trainer's clock, in the order fed, and its samples
    pieces = json.loads(streamed[0].metrics["pieces"])
    assert json.loads(whole[0].metrics["pieces"]) == [] and len(pieces) == 3
    assert all(start <= end for start, end, _ in pieces)
    assert all(a[1] <= b[0] for a, b in zip(pieces, pieces[1:]))  # one lane: one piece after another
    assert [n for *_, n in pieces] == [4, 4, 0]  # groups 3, 0 and 2 (equal rewards: nothing trained)
    _assert_same_update(whole, streamed)
    # the job's time runs from its first streamed group, before the batch was handed over
    assert streamed[0].start < streamed[0].end and streamed[0].metrics["update_seconds"] > 0
    # and the next step goes on from the same state: the generators drew alike
    assert streamer.rng.bit_generator.state == whole_rng_after(real_model_dir, prompts, groups, recompute)


def whole_rng_after(model_dir, prompts, groups, recompute):
    trainer = _trainer(model_dir, prompts, recompute_logprobs=recompute)
    trainer.update(groups, 0)
    return trainer.rng.bit_generator.state


def test_a_fed_group_left_out_of_the_batch_makes_the_update_start_over(real_model_dir):
    groups, prompts = _groups(np.random.default_rng(1))
    batch = groups[1:]  # the policy's select dropped group 0 after it was streamed
    whole = _step(_trainer(real_model_dir, prompts), batch, fed=[])
    streamed = _step(_trainer(real_model_dir, prompts), batch, fed=groups[:3])
    assert streamed[0].metrics["streamed_groups"] == 0
    _assert_same_update(whole, streamed)


def test_two_steps_streamed_equal_two_steps_whole(real_model_dir):
    """The optimizer's state after a streamed step is the whole step's: the second step agrees too. (SGD with
    momentum here: AdamW's step divides by |g| + eps, which turns rounding on a gradient near eps into a share of
    lr, and two steps compound it; the gradients are what streaming changes.)"""
    first, prompts = _groups(np.random.default_rng(2))
    second, more = _groups(np.random.default_rng(3))
    for g in second:
        for r in g.requests:
            r.prompt_id, r.step = r.prompt_id + 10, 1
        g.prompt_id, g.step = g.prompt_id + 10, 1
    prompts.update({k + 10: v for k, v in more.items()})
    whole, streamer = _trainer(real_model_dir, prompts), _trainer(real_model_dir, prompts)
    for trainer in (whole, streamer):
        trainer.optimizer = torch.optim.SGD(trainer.model.parameters(), lr=LR, momentum=0.9)
    _step(whole, first, fed=[])
    _step(streamer, first, fed=first[:2])
    _assert_same_update(_step(whole, second, fed=[], step=1), _step(streamer, second, fed=second[::-1], step=1),
                        weight_atol=1e-8)


def test_several_mini_batches_do_not_stream(real_model_dir):
    groups, prompts = _groups(np.random.default_rng(4))
    trainer = _trainer(real_model_dir, prompts, mini_batches=2)
    job, _, _ = _step(trainer, groups, fed=groups)
    assert job.metrics["streamed_groups"] == 0 and job.metrics["optimizer_steps"] == 2


def test_a_fed_group_that_fails_fails_the_update(real_model_dir):
    groups, prompts = _groups(np.random.default_rng(6))
    broken = groups[0].requests[0]
    broken.signals["logprobs"] = broken.signals["logprobs"][:-1]  # one behaviour log-prob short
    trainer = _trainer(real_model_dir, prompts)
    trainer.feed(groups[0], 0)
    job = trainer.start(groups, 0)
    with pytest.raises(ValueError, match=f"request {broken.rid}: .* behaviour logprobs"):
        job.wait(None)


def test_stream_group_on_the_callers_thread_sums_the_whole_batchs_gradient_unnormalised(real_model_dir):
    """The public piece (what `feed` runs on the lane, and real_backend.host_sharing times beside the engine): every
    group streamed in by hand, divided by the loss tokens, is the whole update's gradient (no clipping here)."""
    from real_backend.train_stream import GradientStream

    groups, prompts = _groups(np.random.default_rng(7))
    whole = _step(_trainer(real_model_dir, prompts, max_grad_norm=1e9), groups, fed=[])
    trainer, stream = _trainer(real_model_dir, prompts, max_grad_norm=1e9), GradientStream(0)
    for g in groups:
        trainer.stream_group(stream, g)
    assert (stream.samples, stream.tokens) == (whole[0].metrics["samples"], whole[0].metrics["tokens"])
    assert stream.signal_groups == whole[0].metrics["groups_with_signal"] == len(groups) - 1
    assert stream.keys == {tuple(r.rid for r in g.requests) for g in groups} and stream.seconds > 0
    streamed = {n: p.grad / stream.tokens for n, p in trainer.model.named_parameters() if p.grad is not None}
    assert streamed.keys() == whole[1].keys()
    for name, grad in whole[1].items():
        torch.testing.assert_close(streamed[name], grad, rtol=1e-4, atol=1e-7)


def test_host_sharings_pieces_alone_time_each_group_through_the_trainers_piece(real_model_dir):
    from real_backend.host_sharing import _Streamed

    trainer = _trainer(real_model_dir, {})
    vocab = int(trainer.model.config.vocab_size)
    streamed = _Streamed(None, trainer, np.random.default_rng(0), [12, 30, 7, 20, 9, 15, 40, 5, 11], 4, vocab)
    rows = streamed.alone()
    assert [(r["phase"], r["piece"]) for r in rows] == [("piece_alone", 0), ("piece_alone", 1)]  # the 9th: no group
    assert all(r["seconds"] > 0 for r in rows)
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in trainer.model.parameters())
