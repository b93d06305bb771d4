"""The speed benchmark's bookkeeping (lssim.benchmarks.figures, scale): each figure printed as measured/goal and
measured/previous, the previous release read from its data file (a bad one named), this run's figures written as
the next release's file; and the resume check's sweep has the number of runs asked for."""

from __future__ import annotations

import io
import json

import pytest
from hypothesis import given, settings, strategies as st

from lssim.analysis.sweep import sweep_specs
from lssim.benchmarks.figures import PREVIOUS_RELEASE, Figure, Report, load_release
from lssim.benchmarks.scale import SWEEP_POLICIES, sweep_grids
from lssim.loop.policy import available_policies, make_policy


def test_the_shipped_previous_release_names_its_command_and_date_and_holds_numbers():
    release = load_release(PREVIOUS_RELEASE)
    assert "sim_speed" in release["command"] and release["date"]
    assert release["figures"]["sim.baseline"] > 0 and release["figures"]["cli.with_references"] > 0
    # every policy's figure key is a policy the benchmark runs
    assert {k.split(".", 1)[1] for k in release["figures"] if k.startswith("sim.")} <= set(available_policies())


def test_each_figure_prints_its_ratio_to_the_goal_and_to_the_previous_release():
    out = io.StringIO()
    report = Report({"release": "r", "date": "d", "command": "c", "machine": "m",
                     "figures": {"sim.hadb": 800_000.0, "cli.with_references": 4.0}}, out=out)
    report.add(Figure("sim.hadb", 1_200_000.0, "responses/s", 1_000_000))
    report.add(Figure("cli.with_references", 6.0, "s", 5.0, higher_is_better=False))
    report.add(Figure("kv.end_to_end", 100.0, "requests/s", 250.0))
    lines = out.getvalue().splitlines()
    assert "measured/goal 1.200 (met" in lines[0] and "measured/previous 1.500 (better" in lines[0]
    assert "measured/goal 1.200 (NOT met" in lines[1] and "measured/previous 1.500 (worse" in lines[1]
    assert "measured/goal 0.400 (NOT met" in lines[2] and "no previous figure" in lines[2]
    report.summary()
    assert "goals met 1 of 3; NOT met: cli.with_references, kv.end_to_end" in out.getvalue()


def test_this_runs_figures_written_as_a_release_read_back_as_the_previous_one(tmp_path):
    report = Report(None, out=io.StringIO())
    report.add(Figure("sim.baseline", 1_100_000.0, "responses/s", 1_000_000))
    path = tmp_path / "release.json"
    report.write_release(path, release="lssim at abc", command="python -m lssim.benchmarks.sim_speed --only sim", machine="2 cores")
    release = load_release(path)
    assert release["figures"] == {"sim.baseline": 1_100_000.0} and release["release"] == "lssim at abc"


@pytest.mark.parametrize("text, why", [
    ('{"release": "r", "date": "d", "command": "c", "machine": "m"}', "missing figures"),
    ('{"release": "r", "date": "d", "command": "c", "machine": "m", "figures": {"a": "fast"}}', "not: a"),
    ('{"release": "r", "date": "d", "command": "c", "machine": "m", "figures": [1]}', "figures must be an object"),
    ("[1, 2", "not JSON"),
])
def test_a_bad_release_file_is_named_with_what_is_wrong(tmp_path, text, why):
    path = tmp_path / "previous.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=why):
        load_release(path)
    with pytest.raises(ValueError, match="no such release file"):
        load_release(tmp_path / "absent.json")


@settings(max_examples=25, deadline=None)
@given(st.integers(26, 3000))
def test_the_resume_sweep_has_exactly_the_runs_asked_for_and_every_spec_builds(runs):
    specs = sweep_specs(list(SWEEP_POLICIES), 3, sweep_grids(runs))
    assert len(specs) == runs and specs[0] == "baseline"
    for spec in specs[:: max(1, runs // 20)]:
        make_policy(spec)
    with pytest.raises(ValueError, match="--resume-runs"):
        sweep_grids(25)
