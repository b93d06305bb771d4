"""The trainer's passes in a worker process of their own (real_backend.train_compute.ProcessCompute) make the update
the trainer makes in one process: whole, streamed in pieces (hybrid), with log-probs recomputed, over several steps.
No vLLM: the reference model trains on synthetic groups."""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tests.test_real_modes_stream import _assert_same_update, _groups, _step, _trainer  # noqa: E402


@pytest.fixture
def process_trainer(real_model_dir):
    made = []

    def make(prompts, **kw):
        made.append(_trainer(real_model_dir, prompts, process=True, **kw))
        return made[-1]

    yield make
    for trainer in made:
        trainer.close()


@pytest.mark.parametrize("recompute", [False, True])
def test_a_trainer_process_makes_the_update_one_process_makes(real_model_dir, process_trainer, recompute):
    groups, prompts = _groups(np.random.default_rng(0))
    here = _trainer(real_model_dir, prompts, recompute_logprobs=recompute)
    there = process_trainer(prompts, recompute_logprobs=recompute)
    for step in range(2):  # the second from the weights and AdamW moments the first left: the worker sees the steps
        a, b = _step(here, groups, fed=[], step=step), _step(there, groups, fed=[], step=step)
        _assert_same_update(a, b)
    assert there.rng.bit_generator.state == here.rng.bit_generator.state


def test_a_trainer_process_streams_pieces_as_one_process_does(real_model_dir, process_trainer):
    groups, prompts = _groups(np.random.default_rng(1))
    fed = [groups[i] for i in (3, 0, 2)]
    here = _step(_trainer(real_model_dir, prompts), groups, fed=fed)
    there = _step(process_trainer(prompts), groups, fed=fed)
    assert there[0].metrics["streamed_groups"] == 3
    _assert_same_update(here, there)


def test_several_mini_batches_in_a_trainer_process(real_model_dir, process_trainer):
    groups, prompts = _groups(np.random.default_rng(2))
    a = _step(_trainer(real_model_dir, prompts, mini_batches=2), groups, fed=[])
    b = _step(process_trainer(prompts, mini_batches=2), groups, fed=[])
    assert b[0].metrics["optimizer_steps"] == 2
    _assert_same_update(a, b)


def test_a_failure_in_the_trainer_process_is_raised_with_its_traceback(process_trainer):
    groups, prompts = _groups(np.random.default_rng(3))
    trainer = process_trainer(prompts)
    from real_backend.trainer import Sample

    bad = Sample([1, 5], [6, 7, 8], [-1.0, -1.0, -1.0], [1.0, 1.0, 1.0], 0.5, 0)
    bad.prompt = None  # the worker cannot build its micro-batch
    with pytest.raises(RuntimeError, match="(?s)the trainer process failed to accumulate:.*TypeError"):
        trainer.compute.accumulate([bad], 1.0)
    trainer.update(groups, 0)  # the worker goes on serving


def test_a_dead_trainer_process_is_said_and_a_closed_one_refuses(process_trainer):
    groups, prompts = _groups(np.random.default_rng(4))
    trainer = process_trainer(prompts)
    os.kill(trainer.compute._process.pid, signal.SIGKILL)
    trainer.compute._process.join(timeout=30)
    with pytest.raises(RuntimeError, match="the trainer process ended"):
        trainer.update(groups, 0)
    other = process_trainer(prompts)
    other.close()
    assert not other.compute._process.is_alive()
    with pytest.raises(RuntimeError, match="closed"):
        other.update(groups, 0)


def test_a_trainer_process_is_for_the_cpu(real_model_dir):
    from real_backend.world import RealSetup

    with pytest.raises(ValueError, match="trainer_process is for a trainer on the CPU"):
        RealSetup(model_dir=str(real_model_dir), trainer_process=True, trainer_device="cuda").check()


def test_the_first_passes_on_a_device_warm_it_up_and_change_nothing(real_model_dir, monkeypatch):
    """The throwaway pass before a process's first step (LocalCompute.warm_up): once per device and process, and
    the weights, their gradients and torch's random stream are as before it."""
    from transformers import AutoModelForCausalLM

    from real_backend import train_compute

    model = AutoModelForCausalLM.from_pretrained(real_model_dir)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    monkeypatch.setattr(train_compute, "_warmed_devices", set())
    warmed = []
    real_warm_up = train_compute.LocalCompute.warm_up
    monkeypatch.setattr(train_compute.LocalCompute, "warm_up",
                        lambda self, shape=(2, 16): (warmed.append(shape), real_warm_up(self, shape)))
    torch.manual_seed(3)
    expected = torch.rand(4)
    torch.manual_seed(3)
    train_compute.LocalCompute(model, pad_id=0, clip=0.2, micro_batch_tokens=1024)
    train_compute.LocalCompute(model, pad_id=0, clip=0.2, micro_batch_tokens=1024)  # the device is warm already
    assert warmed == [(2, 16)]
    assert torch.equal(torch.rand(4), expected)  # the random stream goes on as if nothing had run
    assert all(p.grad is None for p in model.parameters())
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
