"""The real backend: vLLM engine + GRPO trainer under the shared controller, recorded as an lssim trace.

Tests marked `real` share one vLLM engine (tests/conftest.py); select them with `pytest -m real`, skip
them with `-m "not real"`. The bad-input tests need no engine.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from lssim.cli import main
from lssim.loop.controller import RunConfig
from lssim.loop.core import Request

# ---------------------------------------------------------------------------------------------------
# helpers


def _setup(model_dir, **kw):
    from real_backend.world import RealSetup

    return RealSetup(model_dir=str(model_dir), **kw)


def _run(engine, model_dir, policy, out, steps=3, groups=4, group_size=4, max_tokens=128, n_prompts=None, reward=None, **setup_kw):
    from real_backend.world import prepare, run_real

    setup = _setup(model_dir, n_prompts=n_prompts, **setup_kw)
    config = RunConfig(steps=steps, groups_per_step=groups, group_size=group_size, max_tokens=max_tokens, seed=0)
    prompts, built = prepare(setup, policy, config)
    if reward is not None:
        prompts.reward = reward
    return run_real(setup, built, config, out, engine=engine, prompts=prompts), prompts


def _check_books(steps: pd.DataFrame, responses: pd.DataFrame) -> None:
    for _, s in steps.iterrows():
        assert s["responses_in"] == s["finished"] + s["truncated"] + s["policy_stopped"] + s["dropped"] + s["carried_out"], s
    # Every response that entered a step ended in it or was carried out; the last step carries nothing out,
    # so every response is a row.
    assert steps["carried_out"].iloc[-1] == 0
    fresh = int((steps["responses_in"] - steps["carried_in"]).sum())
    assert len(responses) == fresh
    ended = int(steps[["finished", "truncated", "policy_stopped", "dropped"]].to_numpy().sum())
    assert len(responses) == ended


def _parity_reward(r: Request) -> float:
    """A reward with signal in every group whatever the model (random or trained): even samples win."""
    return float(r.sample_idx % 2 == 0)


# ---------------------------------------------------------------------------------------------------
# bad input: no engine, exit status 2, nothing written


@pytest.mark.parametrize("args, message", [
    (["--model-dir", "/nonexistent/model"], "does not exist"),
    (["--policy", "no_such_policy"], "unknown policy"),
    (["--policy", "hadb(bogus=1)"], "hadb"),
    (["--steps", "0"], "steps must be >= 1"),
    (["--group-size", "1"], "group-size"),
    (["--max-tokens", "5000"], "max_model_len"),
    (["--profile", "/nonexistent/profile.json"], "does not exist"),
])
def test_bad_input_exits_2_and_writes_nothing(tmp_path, capsys, real_model_dir_cheap, args, message):
    out = tmp_path / "run"
    argv = ["real", "--model-dir", str(real_model_dir_cheap), *args, "--out", str(out)]
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("lssim: error:") and message in err, err
    assert not out.exists()


def test_bad_prompts_file_exits_2(tmp_path, capsys, real_model_dir_cheap):
    bad = tmp_path / "prompts.jsonl"
    bad.write_text('{"prompt_id": 0, "text": "7 2 0 0 0 :", "answer": "20", "reference_len": 5}\nnot json\n')
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as e:
        main(["real", "--model-dir", str(real_model_dir_cheap), "--prompts", str(bad), "--out", str(out)])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "lssim: error:" in err and "prompts.jsonl:2" in err
    assert not out.exists()


def test_out_dir_holding_a_run_needs_overwrite(tmp_path, capsys, real_model_dir_cheap):
    out = tmp_path / "run"
    out.mkdir()
    (out / "trace.parquet").write_bytes(b"old")
    with pytest.raises(SystemExit) as e:
        main(["real", "--model-dir", str(real_model_dir_cheap), "--out", str(out)])
    assert e.value.code == 2
    assert "--overwrite" in capsys.readouterr().err
    assert (out / "trace.parquet").read_bytes() == b"old"


@pytest.fixture(scope="module")
def real_model_dir_cheap(tmp_path_factory):
    """A model folder good enough for validation (config + tokenizer); no engine ever starts on it."""
    from real_backend import task

    if (task.MODEL_DIR / "config.json").is_file() and (task.MODEL_DIR / "tokenizer.json").is_file():
        return task.MODEL_DIR
    path = tmp_path_factory.mktemp("cheap_model")
    (path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    task.build_tokenizer().save_pretrained(path)
    return path


def test_signals_loop_start():
    from lssim.loop.signals import loop_start

    assert loop_start(list(range(40))) == -1
    assert loop_start(list(range(10)) + [7, 8, 9] * 10) == 7  # the periodic suffix begins at 7 (7 8 9 7 8 9 ...)
    assert loop_start([5] * 30) == 0
    assert loop_start([1, 2, 3] * 3) == -1  # too short to call a loop


def test_token_entropy():
    from types import SimpleNamespace as L

    from lssim.loop.signals import token_entropy

    uniform = {i: L(logprob=-math.log(4)) for i in range(4)}
    assert token_entropy(uniform) == pytest.approx(math.log(4))
    assert token_entropy({0: L(logprob=0.0)}) == pytest.approx(0.0)


def test_task_prompts_epochs():
    from real_backend import task
    from real_backend.prompts import TaskPrompts

    prompts = TaskPrompts(task.load_prompts(task.PROMPTS_PATH)[:10], task.build_tokenizer(), seed=3)
    batches = [[g.prompt_id for g in prompts.default_groups(s, 4, 2, 64)] for s in range(5)]
    assert all(len(b) == 4 and len(set(b)) == 4 for b in batches)
    assert len(set(batches[0] + batches[1])) == 8  # an epoch visits each prompt once (2 left over: drop_last)
    assert prompts.prompt_len(batches[0][0]) == len(prompts.prompt_tokens(batches[0][0])) == 7  # <bos> + 5 digits + ':'
    again = TaskPrompts(task.load_prompts(task.PROMPTS_PATH)[:10], task.build_tokenizer(), seed=3)
    assert [[g.prompt_id for g in again.default_groups(s, 4, 2, 64)] for s in range(5)] == batches


# ---------------------------------------------------------------------------------------------------
# the engine alone


@pytest.mark.real
def test_engine_streams_progress_abort_and_resume(vllm_engine):
    from lssim.loop.signals import DEFAULT, WINDOW_KEY

    eng = vllm_engine
    eng.reward_fn = lambda r: 0.5
    eng.set_progress_interval(4)
    reqs = [Request(rid=10_000 + i, group_id=0, step=0, prompt_id=i, sample_idx=0, prompt_len=len(eng.prompt_tokens(i)),
                    max_tokens=48, seed=i) for i in range(4)]
    eng.submit(reqs)
    victim, progress, finished = None, 0, set()
    while True:
        events = eng.next_events()
        if not events:
            break
        assert [e.time for e in events] == sorted(e.time for e in events)
        for ev in events:
            r = ev.request
            if ev.kind == "progress":
                progress += 1
                assert r.generated % 4 == 0 or r.generated > 0
                window = DEFAULT.window_for(r.max_tokens)  # at most half the budget
                assert WINDOW_KEY in r.signals and r.signals[WINDOW_KEY]["tokens"] == min(r.generated, window)
                if victim is None:  # pause the first one that reports progress
                    victim = r
                    eng.abort(r)
                    assert r.generated == len(r.tokens) == len(r.signals["logprobs"])
            else:
                assert r is not victim
                finished.add(r.rid)
                assert r.finish_reason in ("stop", "length") and r.reward == 0.5
                assert r.submit_time <= r.first_token_time <= r.finish_time
    assert progress >= 1 and victim is not None
    assert len(finished) == 3
    # resume the paused one: prompt + its tokens, what is left of its budget
    before = list(victim.tokens)
    eng.submit([victim])
    events = []
    while True:
        got = eng.next_events()
        if not got:
            break
        events += [e for e in got if e.kind == "finished"]
    assert [e.request for e in events] == [victim]
    assert victim.tokens[:len(before)] == before and victim.generated == len(victim.tokens) <= 48
    assert len(victim.signals["logprobs"]) == victim.generated
    assert all(lp <= 0 for lp in victim.signals["logprobs"])
    u = eng.utilization()
    assert u[0] > 0 and u[1] >= u[0]


# ---------------------------------------------------------------------------------------------------
# real runs


@pytest.mark.real
def test_a_real_run_freezes_the_heap_it_starts_with(vllm_engine, real_model_dir, tmp_path):
    """A full collection over the driver's heap (vLLM, torch: ~0.9 million objects) holds the GIL for most of a second
    and stops every token stream (real_backend.engine.freeze_heap): a run freezes what exists when it starts, so the
    collector's passes during it scan only what the run itself made."""
    import gc

    gc.unfreeze()
    older = [[i] for i in range(1000)]  # made before the run, alive through it
    assert any(o is older for o in gc.get_objects())
    _run(vllm_engine, real_model_dir, "baseline", tmp_path / "run", steps=1, groups=2, group_size=2, max_tokens=16)
    assert gc.get_freeze_count() > 1000
    assert not any(o is older for o in gc.get_objects())  # frozen: outside every generation the collector scans
    # and in the worker processes, where the model runs (the count is the first worker's: torch and vLLM)
    assert vllm_engine.freeze_heaps() > 100_000


@pytest.mark.real
@pytest.mark.parametrize("policy", ["baseline", "hadb", "april"])
def test_real_run_records_a_replayable_trace(vllm_engine, real_model_dir, tmp_path, policy):
    from lssim.analysis.replay import SimSetup, replay
    from lssim.traces.trace import load_trace

    out = tmp_path / policy
    # 8 prompts: HADB's warm-up (it buckets once it has seen 90% of the pool) ends after two steps
    result, _ = _run(vllm_engine, real_model_dir, policy, out, steps=3, n_prompts=8)
    steps, responses = result.steps, result.responses
    assert len(steps) == 3
    _check_books(steps, responses)

    # rewards: computed for every response that ended by itself or by its budget, in range
    ended = responses[responses["finish_reason"].isin(["stop", "length"])]
    assert len(ended) and ended["reward"].between(0.0, 1.0).all()
    assert (steps["rollout_seconds"] > 0).all() and (steps["tokens"] > 0).all()
    assert steps["trainer_compute_seconds"].notna().all()

    # the files, rewritten after every step, agree with the result
    meta = json.loads((out / "meta.json").read_text())
    assert meta["status"] == "finished" and meta["steps_done"] == 3 and meta["policy"] == result.policy
    assert meta["ran_blind"] is None  # hadb's warm-up ended: it could see what it reads (PolicyHooks.ran_blind)
    assert len(pd.read_parquet(out / "steps.parquet")) == 3
    saved = pd.read_parquet(out / "responses.parquet")
    assert len(saved) == len(responses) and {"text", "entropy_mean", "mean_logprob"} <= set(saved.columns)
    trace = load_trace(out / "trace.parquet")
    assert len(trace) == len(responses)
    assert trace["finish_time"].notna().sum() == len(ended)
    assert (trace["step_rollout_seconds"] > 0).all()
    assert trace["entropy_mean"].notna().all()
    if policy == "april":  # partial rollouts: something was carried and resumed with its tokens
        assert steps["carried_out"].sum() > 0
        assert (trace["tokens_before_resume"] > 0).any() or (trace["policy_version_last"] > trace["policy_version_first"]).any()

    # the trace replays in the simulator
    sim = replay(trace, [policy], SimSetup(n_instances=1, max_num_seqs=256, kv_capacity_tokens=200_000))
    assert policy in sim and "baseline" in sim
    assert sim[policy].steps["groups_trained"].sum() > 0


@pytest.mark.real
def test_weights_in_the_engine_follow_the_trainer(vllm_engine, real_model_dir, tmp_path):
    import torch

    from real_backend.trainer import GRPOTrainer
    from real_backend.world import prepare, run_real

    eng = vllm_engine
    setup = _setup(real_model_dir, lr=1e-3)
    config = RunConfig(steps=1, groups_per_step=4, group_size=4, max_tokens=32, seed=0)
    prompts, policy = prepare(setup, "baseline", config)
    prompts.reward = _parity_reward
    trainer = GRPOTrainer(setup.model_dir, eng, prompts, lr=1e-3)  # pushes the checkpoint's weights into the engine
    probe_prompt, probe = prompts.prompt_tokens(0), [14, 5, 6, 7, 8, 9, 2]

    def torch_logprobs():
        ids = torch.tensor([probe_prompt + probe])
        with torch.no_grad():
            logp = torch.log_softmax(trainer.model(input_ids=ids).logits[0, :-1].float(), -1)
        return [float(logp[len(probe_prompt) - 1 + i, t]) for i, t in enumerate(probe)]

    before = eng.score(probe_prompt, probe)
    np.testing.assert_allclose(before, torch_logprobs(), atol=2e-3)  # the engine serves the trainer's model
    names = ["model.norm.weight", "model.layers.0.input_layernorm.weight", "model.embed_tokens.weight"]

    def served(n):  # vLLM pads the vocabulary dimension (18 -> 64 rows here): compare the real rows
        ref = trainer.model.get_parameter(n)
        return eng.parameter(n)[tuple(slice(0, d) for d in ref.shape)]

    params_before = {n: served(n) for n in names}
    for n in names:
        torch.testing.assert_close(params_before[n], trainer.model.get_parameter(n).detach())

    result = run_real(setup, policy, config, tmp_path / "run", engine=eng, prompts=prompts, trainer=trainer)
    row = result.steps.iloc[0]
    assert row["trainer_optimizer_steps"] == 1, "no group had reward variance"
    assert row["trainer_sync_seconds"] > 0 and row["trainer_grad_norm"] > 0
    assert row["trainer_logprob_gap"] < 1e-2  # the behaviour logprobs vLLM recorded match torch's
    # The engine now serves exactly the trainer's new weights, and they moved. (How far depends on the model:
    # a trained model is near-certain of most tokens it samples, its gradients are tiny, and so is the step.)
    moved = 0.0
    for n in names:
        after = served(n)
        torch.testing.assert_close(after, trainer.model.get_parameter(n).detach(), rtol=0, atol=0)
        moved = max(moved, float((after - params_before[n]).abs().max()))
    assert moved > 0, "the engine's weights did not change"
    np.testing.assert_allclose(eng.score(probe_prompt, probe), torch_logprobs(), atol=2e-3)

    # A visible change, whatever the model: perturb the trainer's weights, push them, and the engine follows.
    probe_before = eng.score(probe_prompt, probe)
    with torch.no_grad():
        gen = torch.Generator().manual_seed(0)
        for p in trainer.model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    eng.update_weights(trainer.model.state_dict())
    probe_after = eng.score(probe_prompt, probe)
    assert max(abs(a - b) for a, b in zip(probe_before, probe_after)) > 1e-2
    np.testing.assert_allclose(probe_after, torch_logprobs(), atol=2e-3)


@pytest.mark.real
def test_engine_death_keeps_finished_steps(vllm_engine, real_model_dir, tmp_path, capsys, monkeypatch):
    from lssim.traces.trace import load_trace
    from real_backend import world
    from real_backend.engine import EngineError

    dying = _DyingEngine(vllm_engine, die_at_submit=2)
    monkeypatch.setattr(world, "start_engine", lambda *a, **k: dying)
    out = tmp_path / "run"
    rc = main(["real", "--model-dir", str(real_model_dir), "--n-prompts", "16", "--steps", "3", "--groups-per-step", "2",
               "--group-size", "2", "--max-tokens", "32", "--eval-every", "0", "--out", str(out)])
    assert rc == 1
    captured = capsys.readouterr()
    assert "lssim: error:" in captured.err and "died" in captured.err
    assert "step   0" in captured.out
    trace = load_trace(out / "trace.parquet")
    assert set(trace["step"]) == {0}
    meta = json.loads((out / "meta.json").read_text())
    assert meta["status"] == "failed" and meta["steps_done"] == 1 and "EngineError" in meta["error"]
    assert dying.closed
    with pytest.raises(EngineError):
        dying.next_events()


class _DyingEngine:
    """The session's engine, dying at the first next_events after its `die_at_submit`-th submit."""

    def __init__(self, engine, die_at_submit: int):
        object.__setattr__(self, "_engine", engine)
        object.__setattr__(self, "_submits", 0)
        object.__setattr__(self, "_die_at", die_at_submit)
        object.__setattr__(self, "closed", False)

    def __getattr__(self, name):
        return getattr(self._engine, name)

    def __setattr__(self, name, value):
        setattr(self._engine, name, value)

    def submit(self, requests):
        object.__setattr__(self, "_submits", self._submits + 1)
        return self._engine.submit(requests)

    def next_events(self):
        from real_backend.engine import EngineError

        if self._submits >= self._die_at:
            raise EngineError("the vLLM engine died (its engine core process is gone)")
        return self._engine.next_events()

    def close(self):
        object.__setattr__(self, "closed", True)  # the session's engine lives on



# Every other shipped policy, as the same object, on the real engine: a short run whose books balance.
# `spec_tail` is refused up front (speculation is not wired to vLLM yet) and `oracle` needs the simulator.
OTHER_POLICIES = ["breaker", "vade", "dapo", "alc", "ar3po", "seer", "rollpacker", "segment", "ebs", "lpt",
                  "early_exit(check_every=16, min_tokens=16, confident_below=5.0, patience=1)",  # fires: scores partials
                  "vade+april+breaker"]


@pytest.mark.real
@pytest.mark.parametrize("policy", OTHER_POLICIES)
def test_every_policy_runs_on_the_real_engine(vllm_engine, real_model_dir, tmp_path, policy):
    result, _ = _run(vllm_engine, real_model_dir, policy, tmp_path / "run", steps=2, groups=4, group_size=4, max_tokens=64,
                     n_prompts=16, reward=_parity_reward)
    _check_books(result.steps, result.responses)
    assert result.steps["groups_trained"].sum() > 0


@pytest.mark.parametrize("policy, message", [("spec_tail", "speculat"), ("oracle", "simulator")])
def test_policies_the_real_engine_cannot_run_are_refused_before_it_starts(tmp_path, capsys, real_model_dir_cheap, policy, message):
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as e:
        main(["real", "--model-dir", str(real_model_dir_cheap), "--policy", policy, "--steps", "1", "--out", str(out)])
    assert e.value.code == 2 and message in capsys.readouterr().err.lower() and not out.exists()


def test_each_step_records_the_drivers_own_seconds_and_a_driver_that_works_longer_records_it(vllm_engine, real_model_dir,
                                                                                             tmp_path):
    """steps.parquet's driver_seconds: the part of each rollout the controller's thread did not wait for the engine.
    It lies within the rollout, and a reward function that spins 5 ms per finished response (driver work) puts at
    least 5 ms per response of the step into it."""
    import time

    result, _ = _run(vllm_engine, real_model_dir, "baseline", tmp_path / "plain", steps=2)
    steps = pd.read_parquet(tmp_path / "plain" / "steps.parquet")
    assert ((steps["driver_seconds"] > 0) & (steps["driver_seconds"] < steps["rollout_seconds"])).all()

    def slow_reward(r: Request) -> float:
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < 0.005:
            pass
        return _parity_reward(r)

    _run(vllm_engine, real_model_dir, "baseline", tmp_path / "slow", steps=2, reward=slow_reward)
    slow = pd.read_parquet(tmp_path / "slow" / "steps.parquet")
    assert (slow["driver_seconds"] >= 0.005 * (slow["finished"] + slow["truncated"])).all()
    assert (slow["driver_seconds"] > steps["driver_seconds"]).all()
