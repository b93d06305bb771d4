"""The profiled cost model (real_backend.profile: its batch rows, its fit, `lssim profile`), the layouts of several
instances on one host (real_backend.layout) and engines started with speculation, and how the simulated twin prices
them (real_backend.validate_twin.sim_setup). The tests marked `real` use the session's shared vLLM engine."""

from __future__ import annotations

import dataclasses
import json
import re

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lssim.cli import main
from lssim.loop.controller import RunConfig
from lssim.cost import ProfiledCostModel
from lssim.analysis.replay import SimSetup, simulate
from lssim.traces.trace import load_trace
from lssim.analysis.fidelity.run import RecordedRun, replay_run
from lssim.traces.workload import Workload

from fake_engine import ServesExactly
from fidelity_helpers import MODEL, profile, REAL_TRACE, replay_twin, shared_cells, twin_setup, two_instance_run  # noqa: F401  (profile: a fixture)


def test_profile_batch_rows_cut_the_finish_curve():
    from lssim.cost import batch_features
    from real_backend.profile import _batch_rows

    lengths = [5, 10, 10, 20, 40, 40, 80, 160]
    finish = [0.1 * l for l in lengths]
    rows = _batch_rows(8, 7, "longtail", lengths, finish, 0)
    assert [r["cut"] for r in rows] == [1.0, 0.25, 0.5, 0.75]
    assert [r["seconds"] for r in rows] == pytest.approx([16.0, 1.0, 4.0, 8.0])
    assert rows[1]["lengths"] == [5, 10, 10, 10, 10, 10, 10, 10]  # cut at the 25% quantile: everything longer ends there
    assert batch_features(rows[1]["lengths"], 7)["c0"] == 10  # ten iterations up to the cut
    assert len(_batch_rows(8, 7, "lockstep", [16] * 8, [1.0] * 8, 0)) == 1
    assert all(np.isnan(r["driver_seconds"]) for r in rows)  # an engine that cannot tell
    timed = _batch_rows(8, 7, "longtail", lengths, finish, 0, driver=lambda seconds: 0.01 * seconds)
    assert [r["driver_seconds"] for r in timed] == pytest.approx([0.16, 0.01, 0.04, 0.08])


def test_profile_fit_recovers_the_model():
    from real_backend.profile import fit

    n = np.repeat([1, 4, 16, 64], 12)
    ctx = n * np.tile(np.linspace(20, 300, 12), 4)
    decode = pd.DataFrame({"n_seqs": n, "ctx_tokens": ctx, "seconds": [MODEL.decode_time(int(a), b, 1) for a, b in zip(n, ctx)]})
    p = np.array([8, 128, 8, 128])
    nb = np.array([1, 1, 32, 32])
    ttft = [MODEL.prefill_time(int(a * b)) + MODEL.decode_time(int(a), float(a * b), 1) for a, b in zip(nb, p)]
    prefill = pd.DataFrame({"n_seqs": nb, "prompt_len": p, "prefill_tokens": nb * p, "ttft_seconds": ttft})
    got = fit(decode, prefill)
    for k in ("c0", "c1", "c2", "p0", "p1"):
        assert getattr(got, k) == pytest.approx(getattr(MODEL, k), rel=1e-3, abs=1e-9), k
    assert got.fit_stats["p90_ape_pct"] < 0.1


def test_profile_json_keeps_how_it_was_measured(profile):
    payload = json.loads(open(profile).read())
    assert payload["measured_by"]["command"] == "test"
    assert ProfiledCostModel.from_json(profile).c1 == MODEL.c1


@pytest.mark.parametrize("args, message", [
    (["--out", "profile.txt"], ".json"),
    (["--batch-sizes", "1,x"], "--batch-sizes"),
    (["--prompt-lens", "900", "--length", "256"], "max-model-len"),
])
def test_profile_bad_input_exits_2(tmp_path, capsys, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    argv = ["profile", *args] if "--out" in args else ["profile", "--out", "p.json", *args]
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2 and message in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


@pytest.mark.real
def test_profile_measures_the_engine(vllm_engine):
    from real_backend.profile import fit, measure

    decode, prefill, batches = measure(vllm_engine, batch_sizes=(1, 4, 8), prompt_lens=(8, 32), length=32, window=8, repeats=1)
    assert set(decode["n_seqs"]) == {1, 4, 8} and (decode["seconds"] > 0).all()
    assert len(prefill) == 6 and (prefill["ttft_seconds"] > 0).all()
    whole = batches[batches["cut"] == 1.0]
    assert len(whole) == 12 and set(whole["spread"]) == {"lockstep", "longtail"} and (batches["seconds"] > 0).all()
    for _, cell in batches[batches["spread"] == "longtail"].groupby(["n_seqs", "prompt_len"]):  # cut earlier, done earlier
        # (requests that finish in one iteration reach the controller in one delivery, stamped microseconds apart)
        assert (cell.sort_values("cut")["seconds"].diff().dropna() > -1e-3).all()
    assert all(len(l) == n and max(l) <= 32 for l, n in zip(batches["lengths"], batches["n_seqs"]))
    # the caller's own part of each cell (the submit call, the streams' handling): inside the cell, and more of it in
    # a whole batch than in the same batch cut earlier
    assert ((batches["driver_seconds"] > 0) & (batches["driver_seconds"] < batches["seconds"])).all()
    for _, cell in batches[batches["spread"] == "longtail"].groupby(["n_seqs", "prompt_len"]):
        assert (cell.sort_values("cut")["driver_seconds"].diff().dropna() > -1e-4).all()
    # context grows along a cell: n * (prompt + tokens so far)
    cell = decode[(decode["n_seqs"] == 4) & (decode["prompt_len"] == 32)]
    assert cell["ctx_tokens"].is_monotonic_increasing and cell["ctx_tokens"].iloc[0] > 4 * 32
    model = fit(decode, prefill, batches)
    assert model.decode_time(4, 200, 1) > 0 and np.isfinite(model.fit_stats["median_ape_pct"])
    assert model.fit_stats["of"] == "batch makespan" and np.isfinite(model.fit_stats["iteration"]["median_ape_pct"])
    assert not vllm_engine._live and vllm_engine.sampling_kwargs.get("ignore_eos") is None  # left as found


@pytest.mark.real
def test_profile_measures_what_aborting_running_requests_blocks_the_caller(vllm_engine):
    from real_backend.profile import fit_abort_seconds, measure_aborts

    aborts = measure_aborts(vllm_engine, sizes=(4, 16), rounds=1, length=64)
    assert list(aborts["n"]) == [4, 16] and (aborts["seconds"] > 0).all()
    a1 = fit_abort_seconds(aborts)
    assert 0 < a1 < 0.05  # a round trip per request: well under a decode iteration's worth each
    assert not vllm_engine._live and vllm_engine.sampling_kwargs.get("ignore_eos") is None  # left as found


def _layout_cells(model, factor: float, n_instances: int = 2, noise: float = 0.0, seed: int = 0) -> pd.DataFrame:
    """Cells as measure_layout writes them, every instance `factor` x slower than `model` with all busy (times 1 + a
    relative noise), and alone at the model's own speed."""
    from real_backend.profile import longtail_lengths

    rng = np.random.default_rng(seed)
    rows = []
    for rep in range(2):
        for p in (8, 64):
            for n in (4, 8, 16, 32):
                for inst in range(n_instances):
                    lengths = longtail_lengths(rng, n, 256)
                    seconds = factor * model.makespan(lengths, p) * (1 + noise * rng.standard_normal())
                    rows.append({"n_seqs": n, "prompt_len": p, "spread": "longtail", "cut": 1.0, "lengths": lengths,
                                 "seconds": seconds, "repeat": rep, "instance": inst, "busy": n_instances,
                                 "cell": (rep, p, n)})
        for inst in range(n_instances):
            lengths = longtail_lengths(rng, 8, 256)
            rows.append({"n_seqs": 8, "prompt_len": 8, "spread": "longtail", "cut": 1.0, "lengths": lengths,
                         "seconds": model.makespan(lengths, 8), "repeat": rep, "instance": inst, "busy": 1,
                         "cell": (rep, inst)})
    return pd.DataFrame(rows)


@settings(max_examples=20, deadline=None)
@given(factor=st.floats(0.5, 4.0), n_instances=st.integers(2, 4))
def test_fit_layout_recovers_the_slowdown_of_busy_instances(factor, n_instances):
    from real_backend.layout import fit_layout

    fit = fit_layout(MODEL, _layout_cells(MODEL, factor, n_instances))
    assert fit["n_instances"] == n_instances
    assert fit["factor"] == pytest.approx(factor, rel=1e-9)
    assert fit["fit_error"]["median_ape_pct"] < 1e-6
    assert fit["alone_factor"] == pytest.approx(1.0, rel=1e-9)  # alone cells are reported, not fitted
    assert set(fit["by_instance"]) == set(range(n_instances))


def test_fit_layout_with_noise_and_bad_cells():
    from real_backend.layout import fit_layout

    fit = fit_layout(MODEL, _layout_cells(MODEL, 1.5, noise=0.05, seed=3))
    assert fit["factor"] == pytest.approx(1.5, rel=0.03) and 1 < fit["fit_error"]["median_ape_pct"] < 10
    cells = _layout_cells(MODEL, 1.5)
    with pytest.raises(ValueError, match="no cell with every instance busy"):
        fit_layout(MODEL, cells[cells["busy"] == 1])
    with pytest.raises(ValueError, match="lack columns"):
        fit_layout(MODEL, cells.drop(columns=["busy"]))
    with pytest.raises(ValueError, match="'seconds' must be finite and > 0"):
        fit_layout(MODEL, cells.assign(seconds=0.0))


@settings(max_examples=20, deadline=None)
@given(alone=st.floats(0.5, 2.0), together=st.floats(0.5, 4.0))
def test_fit_layout_recovers_the_host_slowdown_per_number_of_busy_instances(alone, together):
    from real_backend.layout import fit_layout

    fit = fit_layout(MODEL, shared_cells(MODEL, (alone, together)))
    assert fit["host_slowdown"] == pytest.approx([alone, together], rel=1e-6)
    assert fit["host_slowdown_error"]["median_ape_pct"] < 1e-6


@pytest.mark.parametrize("policy", ["baseline", "lpt", "seer(chunk=32)"])
def test_a_shared_host_prices_busy_instances_slower_and_alone_ones_not(tmp_path, policy):
    """SharedHostEngine: with one factor for any number of busy instances, every step is the plain prediction times
    it (1.0: exactly the plain engine); with (1, s), between the plain prediction and s times it."""
    base = tmp_path / "profile.json"
    MODEL.to_json(base, meta={"command": "test"})
    run = two_instance_run(policy, str(base))
    two = dataclasses.replace(twin_setup(str(base)), n_instances=2)
    plain = replay_twin(run, two).steps["rollout_seconds"].to_numpy()
    assert np.allclose(replay_twin(run, dataclasses.replace(two, host_slowdown=(1.0, 1.0))).steps["rollout_seconds"], plain, rtol=1e-9)
    assert np.allclose(replay_twin(run, dataclasses.replace(two, host_slowdown=(1.7, 1.7))).steps["rollout_seconds"], 1.7 * plain,
                       rtol=1e-6)
    shared = replay_twin(run, dataclasses.replace(two, host_slowdown=(1.0, 2.0))).steps["rollout_seconds"].to_numpy()
    assert (shared > plain * (1 + 1e-6)).all() and (shared < 2 * plain).all()


def test_an_instance_alone_on_a_shared_host_runs_at_the_alone_speed(tmp_path):
    """Every request pinned to instance 0 (the other idle the whole run): priced at slowdown[0], never slowdown[1]."""
    from lssim.loop.policy import Policy

    class OnZero(Policy):
        name = "on_zero"

        def place(self, request, loads):
            return 0

    base = tmp_path / "profile.json"
    MODEL.to_json(base, meta={"command": "test"})
    run = two_instance_run("baseline", str(base))
    two = dataclasses.replace(twin_setup(str(base)), n_instances=2)
    replay = lambda setup: replay_run(run, setup, Workload(load_trace(REAL_TRACE), seed=5), policy=OnZero())  # noqa: E731
    plain = replay(two).steps["rollout_seconds"].to_numpy()
    assert np.allclose(replay(dataclasses.replace(two, host_slowdown=(1.3, 5.0))).steps["rollout_seconds"], 1.3 * plain, rtol=1e-6)
    with pytest.raises(ValueError, match="one finite factor > 0"):
        dataclasses.replace(two, host_slowdown=(1.0, 0.0))


def test_a_two_instance_world_is_predicted_with_its_measured_layout(tmp_path):
    """The simulated twin of a two-instance run (sim_setup) prices it with the layout measured beside the profile:
    the host slow-down fitted from its cells on a shared clock; a layout file without one (one factor) scales the
    profile: every step exactly that factor x the one-instance prediction."""
    from real_backend.layout import layout_path, write_layout
    from real_backend.validate_twin import sim_setup

    base = tmp_path / "profile.json"
    MODEL.to_json(base, meta={"command": "test"})
    fit = write_layout(base, "0|1", shared_cells(MODEL, (1.0, 1.5)), meta={"command": "test"})
    assert fit["host_slowdown"] == pytest.approx([1.0, 1.5]) and layout_path(base, 2).is_file()
    run = two_instance_run("seer(chunk=32)", str(base))
    twin = sim_setup(run, str(base))
    assert twin.n_instances == 2 and twin.profile == str(base) and twin.host_slowdown == pytest.approx((1.0, 1.5))
    plain = replay_twin(run, dataclasses.replace(twin, host_slowdown=None)).steps["rollout_seconds"].to_numpy()
    assert np.allclose(plain, run.steps["rollout_seconds"], rtol=1e-9)  # recorded on the same profile
    shared = replay_twin(run, twin).steps["rollout_seconds"].to_numpy()
    assert (shared > plain * (1 + 1e-6)).all() and (shared < 1.5 * plain).all()
    meta = json.loads(layout_path(base, 2).read_text())
    assert meta["measured_by"]["command"] == "test" and meta["measured_by"]["layout"]["cpus"] == "0|1"
    assert meta["measured_by"]["layout"]["base_profile"] == str(base)
    del meta["measured_by"]["layout"]["host_slowdown"]  # a layout measured as one factor only
    layout_path(base, 2).write_text(json.dumps(meta))
    factor = meta["measured_by"]["layout"]["factor"]
    twin = sim_setup(run, str(base))
    assert twin.profile == str(layout_path(base, 2)) and twin.host_slowdown is None
    assert np.allclose(replay_twin(run, twin).steps["rollout_seconds"], factor * plain, rtol=1e-6)


def test_a_missing_or_stale_layout_is_an_error_naming_the_command(tmp_path):
    from real_backend.layout import layout_path, layout_profile, write_layout
    from real_backend.validate_twin import sim_setup

    base = tmp_path / "profile.json"
    MODEL.to_json(base, meta={"command": "test"})
    assert layout_profile(base, 1) == str(base)  # one instance: the profile itself
    run = two_instance_run("baseline", str(base))
    with pytest.raises(ValueError, match=re.escape(f"lssim profile --out {base} --instances 2 --cpus 0|1")) as e:
        sim_setup(run, str(base))
    assert str(layout_path(base, 2)) in str(e.value) and "--reprofile" in str(e.value)
    write_layout(base, "0|1", _layout_cells(MODEL, 1.3))
    with pytest.raises(ValueError, match=r"measured for 2 instance\(s\) on cpus '0\|1', the run had 2 on cpus None"):
        sim_setup(two_instance_run("baseline", str(base), cpus=None), str(base))
    ProfiledCostModel(c0=4e-3, c1=1.2e-4, c2=1e-7).to_json(base, meta={"command": "re-profiled"})
    with pytest.raises(ValueError, match="against other coefficients"):
        sim_setup(run, str(base))


class _SpeculatingEngine(ServesExactly):
    """An engine of one instance started with speculation, `factor` x slower than `model` whatever it runs: what
    profile_layout needs of VLLMEngine (submit, next_events, abort_all, set_draft_limit)."""

    def __init__(self, model, factor: float):
        from lssim.loop.core import Speculation

        self.model, self.factor, self.n_instances, self.vocab_size = model, factor, 1, 16
        self.speculation, self.draft_limits = Speculation(method="ngram", gamma=4), []
        self.prompt_tokens = self.reward_fn = None
        self.sampling_kwargs, self.clock, self.batch = {}, 0.0, []

    def set_draft_limit(self, max_batch: int) -> None:
        self.draft_limits.append(max_batch)

    def now(self) -> float:
        return self.clock

    def submit(self, requests) -> None:
        assert all(len(self.prompt_tokens(r.rid)) == r.prompt_len for r in requests)
        self.batch = list(requests)

    def next_events(self):
        from types import SimpleNamespace

        done = self.clock + self.factor * self.model.makespan([r.max_tokens for r in self.batch], self.batch[0].prompt_len)
        events = [SimpleNamespace(kind="finished", request=r, time=done) for r in self.batch]
        self.clock, self.batch = done, []
        return events

    def abort_all(self) -> None:
        self.batch = []


def _one_instance_run(profile: str, speculation: dict | None, seed: int = 5) -> RecordedRun:
    """A one-instance 'real' run recorded from the simulator on `profile`; meta says what its engine started with."""
    from real_backend.recorder import to_trace

    source = load_trace(REAL_TRACE)
    config = RunConfig(steps=3, groups_per_step=8, group_size=4, max_tokens=256, seed=seed)
    setup = SimSetup(model="tiny-ref", n_instances=1, max_num_seqs=256, kv_capacity_tokens=262_144, profile=profile)
    result = simulate(Workload(source, seed=seed), "baseline", setup, config=config, prompts=Workload(source, seed=seed))
    meta = {"setup": {"n_instances": 1, "cpus": None, "max_num_seqs": 256, "max_model_len": 1024},
            "engine": {"n_instances": 1, "speculation": speculation}}
    return RecordedRun(name="baseline", trace=to_trace(result.responses, result.steps), steps=result.steps,
                       responses=result.responses, config=config, meta=meta)


def test_an_engine_started_with_speculation_is_measured_drafting_off_and_its_twin_prices_with_it(tmp_path):
    """vLLM runs an engine started with speculation without async scheduling, drafting or not: profile_layout
    measures such an engine of one instance with drafts off, and the twin of a run on it (meta.json's engine says
    what it started with) prices every step with that layout; a run on a plain engine keeps the profile."""
    from real_backend.layout import layout_batches_path, layout_path, layout_profile, measured_layouts, profile_layout
    from real_backend.validate_twin import sim_setup

    base = tmp_path / "profile.json"
    MODEL.to_json(base, meta={"command": "test"})
    engine = _SpeculatingEngine(MODEL, factor=1.25)
    fit = profile_layout(engine, base, None, repeats=1)
    assert engine.draft_limits == [0]  # measured as its plain runs run: no drafts
    assert fit["n_instances"] == 1 and fit["factor"] == pytest.approx(1.25, rel=1e-9) and fit["alone_factor"] is None
    assert layout_path(base, 1, speculating=True).is_file() and not layout_path(base, 1).exists()
    assert measured_layouts(base) == [(layout_batches_path(base, 1, speculating=True), None, True)]  # refitted per stage
    assert layout_profile(base, 1) == str(base)
    plain_run = _one_instance_run(str(base), None)
    assert sim_setup(plain_run, str(base)).profile == str(base)
    spec_run = _one_instance_run(str(base), {"method": "ngram", "gamma": 4, "max_batch": 256})
    twin = sim_setup(spec_run, str(base))
    assert twin.profile == str(layout_path(base, 1, speculating=True)) and twin.host_slowdown is None
    plain = plain_run.steps["rollout_seconds"].to_numpy()
    assert np.allclose(replay_twin(spec_run, twin).steps["rollout_seconds"], 1.25 * plain, rtol=1e-6)
    layout_path(base, 1, speculating=True).unlink()
    with pytest.raises(ValueError, match=re.escape(f"lssim profile --out {base} --instances 1 --speculating")) as e:
        sim_setup(spec_run, str(base))
    assert "started with speculation" in str(e.value)


@pytest.mark.parametrize("cpus, n, message", [
    ("0|1", 2, None), ("0-1,4|2-3", 2, None), ("0", 2, "lists 1 instance(s), the engine has n_instances=2"),
    ("0|0", 2, "a CPU is in two instances' lists"), ("a|1", 2, "'a' is not a CPU id"), ("", 1, "must be a string"),
    ("0|9", 2, "CPU(s) [9] are not available"),
])
def test_a_cpu_layout_is_checked(cpus, n, message):
    from real_backend.world import cpu_layout_problem

    problem = cpu_layout_problem(cpus, n, available={0, 1, 2, 3, 4})
    assert problem is None if message is None else message in problem


def test_the_placed_world_binds_each_instance_to_its_cpus(tmp_path):
    from real_backend.validation_workloads import load_workloads

    placed = load_workloads().worlds["placed"]
    assert placed.n_instances == 2 and placed.cpus is not None and placed.engine_key() == (2, placed.cpus)
    path = tmp_path / "w.toml"
    path.write_text("[worlds.default]\nn_instances = 2\ncpus = '0'\n")
    with pytest.raises(ValueError, match=re.escape("lists 1 instance(s), the engine has n_instances=2")) as e:
        load_workloads(path)
    assert str(path) in str(e.value)
