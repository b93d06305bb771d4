"""Checkpoints and --resume outside collocated (real_backend.checkpoint), piece by piece without vLLM: the
controller's state with responses generating across the boundary, the modes' pending updates, the trainer's
states behind the engine's weights, the step rows of a resumed run, the step lines; and, marked `real`, hybrid and
async runs resumed on the session's engine."""

from __future__ import annotations

import copy
import dataclasses
import json
import math
from concurrent.futures import Future

import numpy as np
import pandas as pd
import pytest

from lssim.loop.controller import Controller, RunConfig
from lssim.loop.modes import ModeConfig
from lssim.loop.policy import make_policy

SHAPE = ["--n-prompts", "16", "--groups-per-step", "4", "--group-size", "4", "--max-tokens", "96", "--eval-every", "0"]
KEY = ["step", "prompt_id", "sample_idx"]


def _sim_controller(trace, mode: ModeConfig, steps: int):
    from lssim.sim.trainer import SimTrainer, TrainTimeModel
    from lssim.sim.world import EngineConfig, SimEngine
    from lssim.traces.workload import Workload
    from test_sim import COST

    wl = Workload(trace, seed=0)
    engine = SimEngine(wl, COST, EngineConfig(mode.rollout_devices, 8, 10**7))
    train = TrainTimeModel(seconds_per_token=1e-4, fixed_seconds=0.2, sync_seconds=0.005)
    cfg = RunConfig(steps=steps, groups_per_step=wl.groups_per_step, group_size=wl.group_size, max_tokens=wl.max_tokens,
                    total_groups=wl.groups_in(len(wl.steps)))
    return Controller(engine, SimTrainer(engine, train, n_devices=mode.train_devices, collocated=False), wl,
                      make_policy("baseline"), cfg, mode=mode.build())


def test_async_state_holds_the_responses_generating_across_the_boundary_as_carried():
    from test_sim import make_trace

    lengths = np.random.default_rng(0).lognormal(4.0, 1.0, size=(4, 4, 2)).astype(int) + 1
    trace = make_trace(np.minimum(lengths, 300), max_tokens=300)
    mode = ModeConfig("async", 1, 1, staleness=2)
    first = _sim_controller(trace, mode, steps=8)
    for step in range(2):
        first.run_step(step)
    assert first.kept  # responses run on into step 2
    saved = copy.deepcopy(first.state())
    assert {r.rid for r in saved["carried"]} == {r.rid for r in first.carried + first.kept}
    resumed = _sim_controller(trace, mode, steps=8)  # a new engine: nothing of the old one is running
    resumed.restore(saved)
    result = resumed.run(first_step=2)
    s, r = result.steps, result.responses  # the restored rows and responses, then the resumed run's
    assert s["step"].tolist() == list(range(len(s))) and s["carried_in"].iloc[2] == len(saved["carried"])
    assert (s["responses_in"] == s[["finished", "truncated", "policy_stopped", "dropped", "carried_out"]].sum(axis=1)).all()
    assert not r.duplicated(KEY).any() and len(r) == s["responses_in"].sum() - s["carried_in"].sum()
    assert s["carried_out"].iloc[-1] == 0 and 0 < int(s["groups_trained"].iloc[2:].sum()) <= 16 - int(s["groups_trained"].iloc[:2].sum())


class _Recorder:
    """What a checkpoint asks of the recorder: its per-response signals (none here)."""

    def signals(self):
        return {}

    def restore_signals(self, signals):
        assert signals == {}


@pytest.mark.parametrize("kind", ["disaggregated", "hybrid"])
def test_checkpoint_round_trip_beside_the_rollout(kind, real_model_dir, tmp_path):
    """save_checkpoint / load_checkpoint / restore / restart_jobs on a simulated engine with the real trainer's jobs
    (the simulator's responses have no tokens: the updates train nothing, the plumbing is what is checked): the
    checkpoint holds the trainer's state behind the engine's weights and the updates not pushed yet; the resumed run
    re-runs exactly those, the mode takes them as before, and the run goes on to its end with its books balanced."""
    from lssim.sim.world import EngineConfig, SimEngine
    from lssim.traces.workload import Workload
    from real_backend.checkpoint import load_checkpoint, restart_jobs, restore, save_checkpoint
    from real_backend.trainer import GRPOTrainer
    from test_sim import COST, make_trace

    class _Engine(SimEngine):  # takes pushed weights (real_backend.engine.VLLMEngine.update_weights)
        def update_weights(self, state, version):
            self.pushed = version
            return 0.0

    trace = make_trace(np.minimum(np.random.default_rng(1).lognormal(4.0, 0.8, size=(4, 4, 2)).astype(int) + 1, 300),
                       max_tokens=300)
    mode = ModeConfig(kind, 1, 1)

    def world():
        wl = Workload(trace, seed=0)
        engine = _Engine(wl, COST, EngineConfig(1, 8, 10**7), batch_route=False)
        trainer = GRPOTrainer(str(real_model_dir), engine, None, threads=1)
        cfg = RunConfig(steps=4, groups_per_step=4, group_size=2, max_tokens=300)
        return Controller(engine, trainer, wl, make_policy("baseline"), cfg, mode=mode.build()), trainer, wl

    first, trainer, wl = world()
    trainer.keep_states(0)
    for step in range(2):
        first.run_step(step)
    pending = [job.step for job in first.mode.pending()]
    assert pending == ([0, 1] if kind == "disaggregated" else [1])  # disaggregated: rollout 2 needs update 0 only
    save_checkpoint(tmp_path, 1, first, trainer, wl, _Recorder(), {"mode": dataclasses.asdict(mode)})
    ckpt = load_checkpoint(tmp_path)
    assert [step for step, _ in ckpt.jobs] == pending and ckpt.mode_version == first.mode.version
    assert all(len(groups) == 4 for _, groups in ckpt.jobs)
    first.trainer.finish_jobs()

    resumed, new_trainer, new_wl = world()
    restore(ckpt, resumed, new_trainer, new_wl, _Recorder())
    restart_jobs(ckpt, resumed, new_trainer)
    assert [job.step for job in resumed.mode.pending()] == pending and all(j.rerun for j in resumed.mode.pending())
    result = resumed.run(first_step=2)
    new_trainer.finish_jobs()
    s = result.steps
    assert s["step"].tolist() == [0, 1, 2, 3] and int(s["groups_trained"].sum()) == 16
    assert (s["responses_in"] == s[["finished", "truncated", "policy_stopped", "dropped", "carried_out"]].sum(axis=1)).all()
    # each update ran once before the checkpoint or once after it; the engine got every version it needed
    assert [j.step for j in new_trainer.started_jobs()] == pending + [2, 3]
    assert resumed.mode.version == resumed.engine.pushed == (2 if kind == "disaggregated" else 3)  # rollout 3's weights


class _Job:
    """A finished update as a checkpoint sees one (real_backend.train_job.ThreadTrainJob's fields)."""

    def __init__(self, step, start=math.nan, end=math.nan, rerun=False, done=True):
        self.step, self.version, self.start, self.end, self.rerun = step, step + 1, start, end, rerun
        self.metrics = {"update_seconds": 0.5, "loss": 0.1}
        self.future = Future()
        self.notified = 0
        if done:
            self.future.set_result(None)

    def phases(self):
        return {"logprob": 0.0, "reference": 0.0, "update": 0.5, "sync": 0.1, "switch": 0.0}

    def ready(self, engine):
        return self.future.done()

    def wait(self, engine):
        pass

    def notify(self, engine):
        self.notified += 1

    def push(self, engine):
        pass


@pytest.mark.parametrize("kind", ["disaggregated", "async", "hybrid"])
def test_resumed_modes_take_their_pending_updates_as_before(kind):
    mode = ModeConfig(kind, 1, 1).build()
    mode.bind(object(), 4)
    mode.version = 3
    jobs = [_Job(3), _Job(4)]
    mode.resume_jobs(jobs)
    assert mode.pending() == jobs
    assert [j.notified for j in jobs] == ([1, 1] if kind == "async" else [0, 0])  # async takes each as it ends
    if kind == "async":
        assert mode.on_wake() is jobs[1] and mode.version == 5 and mode.pending() == []
    else:
        mode.before_rollout(5)  # disaggregated needs version 4, hybrid version 5
        assert mode.version == (4 if kind == "disaggregated" else 5)
        assert mode.pending() == jobs[2 - (kind == "disaggregated"):]


def test_step_rows_of_a_resumed_run():
    """Rows before the resume keep the killed run's clock; an update re-run after it fills in its metrics but not its
    step's times; the first resumed step counts from its own rollout (the new engine's clock)."""
    from real_backend.train_job import fill_step_rows

    def row(step, start, end=math.nan):
        return {"step": step, "rollout_start": start, "rollout_end": start + 1, "train_start": math.nan, "train_end": end,
                "train_seconds": math.nan}

    rows = [row(0, 0.0, 2.0), row(1, 2.0, 4.5), row(2, 4.5), row(3, 0.3), row(4, 2.0)]
    jobs = [_Job(2, 1.0, 1.5, rerun=True), _Job(3, 1.3, 2.0), _Job(4, 3.0, 4.0, done=False)]
    fill_step_rows(rows, jobs, restarts={3})
    assert [r["step_seconds"] for r in rows[:2]] == [2.0, 2.5]
    assert math.isnan(rows[2]["train_end"]) and math.isnan(rows[2]["step_seconds"]) and rows[2]["trainer_loss"] == 0.1
    assert rows[3]["train_end"] == 2.0 and rows[3]["step_seconds"] == pytest.approx(1.7)  # from its rollout's start
    assert math.isnan(rows[4]["step_seconds"])  # its update still runs


def test_the_trainer_keeps_the_state_behind_each_version(real_model_dir):
    """keep_states: the state after each update, by the version it made; a checkpoint asks for the engine's, and the
    older ones go."""
    torch = pytest.importorskip("torch")
    from test_real_modes_stream import _groups, _trainer

    groups, prompts = _groups(np.random.default_rng(5))
    trainer = _trainer(real_model_dir, prompts)
    trainer.keep_states(0)
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    job = trainer.start(groups, 0)
    assert job.groups == groups  # kept: a checkpoint taken while it runs saves them
    job.wait(None)
    assert sorted(trainer.states) == [0, 1]
    for k, v in trainer.state_for(0)["model"].items():
        assert torch.equal(v, before[k])
    after = trainer.state_for(1)
    assert sorted(trainer.states) == [1] and after["trainer"]["version"] == 1
    for k, v in trainer.model.state_dict().items():
        assert torch.equal(after["model"][k], v)
    assert trainer.state_for(3) is after  # versions 2-3 made by steps with nothing to train: version 1's weights
    with pytest.raises(ValueError, match="no trainer state kept for weights version 0"):
        trainer.state_for(0)


def test_step_lines_wait_for_the_train_time(capsys):
    from real_backend.run import StepLines

    def row(step, train):
        return {"step": step, "rollout_seconds": 1.0, "tokens": 10, "train_seconds": train, "responses_in": 4, "finished": 4,
                "truncated": 0, "policy_stopped": 0, "dropped": 0, "carried_out": 0, "groups_trained": 1, "effective_groups": 1}

    lines = StepLines()
    first, second = row(0, math.nan), row(1, math.nan)
    lines(first)
    assert capsys.readouterr().out == ""
    first["train_seconds"] = 0.25  # its update ended (train_job.fill_step_rows fills the live row)
    lines(second)
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 and out[0].startswith("step   0") and "train  0.25 s" in out[0]
    lines.flush()
    assert capsys.readouterr().out.startswith("step   1")
    said = []
    elsewhere = StepLines(said.append)  # validate --mode's lines go to stderr, indented
    elsewhere(row(2, 0.5))
    assert len(said) == 1 and said[0].startswith("step   2") and capsys.readouterr().out == ""


@pytest.mark.real
@pytest.mark.parametrize("kind", ["hybrid", "async"])
def test_a_resumed_run_continues_in_its_mode(kind, lent_engine, real_model_dir, tmp_path, capsys):
    from lssim.cli import main
    from lssim.traces.trace import load_trace
    from real_backend.checkpoint import load_checkpoint

    out = tmp_path / kind
    # hybrid's trainer runs its passes in a process of its own (real_backend.train_compute): the resume keeps it
    extra = ["--staleness", "1"] if kind == "async" else ["--trainer-process"]
    assert main(["real", "--model-dir", str(real_model_dir), *SHAPE, "--mode", kind, *extra, "--steps", "2",
                 "--out", str(out)]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("step ")]
    assert len(lines) == 2 and not any("nan" in line for line in lines)  # each step's train time, once known
    ckpt = load_checkpoint(out)
    assert ckpt.step == 1 and ckpt.run["mode"]["mode"] == kind and ckpt.jobs  # step 1's update was still running
    # every response held after step 1 is in the checkpoint (async: those generating across the boundary, as carried)
    assert len(ckpt.carried) == pd.read_parquet(out / "steps.parquet")["carried_out"].iloc[1]
    with pytest.raises(SystemExit) as refused:  # a resumed run keeps its mode
        main(["real", "--resume", str(out), "--steps", "3", "--mode", "hybrid" if kind == "async" else "async"])
    assert refused.value.code == 2 and "keeps its mode" in capsys.readouterr().err
    assert main(["real", "--resume", str(out), "--steps", "3"]) == 0
    steps = pd.read_parquet(out / "steps.parquet")
    trace = load_trace(out / "trace.parquet")
    meta = json.loads((out / "meta.json").read_text())
    assert steps["step"].tolist() == [0, 1, 2] and meta["status"] == "finished"
    assert meta["resumes"][0]["after_step"] == 1 and meta["resumes"][0]["updates_rerun"] == len(ckpt.jobs)
    assert not trace.duplicated(KEY).any()
    assert (steps["responses_in"] == steps[["finished", "truncated", "policy_stopped", "dropped", "carried_out"]].sum(axis=1)).all()
    assert steps["carried_in"].iloc[2] == steps["carried_out"].iloc[1]
    assert steps["trainer_optimizer_steps"].notna().all() and np.isfinite(steps["step_seconds"].iloc[2])
    assert load_checkpoint(out).step == 2
    if kind == "hybrid":  # groups streamed into the update while the rollout ran, and it stayed on-policy
        assert (steps["trainer_streamed_groups"].iloc[[0, 2]] > 0).all() and steps["max_staleness"].max() == 0
        assert (steps["train_start"].iloc[[0, 2]] < steps["rollout_end"].iloc[[0, 2]]).any()
        assert meta["mode"]["elastic"] is False  # the trainer's thread shares the engine's cores: nothing joins it
        assert meta["setup"]["trainer_process"] is True
    else:
        assert steps["max_staleness"].max() <= 1
