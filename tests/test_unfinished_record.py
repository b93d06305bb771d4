"""unfinished.parquet: what a run's controller still held unfinished after its last step (real_backend.recorder),
in every mode, so that the simulated twin of an async run knows the responses it left generating (issue 16).

The real run is tests/test_real_modes.py's async test; here the writer on hand-built controller state, and the
recorder on the simulator's controller in async mode (the same Controller the real backend runs), whose every
started response must be in the trace or the file, never both."""

from __future__ import annotations

import json
from dataclasses import asdict
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from lssim.loop.controller import Controller, RunConfig
from lssim.loop.core import Request
from lssim.cost import ProfiledCostModel
from lssim.analysis.fidelity.run import KEY, UNFINISHED_COLUMNS, UNFINISHED_FILE, load_run, twin_trace
from lssim.loop.policy import make_policy
from lssim.analysis.replay import SimSetup
from lssim.traces.trace import load_trace
from lssim.traces.workload import Workload
from real_backend.recorder import Recorder, unfinished_frame, write_unfinished

REAL_TRACE = "traces/real_cpu_baseline.parquet"
TRAIN_PROFILE = "real_backend/data/profile_trainer_cpu.json"
MODEL = ProfiledCostModel(c0=3e-3, c1=1.2e-4, c2=1e-7, c3=0.0, p0=4e-3, p1=3e-5)


def _request(rid: int, group: int, sample: int, generated: int, done: bool = False, step: int = 2) -> Request:
    return Request(rid=rid, group_id=group, prompt_id=100 + group, sample_idx=sample, step=step, prompt_len=20 + group,
                   max_tokens=96, generated=generated, tokens_before_resume=generated // 2,
                   finish_reason="stop" if done else "")


def _held_state():
    """A controller after step 3: r1 carried, r2 kept generating (also listed as its group's member), r3 ended in an
    open group (in the trace already), r4 a member of that group that has not ended, r5 ended and kept by mistake."""
    r1, r2, r3, r4, r5 = (_request(1, 7, 0, 40), _request(2, 8, 1, 12, step=3), _request(3, 8, 0, 30, done=True),
                          _request(4, 8, 2, 5), _request(5, 9, 0, 96, done=True))
    held = {"carried": [r1], "kept": [r5, r2], "open group": [r3, r2, r4]}  # as Controller.held() lists them
    return SimpleNamespace(held=lambda: held, step_rows=[{"step": s} for s in range(4)])


def test_the_writer_lists_each_held_response_that_has_not_ended_once_in_rid_order():
    frame = unfinished_frame(_held_state())
    assert frame["held"].tolist() == ["carried", "kept", "open group"]
    expected = pd.DataFrame([(2, 107, 0, 7, 27, 40, 20, 96), (3, 108, 1, 8, 28, 12, 6, 96), (2, 108, 2, 8, 28, 5, 2, 96)],
                            columns=UNFINISHED_COLUMNS)
    pd.testing.assert_frame_equal(frame[UNFINISHED_COLUMNS], expected)
    assert all(frame[c].dtype == np.int64 for c in UNFINISHED_COLUMNS)
    assert frame.attrs["after_step"] == 3


def test_a_controller_holding_nothing_writes_an_empty_file_of_the_same_columns(tmp_path):
    frame = unfinished_frame(SimpleNamespace(held=lambda: {"carried": [], "kept": [], "open group": []}, step_rows=[]))
    assert frame.empty and frame.attrs["after_step"] == -1
    write_unfinished(frame, tmp_path / UNFINISHED_FILE)
    back = pd.read_parquet(tmp_path / UNFINISHED_FILE)
    assert back.empty and [*UNFINISHED_COLUMNS, "held"] == back.columns.tolist() and back.attrs["after_step"] == -1


def test_the_file_is_written_whole_or_not_at_all(tmp_path, monkeypatch):
    path = tmp_path / UNFINISHED_FILE
    frame = unfinished_frame(_held_state())
    write_unfinished(frame, path)
    back = pd.read_parquet(path)
    pd.testing.assert_frame_equal(back, frame)
    assert back.attrs["after_step"] == 3  # the step it was taken after travels with it (validate_twin.load_recorded)

    def broken(self, p, **kw):
        with open(p, "wb") as f:
            f.write(b"half")
        raise OSError("disk full")

    monkeypatch.setattr(pd.DataFrame, "to_parquet", broken)
    with pytest.raises(OSError, match="disk full"):
        write_unfinished(frame.iloc[:1], path)
    monkeypatch.undo()
    pd.testing.assert_frame_equal(pd.read_parquet(path), frame)  # the old file, whole
    assert [p.name for p in tmp_path.iterdir()] == [UNFINISHED_FILE]  # no temporary file left behind
    with pytest.raises(ValueError, match=f"{UNFINISHED_FILE}: response .* listed twice"):
        write_unfinished(pd.concat([frame, frame.iloc[:1]]), path)
    with pytest.raises(ValueError, match=f"{UNFINISHED_FILE}: unfinished responses lack column.*generated"):
        write_unfinished(frame.drop(columns="generated"), path)


def _recorded_async_run(folder, tmp_path, steps: int = 4, seed: int = 0, mode: str = "async", policy: str = "baseline"):
    """The simulator's controller in async mode (staleness 1; or `mode`) under `policy` with the real backend's recorder
    attached, as real_backend.world.run_real attaches it; returns the keys of every response it submitted and the
    controller."""
    from lssim.analysis.replay import SimEngine
    from lssim.sim.trainer import SimTrainer

    profile = tmp_path / "profile.json"
    MODEL.to_json(profile, meta={"command": "test"})
    setup = SimSetup(model="tiny-ref", n_instances=1, max_num_seqs=256, kv_capacity_tokens=262_144, profile=str(profile),
                     train=TRAIN_PROFILE, mode=mode, train_devices=None if mode == "collocated" else 1, staleness=1)
    workload = Workload(load_trace(REAL_TRACE), seed=seed)
    engine = SimEngine(workload, setup.cost_model(), setup.engine_config())
    mode = setup.mode_config()
    trainer = SimTrainer(engine, setup.train_cost(), n_devices=mode.train_devices, collocated=mode.collocated)
    # more data than the steps take: the run stops with groups admitted and generating, as a real one cut at --steps
    config = RunConfig(steps=steps, groups_per_step=4, group_size=4, max_tokens=256, seed=seed, total_groups=8 * steps)
    controller = Controller(engine, trainer, workload, make_policy(policy), config, mode=mode.build())
    started = set()
    submit = engine.submit

    def watched(requests):
        started.update((r.step, r.prompt_id, r.sample_idx) for r in requests)
        return submit(requests)

    engine.submit = watched
    run_cut = engine.run_cut  # the cut and carry routes submit a whole rollout through run_cut

    def watched_cut(requests, columns, *args, **kw):  # read from the columns: the objects are made only where read
        started.update(zip(columns.step.tolist(), columns.prompt_id.tolist(), columns.sample_idx.tolist()))
        return run_cut(requests, columns, *args, **kw)

    engine.run_cut = watched_cut
    recorder = Recorder(folder, meta={"policy": policy, "config": asdict(config), "mode": asdict(mode)})
    recorder.attach(controller)
    controller.add_observer(recorder.on_step)
    controller.run()
    recorder.finish("finished")
    return started, controller


def test_an_async_run_leaves_every_started_response_in_its_trace_or_its_unfinished_file(tmp_path):
    out = tmp_path / "run"
    started, controller = _recorded_async_run(out, tmp_path)
    run = load_run(out)
    u = run.unfinished
    assert len(controller.kept) > 0 and len(u) == len(controller.kept)  # the run ended with responses generating
    assert set(u["held"]) == {"kept"} and u.attrs["after_step"] == int(run.steps["step"].iloc[-1])
    assert (u["generated"] < u["max_tokens"]).all() and (u["generated"] >= u["tokens_before_resume"]).all()
    traced = set(map(tuple, run.trace[KEY].to_numpy().tolist()))
    unfinished = set(map(tuple, u[KEY].to_numpy().tolist()))
    assert traced | unfinished == started and not traced & unfinished
    assert int(run.steps["carried_out"].iloc[-1]) == len(u)  # the last step's books say as much
    twin = twin_trace(run)  # the twin's trace: the run's own plus these, censored where the run left them
    assert len(twin) == len(run.trace) + len(u)


def test_a_collocated_run_writes_what_its_checkpoint_holds(tmp_path):
    """Both routes agree: the file of a collocated run that carries responses (segment) lists the controller's
    carried responses, the list its checkpoint keeps (real_backend.validate_twin.unfinished_from_checkpoint)."""
    out = tmp_path / "run"
    started, controller = _recorded_async_run(out, tmp_path, steps=3, mode="collocated", policy="segment(window=32)")
    carried = sorted(controller.carried, key=lambda r: r.rid)
    assert len(carried) > 0
    from_checkpoint = pd.DataFrame([(r.step, r.prompt_id, r.sample_idx, r.group_id, r.prompt_len, r.generated,
                                     r.tokens_before_resume, r.max_tokens) for r in carried], columns=UNFINISHED_COLUMNS)
    run = load_run(out)
    pd.testing.assert_frame_equal(run.unfinished[UNFINISHED_COLUMNS], from_checkpoint, check_dtype=False)
    assert set(run.unfinished["held"]) == {"carried"}
    traced = set(map(tuple, run.trace[KEY].to_numpy().tolist()))
    assert traced | set(map(tuple, from_checkpoint[KEY].to_numpy().tolist())) == started


def test_load_recorded_prefers_the_file_and_refuses_one_of_another_step(tmp_path, capsys):
    from real_backend.validate_twin import load_recorded

    out = tmp_path / "run"
    _recorded_async_run(out, tmp_path, steps=3)
    assert len(load_recorded(out).unfinished) > 0
    # a kill between two renames: the file one step ahead of steps.parquet (written first, see the recorder)
    u = pd.read_parquet(out / UNFINISHED_FILE)
    u.attrs["after_step"] = 3
    u.to_parquet(out / UNFINISHED_FILE, index=False)
    run = load_recorded(out)
    assert run.unfinished.empty and "is of step 3, its last recorded step 2" in capsys.readouterr().err
    meta = json.loads((out / "meta.json").read_text())
    assert meta["status"] == "finished" and meta["steps_done"] == 3


def test_a_new_run_in_the_folder_removes_the_old_runs_file(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    write_unfinished(unfinished_frame(_held_state()), out / UNFINISHED_FILE)
    (out / f".{UNFINISHED_FILE}.x.tmp").write_text("half")
    Recorder(out).remove_stale()
    assert list(out.iterdir()) == []
