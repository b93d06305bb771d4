"""Held-out evaluation in real runs (real_backend.evaluate) and `lssim learn` (real_backend.learn), on the session's
vLLM engine (tests/conftest.py: lent_engine)."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from lssim.cli import main
from real_backend import task
from real_backend.evaluate import EVAL_COLUMNS
from real_backend.prompts import TaskPrompts

EVAL = ["--eval-prompts", "6", "--eval-samples", "2"]


def test_the_heldout_split_is_the_shipped_one_and_never_trained_on():
    prompts = task.load_prompts(task.PROMPTS_PATH)
    held = task.heldout_split(prompts)
    assert held == task.load_heldout() and len(held) == 97 and len(prompts) - len(held) == 385
    train = TaskPrompts.from_files(task.PROMPTS_PATH, task.MODEL_DIR, heldout_path=task.HELDOUT_PATH) \
        if (task.MODEL_DIR / "tokenizer.json").exists() else None
    if train is not None:
        assert not set(train.pool.prompt_id.tolist()) & set(held) and train.heldout_ids == held
        drawn = {g.prompt_id for step in range(40) for g in train.default_groups(step, 8, 2, 16)}
        assert not drawn & set(held)


@pytest.mark.real
def test_a_real_run_evaluates_heldout_prompts_and_records_what_it_learned(lent_engine, real_model_dir, tmp_path, capsys):
    from real_backend.checkpoint import load_checkpoint
    from real_backend.evaluate import evaluate

    out = tmp_path / "run"
    assert main(["real", "--model-dir", str(real_model_dir), "--steps", "3", "--eval-every", "2", *EVAL, "--n-prompts", "16",
                 "--groups-per-step", "4", "--max-tokens", "96", "--lr", "1e-4", "--out", str(out)]) == 0
    assert "eval after    2 steps" in capsys.readouterr().out  # printed beside the step lines
    ev = pd.read_parquet(out / "eval.parquet")
    assert list(ev.columns) == list(EVAL_COLUMNS)
    assert ev["step"].tolist() == [0, 2, 3] and ev["version"].tolist() == [0, 2, 3]  # before, every 2, at the end
    assert (ev["prompts"] == 6).all() and (ev["samples"] == 12).all()
    assert ev["train_seconds"].iloc[0] == 0 and ev["train_seconds"].is_monotonic_increasing
    assert (ev["wall_seconds"] >= ev["train_seconds"]).all() and (ev["eval_seconds"] > 0).all()
    steps = pd.read_parquet(out / "steps.parquet")
    assert ev["train_seconds"].iloc[-1] == pytest.approx(steps["step_seconds"].sum())  # evaluations not in it
    # the evaluations before steps 0 and 2 were timed by the controller into those steps; taken out again
    assert steps["evaluation_seconds"].tolist()[0] == pytest.approx(ev["eval_seconds"].iloc[0])
    assert steps["evaluation_seconds"].tolist()[2] == pytest.approx(ev["eval_seconds"].iloc[1])
    assert (steps["step_seconds"] >= steps["rollout_seconds"] + steps["train_seconds"] - 1e-6).all()
    for col in ("trainer_reward", "trainer_nonzero_advantage_groups", "trainer_tokens_stale0", "trainer_tokens_stale1",
                "trainer_tokens_stale2plus"):
        assert col in steps
    assert steps["trainer_reward"].tolist() == pytest.approx(steps["mean_reward"].tolist())
    assert (steps["trainer_tokens_stale0"] + steps["trainer_tokens_stale1"] + steps["trainer_tokens_stale2plus"]
            == steps["tokens"]).all()  # collocated: every trained token on-policy, each response trained
    assert steps["trainer_nonzero_advantage_groups"].tolist() == pytest.approx(
        (steps["effective_groups"] / steps["groups_trained"]).tolist())
    # the check: the recorded greedy accuracy is a fresh evaluation of the saved weights
    ckpt = load_checkpoint(out)
    prompts = TaskPrompts.from_files(task.PROMPTS_PATH, real_model_dir, heldout_path=task.HELDOUT_PATH)
    lent_engine.serve(prompts.prompt_tokens, prompts.reward)
    lent_engine.update_weights(ckpt.model, version=ckpt.step + 1)
    fresh = evaluate(lent_engine, prompts, prompts.heldout_ids[:6], samples=2, max_tokens=96)
    assert fresh["greedy_accuracy"] == ev["greedy_accuracy"].iloc[-1]
    assert fresh["pass1"] == ev["pass1"].iloc[-1]  # the same sampler seeds: the same draws


@pytest.mark.real
def test_lssim_learn_runs_each_policy_from_the_checkpoint_and_reports(lent_engine, real_model_dir, tmp_path, capsys):
    out = tmp_path / "learn"
    argv = ["learn", "--model-dir", str(real_model_dir), "--policies", "baseline,april", "--steps", "2", "--eval-every", "1",
            *EVAL, "--groups-per-step", "4", "--max-tokens", "96", "--json", "--out", str(out)]
    assert main(argv) == 0
    result = json.loads(capsys.readouterr().out)
    assert set(result) == {"target", "target_rule", "budget_seconds", "baseline", "runs", "summary"}
    assert result["baseline"] == "baseline" and set(result["summary"]) == {"baseline", "april"}
    for label in ("baseline", "april"):
        run = result["runs"][label]["0"]
        for key in ("initial_accuracy", "final_accuracy", "accuracy_at_budget", "time_to_target_seconds",
                    "time_to_target_steps", "mean_step_seconds", "mean_rollout_seconds"):
            assert key in run
        # april may train the run's groups in fewer steps (Controller.run ends once total_groups trained)
        assert 1 <= run["steps"] <= 2
        s = result["summary"][label]
        assert set(s["final_accuracy"]) == {"median", "spread", "interval", "n"}
        assert "step_speedup" in s and "rollout_speedup" in s
        ev = pd.read_parquet(out / label / "0" / "eval.parquet")
        assert ev["step"].tolist() == list(range(run["steps"] + 1))
    # every run starts from the same checkpoint: the same weights, the same paired evaluation before training
    assert result["runs"]["baseline"]["0"]["initial_accuracy"] == result["runs"]["april"]["0"]["initial_accuracy"]
    assert result["target"] == pytest.approx(result["runs"]["baseline"]["0"]["initial_accuracy"] + 0.10)
    for name in ("learn.json", "learning_curves.png", "learn.html"):
        assert (out / name).stat().st_size > 0
    # run again: every run finished, nothing reruns, the same report
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert "(2 finished already)" in captured.err and json.loads(captured.out) == result


@pytest.mark.real
def test_a_resumed_run_keeps_its_evaluations(lent_engine, real_model_dir, tmp_path):
    out = tmp_path / "run"
    shape = ["--model-dir", str(real_model_dir), "--eval-every", "2", *EVAL, "--n-prompts", "16", "--groups-per-step", "4",
             "--max-tokens", "64"]
    assert main(["real", *shape, "--steps", "2", "--out", str(out)]) == 0
    first = pd.read_parquet(out / "eval.parquet")
    assert first["step"].tolist() == [0, 2]
    assert main(["real", *shape, "--steps", "4", "--resume", str(out)]) == 0
    ev = pd.read_parquet(out / "eval.parquet")
    assert ev["step"].tolist() == [0, 2, 4]
    pd.testing.assert_frame_equal(ev.iloc[:2], first)  # the earlier evaluations kept as they were
    steps = pd.read_parquet(out / "steps.parquet")
    assert ev["train_seconds"].iloc[-1] == pytest.approx(steps["step_seconds"].sum())
    assert ev["wall_seconds"].iloc[-1] > first["wall_seconds"].iloc[-1]


def test_learn_plans_policy_at_mode_entries_beside_the_crossing():
    import argparse

    from real_backend.learn import plan_runs

    args = argparse.Namespace(policies="april,baseline@async:2", modes="collocated", repeats=2, seed=0, out="d")
    runs = plan_runs(args)
    assert [(r["label"], r["mode"], r["seed"]) for r in runs] == [
        ("baseline", "collocated", 0), ("baseline", "collocated", 1), ("april", "collocated", 0),
        ("april", "collocated", 1), ("baseline@async2", "async:2", 0), ("baseline@async2", "async:2", 1)]
    assert runs[-1]["out"] == "d/baseline@async2/1"
    with pytest.raises(ValueError, match="async:K"):
        plan_runs(argparse.Namespace(policies="baseline@async:x", modes="collocated", repeats=1, seed=0, out="d"))
