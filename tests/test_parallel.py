"""Sweeps that scale out (lssim.analysis.parallel, lssim.analysis.sweep): the process pool and Ray give the serial table, an
interrupted sweep resumes without rerunning what it finished, parameter grids expand as documented; and `lssim replay
--no-reference` runs only what was asked."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from lssim.cli import main
from lssim.analysis.parallel import SimJob, run_jobs, summary_row
from lssim.analysis.replay import SimSetup
from lssim.analysis.sweep import expand_grid, sweep_specs
from lssim.traces.synth import get_preset, synthesize

SPECS = ["baseline", "hadb", "april", "hadb+april", "seer+spec_tail"]
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def trace():
    return synthesize(get_preset("math7b").replace(steps=3, prompts_per_step=12, n_prompts=24, group_size=4))


@pytest.fixture(scope="module")
def jobs(trace):
    small, async2 = SimSetup(n_instances=2), SimSetup(n_instances=2, mode="async", train_devices=2, staleness=2)
    return [SimJob(trace, spec, setup) for spec in SPECS for setup in (small, async2)]


@pytest.fixture(scope="module")
def serial(jobs):
    return run_jobs(jobs, workers=1)


def test_the_pool_returns_exactly_the_serial_table(jobs, serial):
    assert serial["error"].isna().all() and list(serial["policy"]) == [j.policy for j in jobs]
    assert serial["rollout_seconds"].gt(0).all() and serial["job"].is_unique
    pd.testing.assert_frame_equal(run_jobs(jobs, workers=2), serial)
    # each row knows the trace it replayed: the length bias of what it trained (baseline on the whole trace: 1)
    assert serial["length_bias"].notna().all()
    assert serial.loc[serial["policy"] == "baseline", "length_bias"].iloc[0] == pytest.approx(1.0)


def test_a_job_that_fails_is_a_row_with_its_error(trace):
    table = run_jobs([SimJob(trace, "baseline", SimSetup(n_instances=2)), SimJob(trace, "nosuchpolicy")], workers=1)
    assert table["error"].isna().tolist() == [True, False]
    assert "nosuchpolicy" in table.loc[1, "error"] and pd.isna(table.loc[1, "rollout_seconds"])


def test_resume_skips_the_jobs_already_in_the_file_and_runs_the_rest(jobs, serial, tmp_path):
    out = tmp_path / "runs.jsonl"
    run_jobs(jobs[:3], workers=1, out=out)
    lines = out.read_text().splitlines()
    assert len(lines) == 3
    # Mark one finished run so that a rerun would show, and cut the file as an interruption mid-write would.
    first = json.loads(lines[0])
    first["row"]["rollout_seconds"] = -1.0
    out.write_text("\n".join([json.dumps(first)] + lines[1:]) + "\n" + lines[2][:25])
    table = run_jobs(jobs, workers=2, out=out, resume=True)
    assert table.loc[0, "rollout_seconds"] == -1.0  # read back, not run again
    pd.testing.assert_frame_equal(table.drop(index=0), serial.drop(index=0))
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == len(jobs) and {r["job"] for r in records} == set(serial["job"])
    # Without resume the file starts afresh: every job runs again.
    pd.testing.assert_frame_equal(run_jobs(jobs[:2], workers=1, out=out), serial.iloc[:2])
    assert len(out.read_text().splitlines()) == 2


_ROWS_BEFORE_THE_CUT = 3


def _row_then_ctrl_c(policy, result, lengths):
    """summary_row for the first runs, then the Ctrl-C a user would press (a real KeyboardInterrupt in the run)."""
    global _ROWS_BEFORE_THE_CUT
    if _ROWS_BEFORE_THE_CUT == 0:
        raise KeyboardInterrupt
    _ROWS_BEFORE_THE_CUT -= 1
    return summary_row(policy, result, lengths)


def test_a_sweep_interrupted_by_ctrl_c_resumes_with_only_the_missing_runs(jobs, serial, tmp_path):
    out = tmp_path / "runs.jsonl"
    with pytest.raises(KeyboardInterrupt):
        run_jobs(jobs, workers=1, out=out, row=_row_then_ctrl_c)
    before = out.read_text().splitlines()
    assert len(before) == 3  # what finished before the cut, flushed
    table = run_jobs(jobs, workers=2, out=out, resume=True)
    after = out.read_text().splitlines()
    assert after[:3] == before and len(after) == len(jobs)  # the rest ran once each; nothing before the cut again
    assert sorted(json.loads(line)["job"] for line in after) == sorted(serial["job"])
    pd.testing.assert_frame_equal(table, serial)


def _sweep_lines(path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_the_sweep_command_cut_by_sigint_resumes_to_the_uncut_table(trace, tmp_path):
    """A real cut: `lssim sweep` in a process of its own on a pool of 2, SIGINT once a run is written (Ctrl-C), then
    --resume; the table equals an uncut sweep's and only the missing runs ran."""
    path = tmp_path / "t.parquet"
    trace.to_parquet(path)
    argv = [sys.executable, "-m", "lssim.cli", "sweep", str(path), "--policies", "april,lpt,dapo,hadb", "--max-size", "2",
            "--grid", "april(over_provision=1.1,1.2,1.3,1.4,1.5,1.6,1.7,1.8,1.9,2.0)+lpt(keep=4,8)+hadb(short_batch_factor=1,2)",
            "--instances", "2", "--workers", "2", "--json"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    subprocess.run(argv + ["--out", str(tmp_path / "uncut")], check=True, env=env, stdout=subprocess.DEVNULL)
    cut = tmp_path / "cut"
    stream = cut / "runs.jsonl"
    child = subprocess.Popen(argv + ["--out", str(cut)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while child.poll() is None and _sweep_lines(stream) < 2:
        time.sleep(0.01)
    child.send_signal(signal.SIGINT)
    assert child.wait(timeout=120) != 0  # cut, not finished
    before = stream.read_text().splitlines()
    complete = [line for line in before if line.endswith("}")]
    runs = len(json.loads((tmp_path / "uncut" / "sweep.json").read_text())["results"])
    assert 2 <= len(complete) < runs
    subprocess.run(argv + ["--out", str(cut), "--resume"], check=True, env=env, stdout=subprocess.DEVNULL)
    after = stream.read_text().splitlines()
    assert after[:len(complete)] == complete and len(after) == runs == len({json.loads(line)["job"] for line in after})
    assert (cut / "sweep.csv").read_text() == (tmp_path / "uncut" / "sweep.csv").read_text()


def test_the_fingerprint_is_the_trace_content_and_the_run(trace, tmp_path):
    path = tmp_path / "t.parquet"
    trace.to_parquet(path)
    table = run_jobs([SimJob(path, "baseline"), SimJob(trace.copy(), "baseline"), SimJob(trace, "baseline", seed=1),
                      SimJob(trace, "baseline", SimSetup(n_instances=4))], workers=1)
    assert table.loc[0, "job"] == table.loc[1, "job"]
    assert table["job"].nunique() == 3


def test_resume_needs_an_output_file_and_a_file_of_records(jobs, tmp_path):
    with pytest.raises(ValueError, match="resume"):
        run_jobs(jobs, resume=True)
    bad = tmp_path / "other.jsonl"
    bad.write_text('{"something": 1}\n')
    with pytest.raises(ValueError, match="other.jsonl: line 1"):
        run_jobs(jobs[:1], out=bad, resume=True)


def test_grids_expand_cartesian_with_the_first_parameter_slowest():
    assert expand_grid("hadb(short_batch_factor=1,2,4)") == [
        "hadb(short_batch_factor=1)", "hadb(short_batch_factor=2)", "hadb(short_batch_factor=4)"]
    assert expand_grid("hadb(short_batch_factor=1,2, ema=0.5)+april(over_provision=1.5,2)") == [
        "hadb(short_batch_factor=1,ema=0.5)+april(over_provision=1.5)", "hadb(short_batch_factor=1,ema=0.5)+april(over_provision=2)",
        "hadb(short_batch_factor=2,ema=0.5)+april(over_provision=1.5)", "hadb(short_batch_factor=2,ema=0.5)+april(over_provision=2)"]
    assert expand_grid("x(a='p,q','r', b=[1,2],[3])") == ["x(a='p,q',b=[1,2])", "x(a='p,q',b=[3])", "x(a='r',b=[1,2])", "x(a='r',b=[3])"]
    assert expand_grid("hadb") == ["hadb"]
    assert sweep_specs(["hadb", "april"], 1, ["hadb(ema=0.5)", "hadb"]) == ["baseline", "hadb", "april", "hadb(ema=0.5)"]
    # members are split as make_policy splits a spec (lssim.loop.policy.split_policy_spec): '+' inside parentheses stays
    assert expand_grid("x(a='p+q','r')+y") == ["x(a='p+q')+y", "x(a='r')+y"]
    for bad, why in (("hadb(1,2)", "before any key"), ("hadb(a=1,a=2)", "given twice"), ("hadb(a=1,zz z)", "not a Python literal"),
                     ("", "empty policy spec"), ("9hadb(a=1)", "cannot parse policy '9hadb")):
        with pytest.raises(ValueError, match=why):
            expand_grid(bad)


def test_cli_sweep_runs_a_grid_in_parallel_and_resumes(trace, tmp_path, capsys):
    path, out = tmp_path / "t.parquet", tmp_path / "sweep"
    trace.to_parquet(path)
    argv = ["sweep", str(path), "--grid", "hadb(short_batch_factor=1,4)+april(over_provision=1.5,2)", "--instances", "2",
            "--workers", "2", "--json", "--out", str(out)]
    assert main(argv) == 0
    first = json.loads(capsys.readouterr().out)
    assert [r["policy"] for r in first["results"]].count("baseline") == 1 and len(first["results"]) == 5
    assert main(argv + ["--resume"]) == 0
    assert json.loads(capsys.readouterr().out)["results"] == first["results"]
    assert len((out / "runs.jsonl").read_text().splitlines()) == 5


def test_ray_on_a_local_instance_returns_what_the_pool_returns(jobs, serial):
    pytest.importorskip("ray", reason="Ray is not installed (pip install 'ray>=2.9'); its path is untested here")
    pd.testing.assert_frame_equal(run_jobs(jobs[:4], workers=2, ray=""), serial.iloc[:4])


def test_replay_without_references_runs_only_the_policies_named(trace, tmp_path, capsys):
    path = tmp_path / "t.parquet"
    trace.to_parquet(path)
    assert main(["replay", str(path), "--policy", "hadb", "--instances", "2", "--json"]) == 0
    full = json.loads(capsys.readouterr().out)
    assert main(["replay", str(path), "--policy", "hadb", "--instances", "2", "--no-reference", "--json"]) == 0
    alone = json.loads(capsys.readouterr().out)
    assert set(full) == {"baseline", "hadb", "oracle"} and set(alone) == {"hadb"}
    assert alone["hadb"]["rollout_seconds"] == full["hadb"]["rollout_seconds"]
    assert alone["hadb"]["speedup"] != alone["hadb"]["speedup"]  # NaN: no baseline to be faster than
    assert main(["replay", str(path), "--policy", "hadb", "--instances", "2", "--no-reference"]) == 0
    assert "baseline and oracle not run" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["replay", str(path), "--no-reference"])
