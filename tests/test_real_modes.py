"""The execution modes on the real backend (lssim.loop.modes over real_backend.train_job), and the TrainJob protocol
the modes are written against in both worlds.

The `real` test runs `lssim real --mode async` in this process on the session's engine (tests/conftest.py), through
a proxy the CLI cannot close, then replays its trace in the same mode."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from lssim.loop.modes import Async, Disaggregated, ModeConfig, PricedTrainJob

SHAPE = ["--n-prompts", "16", "--groups-per-step", "4", "--group-size", "4", "--max-tokens", "96"]


class _Clock:
    """A simulated world's clock: advance moves it, wake_at records timers."""

    def __init__(self):
        self.t, self.timers = 0.0, []

    def now(self):
        return self.t

    def advance(self, seconds):
        assert seconds >= 0
        self.t += seconds

    def wake_at(self, t):
        self.timers.append(t)


class _Job:
    """A job whose end is not known in advance (as a real trainer's): done when the test says so."""

    def __init__(self, step):
        self.step, self.version, self.done, self.pushed, self.waited = step, step + 1, False, 0, 0

    def ready(self, engine):
        return self.done

    def wait(self, engine):
        self.waited += 1
        self.done = True

    def notify(self, engine):
        pass

    def push(self, engine):
        self.pushed += 1


def test_sim_train_job_protocol_moves_the_clock():
    clock = _Clock()
    job = PricedTrainJob(3, start=1.0, end=2.5, phases={"logprob": 0, "reference": 0, "update": 1.5, "sync": 0.25, "switch": 0})
    assert job.version == 4 and not job.ready(clock)
    job.notify(clock)
    assert clock.timers == [2.5]
    job.wait(clock)
    assert clock.now() == 2.5 and job.ready(clock)
    job.push(clock)
    assert clock.now() == 2.75
    with pytest.raises(ValueError, match="end 1.0 before start 2.0"):
        PricedTrainJob(0, start=2.0, end=1.0, phases={})


def test_async_takes_jobs_in_version_order_and_pushes_the_newest():
    mode = Async(ModeConfig(mode="async", rollout_devices=1, train_devices=1, staleness=2))
    mode.bind(_Clock(), 2)
    first, second = _Job(0), _Job(1)
    mode.train({}, 0, [], 0.0, 1.0, job=first)
    mode.train({}, 1, [], 1.0, 2.0, job=second)
    second.done = True
    assert mode.on_wake() is None and mode.version == 0  # weights never overtake an older update still running
    first.done = True
    assert mode.on_wake() is second and mode.version == 2
    assert mode.on_wake() is None


def test_disaggregated_waits_for_every_older_job_and_pushes_once():
    mode = Disaggregated(ModeConfig(mode="disaggregated", rollout_devices=1, train_devices=1))
    mode.bind(_Clock(), 2)
    jobs = [_Job(s) for s in range(3)]
    for s, job in enumerate(jobs):
        timing = mode.train({}, s, [], float(s), float(s) + 1, job=job)
        assert math.isnan(timing.end)  # a real job's end is known once it ends (real_backend.train_job.fill_step_rows)
    mode.before_rollout(3)  # rollout 3 needs version 2: jobs 0 and 1
    assert [j.waited for j in jobs] == [1, 1, 0] and [j.pushed for j in jobs] == [0, 1, 0] and mode.version == 2


@pytest.mark.real
def test_async_real_run_bounds_staleness_records_versions_and_replays_in_its_mode(lent_engine, real_model_dir, tmp_path,
                                                                                   capsys, monkeypatch):
    from lssim.cli import main
    from lssim.traces.trace import load_trace
    out = tmp_path / "async"
    # every response the run starts is finished or aborted on the engine (the run aborts what is left at its end)
    started = set()
    monkeypatch.setattr(lent_engine, "observers", [*lent_engine.observers,
                                                   lambda r, what: started.add((r.step, r.prompt_id, r.sample_idx))])
    assert main(["real", "--model-dir", str(real_model_dir), *SHAPE, "--mode", "async", "--staleness", "1",
                 "--steps", "4", "--out", str(out), "--quiet"]) == 0
    steps = pd.read_parquet(out / "steps.parquet")
    trace = load_trace(out / "trace.parquet")
    meta = json.loads((out / "meta.json").read_text())
    assert meta["status"] == "finished" and meta["mode"]["mode"] == "async" and meta["mode"]["staleness"] == 1
    # 16 groups in all; how many trained by step 3 depends on timing (one may still be generating when the run ends)
    trained_groups = int(steps["groups_trained"].sum())
    assert steps["step"].tolist() == [0, 1, 2, 3] and (steps["groups_trained"] >= 1).all() and 12 <= trained_groups <= 16
    # every step's update ran beside the rollout and its measured times were filled in once it ended
    for col in ("train_start", "train_end", "update_seconds", "step_seconds"):
        assert steps[col].notna().all() and (steps[col] >= 0).all(), col
    assert (steps["train_start"] >= steps["rollout_end"] - 1e-9).all()
    # the bound: no trained token more than 1 version stale; and the rollout did run ahead (async, not lockstep)
    assert steps["max_staleness"].max() == 1
    trained = trace[trace["trained"]]
    assert (trained["train_step"] - trained["policy_version_first"] <= 1).all()
    assert (trained["policy_version_first"] <= trained["policy_version_last"]).all()
    assert (trained["policy_version_last"] <= trained["train_step"]).all()
    assert (trained["train_step"] >= trained["step"]).all()
    assert (trained["train_step"] > trained["policy_version_first"]).any()
    # weights arrived mid-generation: some response's first and last tokens are of different versions
    assert (trace["policy_version_first"] < trace["policy_version_last"]).any()
    assert lent_engine.weight_version >= 3  # the pushes reached the engine (the last update may end after the run)
    # what the run left unfinished at its end is in unfinished.parquet (issue 16): with the trace, every response it
    # started, none in both; each held with the tokens it had, below its budget
    from lssim.analysis.fidelity.run import KEY, UNFINISHED_FILE

    unfinished = pd.read_parquet(out / UNFINISHED_FILE)
    assert unfinished.attrs["after_step"] == 3 and len(unfinished) == steps["carried_out"].iloc[-1]
    assert (unfinished["generated"] < unfinished["max_tokens"]).all()
    traced, left = (set(map(tuple, f[KEY].to_numpy().tolist())) for f in (trace, unfinished))
    assert started and traced | left == started and not traced & left
    # the run is checkpointed like any other (tests/test_real_modes_resume.py resumes one)
    from real_backend.checkpoint import load_checkpoint

    assert load_checkpoint(out).step == 3

    # the trace replays in the same mode, from the responses it recorded
    capsys.readouterr()
    assert main(["replay", str(out / "trace.parquet"), "--mode", "async", "--staleness", "1", "--policy", "baseline",
                 "--model", "tiny-ref", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)["baseline"]
    assert report["max_staleness"] <= 1 and trained_groups <= report["groups_trained"] <= 16
    assert report["exact_fraction"] >= 0.9  # what the trace holds replays as recorded

    # and `lssim validate --mode any --runs` compares its step times against the simulator in its mode
    from real_backend.validate_modes import compare_modes
    from lssim.analysis.fidelity.run import load_run

    frames = compare_modes([load_run(out)], "real_backend/data/profile_cpu.json", "real_backend/data/profile_trainer_cpu.json")
    table = frames["summary"]
    assert table["mode"].tolist() == ["async"] and table.loc[table.index[0], "predicted_max_staleness"] <= 1
    steps = frames["steps"]
    assert np.isfinite(steps.loc[steps["in_twin"], "ape_pct"]).all()
    # a step the twin did not reach is one after it had trained every group (it got there in fewer steps)
    missing = steps.loc[~steps["in_twin"], "step"]
    assert table["steps_not_in_twin"].iloc[0] == len(missing)
    if len(missing):
        assert missing.tolist() == list(range(4 - len(missing), 4)) and steps["predicted_groups"].sum() == 16


def test_mode_summary_ranks_modes_and_anchors_on_the_collocated_speed_level():
    from real_backend.validate_modes import ranking_agrees, summarize

    rows = []
    for mode, measured, predicted in (("collocated", 4.0, 2.0), ("async", 2.0, 1.1), ("disaggregated", 3.0, 1.4)):
        for step in range(3):
            rows.append({"label": mode, "mode": mode, "step": step, "in_twin": True, "measured_seconds": measured,
                         "predicted_seconds": predicted,
                         "measured_groups": 4, "predicted_groups": 4, "measured_max_staleness": 0, "predicted_max_staleness": 0})
    steps = pd.DataFrame(rows)
    steps["ape_pct"] = (steps["predicted_seconds"] - steps["measured_seconds"]).abs() / steps["measured_seconds"] * 100
    steps["signed_pct"] = (steps["predicted_seconds"] / steps["measured_seconds"] - 1) * 100
    table = summarize(steps)
    assert table["measured_rank"].to_dict() == {"collocated": 3, "async": 1, "disaggregated": 2}
    assert ranking_agrees(table)
    assert table.loc["collocated", "step_median_ape_pct"] == pytest.approx(50.0)
    assert table["speed_level"].iloc[0] == pytest.approx(2.0)  # collocated: measured twice the prediction
    assert table.loc["async", "anchored_median_ape_pct"] == pytest.approx(10.0)
    assert table.loc["disaggregated", "anchored_median_ape_pct"] == pytest.approx(100 * 0.2 / 3.0)
    # the twin trained everything a step sooner than the run: the run's last step is measured, not predicted
    extra = {"label": "async", "mode": "async", "step": 3, "in_twin": False, "measured_seconds": 2.0,
             "predicted_seconds": np.nan, "measured_groups": 4, "predicted_groups": 0, "measured_max_staleness": 0,
             "predicted_max_staleness": -1, "ape_pct": np.nan, "signed_pct": np.nan}
    short = summarize(pd.concat([steps, pd.DataFrame([extra])], ignore_index=True))
    assert short.loc["async", "steps_not_in_twin"] == 1 and short.loc["collocated", "steps_not_in_twin"] == 0
    assert short.loc["async", "step_median_ape_pct"] == pytest.approx(45.0)  # the steps both have
    assert short.loc["async", "measured_s_per_group"] == pytest.approx(8.0 / 16)
    assert short.loc["async", "predicted_s_per_group"] == pytest.approx(3.3 / 12)
    steps.loc[steps["mode"] == "async", "predicted_seconds"] = 1.6  # now predicted slower than disaggregated
    assert not ranking_agrees(summarize(steps))
