"""spec_tail on the real backend: vLLM's n-gram speculative decoding, its counters and the acceptance rate.

The engine test starts its own engine with speculation (module-scoped, one extra engine start). On the CPU
build of vLLM 0.32 speculation samples correctly only greedily (real_backend/engine.py), so the run here is at
temperature 0. The bad-input tests need no engine.
"""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from lssim.loop.controller import RunConfig
from lssim.loop.core import Speculation

SPEC = "spec_tail(gamma=4, max_batch=8)"


def _prepare(model_dir, policy, **kw):
    from real_backend.world import RealSetup, prepare

    setup = RealSetup(model_dir=str(model_dir), **kw)
    config = RunConfig(steps=2, groups_per_step=4, group_size=4, max_tokens=128, seed=0)
    prompts, built = prepare(setup, policy, config)
    return setup, config, prompts, built


def test_prepare_takes_ngram_and_puts_it_into_the_setup(real_model_dir):
    setup, _, _, built = _prepare(real_model_dir, SPEC, temperature=0.0)
    assert setup.speculation == built.speculation == Speculation(method="ngram", gamma=4, max_batch=8)


def test_prepare_refuses_sampled_speculation_on_the_cpu_build(real_model_dir):
    from real_backend.world import vllm_on_cpu

    if not vllm_on_cpu():
        pytest.skip("not vLLM's CPU build")
    with pytest.raises(ValueError, match="temperature > 0"):
        _prepare(real_model_dir, SPEC)  # temperature 1: not lossless on vLLM 0.32's CPU build (measured)


@pytest.mark.parametrize("policy, words", [("spec_tail(method='layer_skip')", "layer skip"),
                                           ("spec_tail(method='draft', draft_cost=0.1)", "draft model")])
def test_prepare_refuses_what_vllm_cannot_do(real_model_dir, policy, words):
    with pytest.raises(ValueError, match=words):
        _prepare(real_model_dir, policy)


def test_speculation_meta_turns_counters_into_alpha():
    from real_backend.world import speculation_meta

    spec = Speculation(gamma=4)
    counts = {"drafts": 100, "draft_tokens": 400, "accepted_tokens": 50, "accepted_per_position": [30, 12, 6, 2],
              "steps": 40, "generation_tokens": 300}
    meta = speculation_meta(spec, counts)
    assert meta["alpha"] == pytest.approx(Speculation.alpha_from_counts(100, 50, 4))
    assert meta["token_acceptance"] == pytest.approx(50 / 400) and meta["tokens_per_step"] == pytest.approx(7.5)
    assert speculation_meta(spec, {**counts, "drafts": 0, "draft_tokens": 0, "accepted_tokens": 0})["alpha"] is None


@pytest.fixture(scope="module")
def spec_engine(real_model_dir):
    import real_backend.engine  # noqa: F401  (sets vLLM's logging up before vLLM is imported)

    pytest.importorskip("vllm")
    from real_backend.world import start_engine

    setup, _, prompts, _ = _prepare(real_model_dir, SPEC, temperature=0.0)
    engine = start_engine(setup, prompts)
    yield engine
    engine.close()


@pytest.mark.real
def test_spec_tail_real_run(spec_engine, real_model_dir, tmp_path):
    from real_backend.world import run_real

    setup, config, prompts, built = _prepare(real_model_dir, SPEC, temperature=0.0)
    result = run_real(setup, built, config, tmp_path / "run", engine=spec_engine, prompts=prompts)
    steps, responses = result.steps, result.responses
    for _, s in steps.iterrows():  # the books balance
        assert s["responses_in"] == s["finished"] + s["truncated"] + s["policy_stopped"] + s["dropped"] + s["carried_out"]
    assert len(responses) == 2 * 4 * 4
    assert responses["response_len"].between(1, 128).all()
    assert responses["reward"].between(0, 1).all()
    meta = json.loads((tmp_path / "run" / "meta.json").read_text())
    assert meta["status"] == "finished"
    spec = meta["speculation"]
    assert spec["method"] == "ngram" and spec["gamma"] == 4 and spec["drafts"] > 0
    assert 0.0 <= spec["alpha"] <= 1.0 and math.isfinite(spec["alpha"])
    assert spec["accepted_tokens"] <= spec["draft_tokens"] <= 4 * spec["drafts"]
    # speculation is lossless greedily: the model's own greedy answers, which the trained model mostly gets right
    assert responses["reward"].mean() > 0.2
    assert pd.read_parquet(tmp_path / "run" / "trace.parquet").shape[0] == len(responses)


@pytest.mark.real
def test_engine_refuses_a_run_with_other_speculation(spec_engine):
    with pytest.raises(ValueError, match="started with speculation"):
        spec_engine.set_speculation(None)


@pytest.mark.real
def test_tlt_real_run_switches_the_proposer_and_records_its_decisions(spec_engine, real_model_dir, tmp_path):
    """tlt on the engine spec_tail's test started (gamma 4, max_batch 8): a confident prior speculates at every batch
    up to 8 in step 0; step 1 decides from what the engine counted (this model's n-gram drafts are rarely right)."""
    from real_backend.world import run_real

    policy = "tlt(alpha=0.9, prior_drafts=1, max_batch=8)"
    setup, config, prompts, built = _prepare(real_model_dir, policy, temperature=0.0)
    result = run_real(setup, built, config, tmp_path / "run", engine=spec_engine, prompts=prompts)
    first, second = built.decisions
    assert (first["step"], second["step"]) == (0, 1)
    assert first["max_batch"] == 8 and first["drafts"] == 0  # the prior's decision, nothing measured yet
    assert second["drafts"] > 0 and second["accepted_tokens"] <= 4 * second["drafts"]
    assert second["alpha"] < 0.6 and second["max_batch"] < first["max_batch"]  # measured acceptance: speculate less
    assert spec_engine._draft_limit == built.switch.max_batch == second["max_batch"]  # the engine followed the switch
    assert result.responses["reward"].mean() > 0.2  # greedy speculation is lossless
    meta = json.loads((tmp_path / "run" / "meta.json").read_text())
    assert meta["status"] == "finished" and meta["speculation"]["drafts"] >= second["drafts"]
    assert meta["speculation"]["decisions"] == [first, second]


def test_lssim_real_takes_the_temperature_and_says_which_one_speculation_needs(real_model_dir, tmp_path, capsys):
    """`lssim real --temperature T` sets the engine's sampling temperature (a resumed run keeps it: run._SHAPE); on the
    CPU build a speculating policy is refused before any engine starts, naming the option that runs it; a negative
    temperature is refused naming itself."""
    import argparse

    from lssim.cli import main
    from real_backend.run import _SHAPE, _setup, add_arguments
    from real_backend.world import vllm_on_cpu

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    setup = _setup(parser.parse_args(["--model-dir", str(real_model_dir), "--temperature", "0"]))
    assert setup.temperature == 0.0 and setup.engine_config().sampling_kwargs == {"temperature": 0.0}
    assert _SHAPE["temperature"] == ("setup", "temperature")
    with pytest.raises(SystemExit) as bad:
        main(["real", "--model-dir", str(real_model_dir), "--temperature", "-0.5", "--out", str(tmp_path / "bad")])
    assert bad.value.code == 2 and "temperature must be a finite number >= 0" in capsys.readouterr().err
    if vllm_on_cpu():
        with pytest.raises(SystemExit) as refused:
            main(["real", "--model-dir", str(real_model_dir), "--policy", SPEC, "--out", str(tmp_path / "spec")])
        assert refused.value.code == 2 and "--temperature 0" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists() and not (tmp_path / "spec").exists()  # nothing half-written
