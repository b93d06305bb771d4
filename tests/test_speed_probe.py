"""The speed probe (real_backend.speed_probe): the machine's speed level measured around every validation run and
around the measurement of the cost model, and the twin scaled by their ratio. Engines here are fakes that run
`factor` x a known cost model; runs are recorded from the simulator, so the scaled twin must predict exactly."""

from __future__ import annotations

import dataclasses
import json
import re
from types import SimpleNamespace

import numpy as np
import pytest

from lssim.loop.controller import RunConfig
from lssim.cost import ProfiledCostModel
from lssim.analysis.fidelity.run import RecordedRun, replay_run
from lssim.analysis.replay import SimSetup, simulate
from lssim.traces.trace import load_trace
from lssim.traces.workload import Workload

from fake_engine import ServesExactly

REAL_TRACE = "traces/real_cpu_baseline.parquet"
MODEL = ProfiledCostModel(c0=3e-3, c1=1.2e-4, c2=1e-7, c3=0.0, p0=4e-3, p1=3e-5)


class _Engine(ServesExactly):
    """What measure_probe needs of VLLMEngine: every batch takes `factor` x MODEL's makespan (of one instance's
    requests: instances run side by side)."""

    def __init__(self, factor: float = 1.0, speculating: bool = False, n_instances: int = 1):
        self.factor, self.n_instances, self.vocab_size = factor, n_instances, 16
        self.speculation = object() if speculating else None
        self.draft_limits, self.prompts_seen = [], []
        self.prompt_tokens = self.reward_fn = None
        self.sampling_kwargs, self.clock, self.batch = {}, 0.0, []

    def set_draft_limit(self, n: int) -> None:
        self.draft_limits.append(n)

    def now(self) -> float:
        return self.clock

    def submit(self, requests) -> None:
        assert self.sampling_kwargs.get("ignore_eos")
        self.prompts_seen += [tuple(self.prompt_tokens(r.rid)) for r in requests]
        self.instances_loaded = sorted({r.instance for r in requests})
        self.batch = list(requests)

    def next_events(self):
        one = [r for r in self.batch if r.instance == self.batch[0].instance]
        done = self.clock + self.factor * MODEL.makespan([r.max_tokens for r in one], one[0].prompt_len)
        events = [SimpleNamespace(kind="finished", request=r, time=done) for r in self.batch]
        self.clock, self.batch = done, []
        return events

    def abort_all(self) -> None:
        self.batch = []


def _probe_seconds(factor: float = 1.0) -> float:
    from real_backend.speed_probe import PROBE_CELLS

    return factor * sum(MODEL.makespan([tokens] * n, p) for n, p, tokens in PROBE_CELLS)


def _run(profile: str, probes: list[float] | None, n_instances: int = 1, policy: str = "baseline") -> RecordedRun:
    """A 'real' run recorded from the simulator on `profile`, with the probes taken around it in its meta."""
    from real_backend.recorder import to_trace
    from real_backend.speed_probe import probe_record

    source = load_trace(REAL_TRACE)
    config = RunConfig(steps=3, groups_per_step=8, group_size=4, max_tokens=256, seed=5)
    setup = SimSetup(model="tiny-ref", n_instances=n_instances, max_num_seqs=256, kv_capacity_tokens=262_144, profile=profile)
    result = simulate(Workload(source, seed=5), policy, setup, config=config, prompts=Workload(source, seed=5))
    meta = {"setup": {"n_instances": n_instances, "cpus": "0|1" if n_instances > 1 else None, "max_num_seqs": 256,
                      "max_model_len": 1024}, "engine": {"n_instances": n_instances}}
    if probes is not None:
        meta["speed_probe"] = probe_record(probes, instances=n_instances)
    return RecordedRun(name=policy, trace=to_trace(result.responses, result.steps), steps=result.steps,
                       responses=result.responses, config=config, meta=meta)


def _replay(run, setup):
    return replay_run(run, setup, Workload(load_trace(REAL_TRACE), seed=run.config.seed))


def test_the_probe_times_fixed_work_on_fresh_prompts_with_drafting_off():
    from real_backend.speed_probe import measure_probe

    engine = _Engine(factor=1.3, speculating=True)
    first, second = measure_probe(engine), measure_probe(engine)
    assert first == pytest.approx(_probe_seconds(1.3), rel=1e-12) and second == pytest.approx(first, rel=1e-12)
    assert engine.draft_limits == [0, 0]  # a speculating engine's plain steps, as its plain runs run
    assert len(set(engine.prompts_seen)) == len(engine.prompts_seen)  # no prompt twice: the prefix cache never answers
    assert engine.prompt_tokens is None and not engine.sampling_kwargs  # the engine is given back as it was
    two = _Engine(factor=1.3, n_instances=2)
    assert measure_probe(two) == pytest.approx(first, rel=1e-12) and two.instances_loaded == [0, 1]  # every one busy


def test_a_runs_level_is_the_median_of_the_four_probes_nearest_it(tmp_path):
    """Probes between every two runs, in order; each run's window is the probes on its two sides and one more each
    way, so one probe that reads slow on its own moves no run's level; the window widens as later probes come."""
    from real_backend.speed_probe import record_run_probes, run_window

    probes = [2.0, 2.0, 2.3, 2.0, 2.0, 2.0]  # the third reads 15% slow: runs 1 and 2 sit beside it
    assert run_window(probes, 0) == [2.0, 2.0, 2.3] and run_window(probes, 1) == [2.0, 2.0, 2.3, 2.0]
    assert run_window(probes, 4) == [2.0, 2.0, 2.0]
    folders = []
    for i in range(5):
        folders.append(tmp_path / f"run{i}")
        folders[-1].mkdir()
        (folders[-1] / "meta.json").write_text(json.dumps({"status": "finished"}))
    for n in range(1, 6):  # as recording goes: after run n-1, probes[:n+1] exist; runs n-2 and n-1 are (re)written
        for i in range(max(0, n - 2), n):
            record_run_probes(folders[i], probes[:n + 1], i)
    for i, folder in enumerate(folders):
        meta = json.loads((folder / "meta.json").read_text())
        assert meta["status"] == "finished" and meta["speed_probe"]["seconds"] == probes[i:i + 2]
        assert meta["speed_probe"]["window"] == run_window(probes, i) and meta["speed_probe"]["level_s"] == 2.0


def test_the_twin_runs_at_the_probed_speed_level_and_without_probes_as_before(tmp_path):
    """A run whose probes read 1.2x the reference taken around the profile: every predicted step is 1.2x the profile
    alone. probe=False, a profile without a reference, a run without probes, or probes of other cells: unscaled."""
    from real_backend.validate_twin import sim_setup, speed_level
    from real_backend.speed_probe import write_reference

    base = tmp_path / "profile.json"
    MODEL.to_json(base, meta={"command": "test"})
    ref = _probe_seconds()
    run = _run(str(base), [1.1 * ref, 1.3 * ref])  # the run's level: the mean of its two probes
    assert sim_setup(run, str(base)).profile == str(base) and speed_level(run, str(base)) is None  # no reference yet
    plain = _replay(run, sim_setup(run, str(base))).steps["rollout_seconds"].to_numpy()
    assert np.allclose(plain, run.steps["rollout_seconds"], rtol=1e-9)
    write_reference(base, [ref, ref])
    assert ProfiledCostModel.from_json(base).coefficients == MODEL.coefficients  # the profile itself is untouched
    assert speed_level(run, str(base)) == pytest.approx(1.2)
    twin = sim_setup(run, str(base))
    assert isinstance(twin.profile, ProfiledCostModel) and "speed probe" in twin.profile.name
    assert np.allclose(_replay(run, twin).steps["rollout_seconds"], 1.2 * plain, rtol=1e-6)
    assert sim_setup(run, str(base), probe=False).profile == str(base)
    assert sim_setup(_run(str(base), None), str(base)).profile == str(base)
    other_cells = dataclasses.replace(run, meta={**run.meta, "speed_probe": {**run.meta["speed_probe"], "cells": [[1, 1, 1]]}})
    assert speed_level(other_cells, str(base)) is None


def test_a_shared_host_world_scales_by_its_layouts_reference(tmp_path):
    """Two instances: the level is taken against the reference probed around the layout's measurement (the host
    slow-down holds the level of those minutes), and the slow-down is kept."""
    from real_backend.layout import layout_path, write_layout
    from real_backend.validate_twin import sim_setup, speed_level
    from real_backend.speed_probe import write_reference

    from fidelity_helpers import shared_cells

    base = tmp_path / "profile.json"
    MODEL.to_json(base, meta={"command": "test"})
    write_layout(base, "0|1", shared_cells(MODEL, (1.0, 1.5)), meta={"command": "test"})
    ref = _probe_seconds()
    write_reference(base, [2 * ref])  # the profile's minutes: not what a two-instance twin is calibrated on
    write_reference(layout_path(base, 2), [ref, ref], instances=1)
    run = _run(str(base), [0.9 * ref], n_instances=2, policy="seer(chunk=32)")
    assert speed_level(run, str(base)) is None  # probed on an engine of another size: not comparable
    write_reference(layout_path(base, 2), [ref, ref], instances=2)
    assert speed_level(run, str(base)) == pytest.approx(0.9)
    twin = sim_setup(run, str(base))
    assert twin.host_slowdown == pytest.approx((1.0, 1.5))
    unscaled = _replay(run, sim_setup(run, str(base), probe=False)).steps["rollout_seconds"].to_numpy()
    assert np.allclose(_replay(run, twin).steps["rollout_seconds"], 0.9 * unscaled, rtol=1e-6)


@pytest.mark.parametrize("probe, message", [
    ({"seconds": [0.0], "cells": [[8, 64, 256]]}, "must be finite and > 0"),
    ({"seconds": [1.0]}, "expected {seconds, window, level_s, cells}"),
    ("fast", "expected {seconds, window, level_s, cells}"),
])
def test_a_bad_reference_is_an_error_naming_the_file(tmp_path, probe, message):
    from real_backend.validate_twin import sim_setup

    base = tmp_path / "profile.json"
    MODEL.to_json(base, meta={"command": "test"})
    payload = json.loads(base.read_text())
    payload["measured_by"]["speed_probe"] = probe
    base.write_text(json.dumps(payload))
    with pytest.raises(ValueError, match=re.escape(f"{base}: measured_by.speed_probe")) as e:
        sim_setup(_run(str(base), [1.0]), str(base))
    assert message in str(e.value)


def test_validation_reports_the_level_the_probed_twin_and_a_stage_for_the_probe(tmp_path, monkeypatch):
    """validate_worlds on a world whose runs were probed: the twin is the profile's (the goal is judged on it); the
    summary adds each policy's median speed level and its errors at that level, the JSON both, stages.csv a row
    for the probe. The runs were recorded 1.25x slower than the profile, as their probes say: the profile alone is
    20% short, the probed twin exact."""
    from lssim.analysis.fidelity.report import fidelity_markdown
    from lssim.analysis.fidelity.summary import policy_results
    from real_backend import sim_vs_real
    from real_backend.speed_probe import write_reference

    monkeypatch.setattr(sim_vs_real, "run_prompts", lambda run: Workload(load_trace(REAL_TRACE), seed=run.config.seed))
    base = tmp_path / "profile.json"
    MODEL.to_json(base, meta={"command": "test"})
    slow = tmp_path / "slow.json"
    ProfiledCostModel(**{k: 1.25 * v for k, v in MODEL.coefficients.items()}).to_json(slow, meta={})
    ref = _probe_seconds()
    runs = {"baseline": [_run(str(slow), [1.25 * ref])], "lpt": [_run(str(slow), [1.25 * ref], policy="lpt")]}
    unreferenced = sim_vs_real.validate_worlds({"w": runs}, str(base), counterfactual=False)
    assert "probed" not in unreferenced and "probed_median_ape_pct" not in unreferenced["summary"]
    write_reference(base, [ref])
    frames = sim_vs_real.validate_worlds({"w": runs}, str(base), counterfactual=False, stages_dir=tmp_path / "models")
    summary = frames["summary"]
    assert summary["speed_level"].to_numpy() == pytest.approx([1.25, 1.25])
    assert summary["makespan_median_ape_pct"].to_numpy() == pytest.approx([20.0, 20.0])  # 1/1.25: 20% short
    assert summary["probed_median_ape_pct"].max() < 1e-6
    entry = json.loads(json.dumps(policy_results(summary)))["policies"]["lpt"]
    assert entry["speed_level"] == pytest.approx(1.25) and entry["step_error_median_probed"] < 1e-6
    assert entry["step_error_median"] == pytest.approx(20.0)
    stages = frames["stages"].loc["w"]
    assert stages.loc["fitted to batch makespans (+ departures)", "median_ape_pct"] == pytest.approx(20.0)
    assert stages.loc["+ speed level from probes around each run", "median_ape_pct"] < 1e-6
    assert "at the probed speed level" in fidelity_markdown(summary)


def test_a_measurement_is_probed_before_during_and_after_and_its_cells_are_untouched():
    """probed_measurement around a layout measurement (9 cells, a probe after every 4th): two probes before, two
    during, two after, each reading the engine's speed; the cells are timed as without probes."""
    from real_backend.layout import measure_layout
    from real_backend.speed_probe import probed_measurement

    engine = _Engine(factor=1.1)
    cells = []
    probes = probed_measurement(engine, lambda **kw: cells.append(measure_layout(engine, repeats=1, **kw)), every=4)
    assert probes == pytest.approx([_probe_seconds(1.1)] * 6, rel=1e-12)
    plain = measure_layout(_Engine(factor=1.1), repeats=1)
    assert np.allclose(cells[0]["seconds"], plain["seconds"], rtol=1e-12)
    assert list(cells[0]["lengths"]) == list(plain["lengths"])  # the probes draw nothing from the cells' generator
    again = probed_measurement(engine, lambda **kw: measure_layout(engine, repeats=1, **kw), every=4, probes=[1.0, 2.0])
    assert again[:2] == [1.0, 2.0] and len(again) == 6  # probes taken just before are not taken again
