"""Shared fixtures. `real_engine` starts ONE vLLM engine for the whole session (about 30 s on this CPU),
shared by every test that needs it; each run gets a fresh trainer, which first pushes the checkpoint's
weights into the engine, so tests do not depend on their order."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def _complete(model_dir: Path) -> bool:
    return all((model_dir / f).is_file() for f in ("config.json", "model.safetensors", "tokenizer.json"))


def _tiny_random_model(path: Path) -> Path:
    """A randomly initialized Llama of the reference model's shape with the task's tokenizer (used only while
    real_backend/reference_model/ does not exist)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from real_backend import task

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(task.VOCAB), hidden_size=128, intermediate_size=384, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=1024, tie_word_embeddings=True,
                      bos_token_id=task.BOS_ID, eos_token_id=task.EOS_ID, pad_token_id=task.PAD_ID)
    model = LlamaForCausalLM(cfg)
    model.generation_config.eos_token_id = task.EOS_ID
    model.save_pretrained(path, safe_serialization=True)
    task.build_tokenizer().save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def real_model_dir(tmp_path_factory) -> Path:
    """LSSIM_REAL_MODEL if set, else the reference model, else a tiny random model of the same kind."""
    from real_backend import task

    override = os.environ.get("LSSIM_REAL_MODEL")
    if override:
        return Path(override)
    if _complete(task.MODEL_DIR):
        return task.MODEL_DIR
    return _tiny_random_model(tmp_path_factory.mktemp("tiny_model"))


@pytest.fixture(scope="session")
def real_engine(real_model_dir):
    import real_backend.engine  # noqa: F401  (sets vLLM's logging up before vLLM is imported)

    pytest.importorskip("vllm")
    from real_backend.prompts import TaskPrompts
    from real_backend.world import RealSetup, start_engine

    setup = RealSetup(model_dir=str(real_model_dir))
    prompts = TaskPrompts.from_files(setup.prompts_path, setup.model_dir)
    engine = start_engine(setup, prompts)
    yield engine
    engine.close()


@pytest.fixture
def vllm_engine(real_engine):
    """The session's engine, checked to be left with nothing in flight."""
    yield real_engine
    leftover = len(real_engine._live)
    real_engine.abort_all()
    real_engine.set_progress_interval(None)
    assert leftover == 0, f"{leftover} requests left in flight"


class _Lent:
    """The session's engine, lent to one CLI run: everything passes through but close()."""

    def __init__(self, engine):
        object.__setattr__(self, "_engine", engine)

    def __getattr__(self, name):
        return getattr(self._engine, name)

    def __setattr__(self, name, value):
        setattr(self._engine, name, value)

    def close(self) -> None:
        pass


@pytest.fixture
def lent_engine(vllm_engine, monkeypatch):
    """The session's engine, which `lssim real` runs in this test start (real_backend.world.start_engine) instead
    of a vLLM engine of their own, and do not close."""
    from real_backend import world

    monkeypatch.setattr(world, "start_engine", lambda *a, **k: _Lent(vllm_engine))
    return vllm_engine
