"""A real run killed mid-step keeps a valid trace, and `lssim real --resume DIR` goes on from its checkpoint.

The SIGKILL test runs `lssim real` as a subprocess (its own engine: the kill is the point); the resume tests run
the CLI in this process on the session's engine (tests/conftest.py), through a proxy that the CLI cannot close.
"""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from lssim.cli import main

SHAPE = ["--n-prompts", "16", "--groups-per-step", "4", "--group-size", "4", "--max-tokens", "96"]
GROUPS_PER_STEP = 4  # as SHAPE says
KEY = ["step", "prompt_id", "sample_idx"]


def _cli(argv: list[str]) -> int:
    """`lssim real ARGV` (on the session's engine where the test asks for `lent_engine`)."""
    return main(["real", *argv])


# `lssim real ARGV` whose step 1 stalls in the trainer's update, after its rollout: the kill lands mid-step on any
# machine (a free-running 4-step run on a fast one finished before the test's poll saw step 0 and killed it).
STALLS_IN_STEP_1 = """
import sys, time
from real_backend.trainer import GRPOTrainer
from lssim.cli import main
update = GRPOTrainer.update
def stalled(self, groups, step):
    while step >= 1:
        time.sleep(60)
    return update(self, groups, step)
GRPOTrainer.update = stalled
sys.exit(main(sys.argv[1:]))
"""


def _steps_done(out: Path) -> int:
    try:
        return json.loads((out / "meta.json").read_text())["steps_done"]
    except (OSError, ValueError, KeyError):
        return 0


@pytest.mark.real
def test_sigkill_mid_step_leaves_a_valid_trace_of_every_finished_step(lent_engine, real_model_dir, tmp_path):
    from lssim.traces.trace import load_trace
    from real_backend.checkpoint import load_checkpoint

    out = tmp_path / "run"
    argv = ["real", "--model-dir", str(real_model_dir), *SHAPE, "--steps", "4", "--kv-cache-gib", "1", "--out",
            str(out), "--quiet"]
    cmd = [sys.executable, "-c", STALLS_IN_STEP_1, *argv]
    proc = subprocess.Popen(cmd, cwd=Path(__file__).resolve().parents[1], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, start_new_session=True)  # its own group: vLLM's engine core too
    try:
        deadline = time.monotonic() + 400
        while _steps_done(out) < 1 or not (out / "checkpoint.pt").exists():  # the checkpoint follows the files
            assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
            assert time.monotonic() < deadline, "no step finished in 400 s"
            time.sleep(0.02)
        time.sleep(0.5)  # step 1's files, if any were to come, would be on disk by now
        os.kill(proc.pid, signal.SIGKILL)  # the run's own process, mid-step (step 1's update never returns)
        proc.wait(timeout=30)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # what it started (vLLM's engine core) goes too
        except ProcessLookupError:
            pass
        proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL
    meta = json.loads((out / "meta.json").read_text())
    assert meta["status"] == "running" and meta["steps_done"] == 1  # killed in step 1, not finished
    steps = pd.read_parquet(out / "steps.parquet")
    finished = set(steps["step"])
    assert finished == set(range(meta["steps_done"]))
    trace = load_trace(out / "trace.parquet")
    # every response of every finished step (trace.parquet is written before steps.parquet: it may hold one more)
    assert finished <= set(trace["step"]) <= finished | {max(finished) + 1}
    for s in finished:
        assert (trace["step"] == s).sum() == steps.loc[steps["step"] == s, "responses_in"].iloc[0]
    assert not trace.duplicated(KEY).any()
    # and the killed run goes on from its checkpoint (here on the session's engine) to its 4 steps
    ckpt = load_checkpoint(out)
    assert ckpt.step == 0  # the state after step 0, the last one finished
    assert _cli(["--resume", str(out)]) == 0
    steps = pd.read_parquet(out / "steps.parquet")
    trace = load_trace(out / "trace.parquet")
    assert steps["step"].tolist() == [0, 1, 2, 3] and set(trace["step"]) == {0, 1, 2, 3}
    assert not trace.duplicated(KEY).any() and len(trace) == int((steps["responses_in"] - steps["carried_in"]).sum())
    assert not list(out.glob(".*.tmp"))


@pytest.mark.real
def test_resume_continues_the_run_from_its_checkpoint(lent_engine, real_model_dir, tmp_path, monkeypatch, capsys):
    from lssim.traces.trace import load_trace
    from real_backend.checkpoint import load_checkpoint
    from real_backend.trainer import GRPOTrainer

    out = tmp_path / "run"
    assert _cli(["--model-dir", str(real_model_dir), *SHAPE, "--policy", "april", "--steps", "2",
                                           "--out", str(out)]) == 0
    ckpt = load_checkpoint(out)
    assert ckpt.step == 1 and ckpt.trainer["version"] == 2 and ckpt.mode_version == 2
    first_steps = pd.read_parquet(out / "steps.parquet")
    # both routes to what the run left unfinished agree: the recorder's file and the checkpoint's carried responses
    from lssim.analysis.fidelity.run import UNFINISHED_COLUMNS, UNFINISHED_FILE
    from real_backend.validate_twin import unfinished_from_checkpoint

    recorded, held = (f[UNFINISHED_COLUMNS].sort_values(KEY, ignore_index=True)
                      for f in (pd.read_parquet(out / UNFINISHED_FILE), unfinished_from_checkpoint(out, 1)))
    assert len(recorded) == first_steps["carried_out"].iloc[-1]
    pd.testing.assert_frame_equal(recorded, held, check_dtype=False)

    seen = []  # the trainer's and the engine's weights, and the optimizer's moments, when the resumed run first trains
    train = GRPOTrainer.train

    def spy(self, groups, step):
        if not seen:
            seen.append((step, {k: v.clone() for k, v in self.model.state_dict().items()},
                         lent_engine.parameter("model.norm.weight"), copy.deepcopy(self.optimizer.state_dict())))
        return train(self, groups, step)

    monkeypatch.setattr(GRPOTrainer, "train", spy)
    assert _cli(["--resume", str(out), "--steps", "4"]) == 0
    assert "resuming" in capsys.readouterr().out

    step, weights, served, optim = seen[0]
    assert step == 2  # step numbers continue
    assert weights.keys() == ckpt.model.keys()
    for k, v in ckpt.model.items():
        assert torch.equal(weights[k], v), k
    np.testing.assert_allclose(served.numpy(), ckpt.model["model.norm.weight"].numpy(), atol=1e-6)
    for pid, s in ckpt.optimizer["state"].items():
        assert torch.equal(optim["state"][pid]["exp_avg"], s["exp_avg"]) and int(optim["state"][pid]["step"]) == int(s["step"])

    steps = pd.read_parquet(out / "steps.parquet")
    # Step numbers continue from the checkpoint; the run ends at its 4th step, or earlier once the groups of 4 steps
    # have trained with nothing carried (april can train more than a batch in a step when groups end together).
    assert steps["step"].tolist() == list(range(len(steps))) and 3 <= len(steps) <= 4
    if len(steps) < 4:
        assert steps["groups_trained"].sum() >= 4 * GROUPS_PER_STEP and steps["carried_out"].iloc[-1] == 0
    pd.testing.assert_frame_equal(steps.iloc[:2].reset_index(drop=True), first_steps, check_dtype=False)
    responses = pd.read_parquet(out / "responses.parquet")
    trace = load_trace(out / "trace.parquet")
    # (april carries: a step may end only carried responses, so the steps responses ended in are the ones to count)
    assert set(trace["end_step"]) == set(range(len(steps))) and not trace.duplicated(KEY).any()
    assert len(trace) == len(responses) == int((steps["responses_in"] - steps["carried_in"]).sum())
    # the books balance across the resume: carried responses came back in the step after the checkpoint
    assert (steps["responses_in"] == steps[["finished", "truncated", "policy_stopped", "dropped", "carried_out"]].sum(axis=1)).all()
    assert steps["carried_in"].iloc[2] == steps["carried_out"].iloc[1]
    meta = json.loads((out / "meta.json").read_text())
    assert meta["status"] == "finished" and meta["steps_done"] == len(steps)
    assert [r["after_step"] for r in meta["resumes"]] == [1]
    assert load_checkpoint(out).step == len(steps) - 1


def test_resume_needs_a_checkpoint(tmp_path, capsys):
    out = tmp_path / "empty"
    out.mkdir()
    with pytest.raises(SystemExit) as e:
        main(["real", "--resume", str(out)])
    assert e.value.code == 2
    assert "no checkpoint.pt" in capsys.readouterr().err


def test_out_is_required_without_resume(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["real", "--steps", "1"])
    assert e.value.code == 2
    assert "--out DIR is required" in capsys.readouterr().err


def test_loader_state_round_trip():
    """The data loader restored from a checkpoint gives the batches the uninterrupted one would have."""
    from real_backend import task
    from real_backend.checkpoint import loader_state, set_loader_state
    from real_backend.prompts import TaskPrompts

    def loader():
        return TaskPrompts(task.load_prompts(task.PROMPTS_PATH)[:10], task.build_tokenizer(), seed=5)

    straight, interrupted = loader(), loader()
    expected = [[g.prompt_id for g in straight.default_groups(s, 4, 2, 64)] for s in range(6)]
    got = [[g.prompt_id for g in interrupted.default_groups(s, 4, 2, 64)] for s in range(3)]
    state = loader_state(interrupted)
    resumed = loader()
    set_loader_state(resumed, state)
    got += [[g.prompt_id for g in resumed.default_groups(s, 4, 2, 64)] for s in range(3, 6)]
    assert got == expected
    assert [[g.prompt_id for g in loader().default_groups(s, 4, 2, 64)] for s in range(3)] != expected[3:]  # not a restart


@pytest.mark.real
def test_engine_timers(vllm_engine):
    """wake_at: a WAKE event once the engine's clock reaches the time, idle or with requests in flight, in order."""
    from lssim.loop.core import FINISHED, WAKE, Request

    eng = vllm_engine
    t0 = eng.now()
    eng.wake_at(t0 + 0.3)
    eng.wake_at(t0 + 0.1)
    first, second = eng.next_events(), eng.next_events()
    assert [e.kind for e in first + second] == [WAKE, WAKE]
    assert t0 + 0.1 <= first[0].time < second[0].time and second[0].time >= t0 + 0.3
    assert eng.next_events() == []  # nothing in flight, no timer left

    reqs = [Request(rid=900_000 + i, group_id=0, step=0, prompt_id=0, sample_idx=i, prompt_len=len(eng.prompt_tokens(0)),
                    max_tokens=64, seed=i) for i in range(4)]
    eng.submit(reqs)
    eng.wake_at(eng.now())  # due at once: reported before the streams are waited on
    kinds, woke_at = [], None
    while True:
        events = eng.next_events()
        if not events:
            break
        for e in events:
            kinds.append(e.kind)
            if e.kind == WAKE:
                woke_at = len(kinds)
    assert kinds[0] == WAKE and woke_at == 1 and kinds[1:].count(FINISHED) == 4
    eng.wake_at(eng.now() + 100)
    eng.abort_all()  # drops the timer: the engine is idle
    assert eng.next_events() == []
