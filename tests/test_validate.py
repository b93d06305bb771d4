"""Fidelity machinery (lssim.fidelity, real_backend.profile/sim_vs_real): comparisons, the profile fit, and
the round trip that makes a validation mean something: a run recorded from the simulator and replayed
in it is predicted exactly, so every error `lssim validate` reports on vLLM is the simulator's model,
not the bookkeeping. The tests marked `real` use the session's shared vLLM engine."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lssim.cli import main
from lssim.controller import RunConfig
from lssim.cost import ProfiledCostModel
from lssim.replay import SimSetup, simulate
from lssim.trace import load_trace
from lssim.fidelity import RecordedRun, compare, fidelity_table, length_distance, load_run, replay_run
from lssim.workload import Workload

REAL_TRACE = "traces/real_cpu_baseline.parquet"
MODEL = ProfiledCostModel(c0=3e-3, c1=1.2e-4, c2=1e-7, c3=0.0, p0=4e-3, p1=3e-5)


@pytest.fixture(scope="module")
def profile(tmp_path_factory):
    path = tmp_path_factory.mktemp("profile") / "profile.json"
    MODEL.to_json(path, meta={"command": "test"})
    return str(path)


def _setup(profile):
    return SimSetup(model="tiny-ref", n_instances=1, max_num_seqs=256, kv_capacity_tokens=262_144, profile=profile)


def _recorded_from_simulator(policy: str, profile: str, seed: int, steps: int = 3) -> RecordedRun:
    """A 'real' run that is in fact a simulation: what a validation must reproduce exactly."""
    from real_backend.recorder import to_trace

    source = load_trace(REAL_TRACE)
    config = RunConfig(steps=steps, groups_per_step=8, group_size=4, max_tokens=256, seed=seed)
    result = simulate(Workload(source, seed=seed), policy, _setup(profile), config=config, prompts=Workload(source, seed=seed))
    return RecordedRun(name=policy, trace=to_trace(result.responses, result.steps), steps=result.steps,
                       responses=result.responses, config=config)


@settings(max_examples=12, deadline=None)
@given(policy=st.sampled_from(["baseline", "hadb", "lpt", "ebs", "seer", "hadb+lpt"]), seed=st.integers(0, 2**16))
def test_a_simulated_run_replayed_is_predicted_exactly(profile, policy, seed):
    run = _recorded_from_simulator(policy, profile, seed)
    sim = replay_run(run, _setup(profile), prompts=Workload(load_trace(REAL_TRACE), seed=seed))
    steps, responses = compare(run, sim)
    assert np.allclose(steps["predicted_seconds"], steps["measured_seconds"], rtol=1e-9)
    assert (steps["predicted_tokens"] == steps["measured_tokens"]).all()
    assert len(responses) == len(run.responses)  # every response matched by its key
    assert np.allclose(responses["finish_time_predicted"], responses["finish_time_measured"], rtol=1e-9)
    table = fidelity_table(steps, responses)
    assert table.loc[policy, "makespan_p90_ape_pct"] < 1e-6


def test_fidelity_table_errors_and_speedup():
    steps = pd.DataFrame({
        "policy": ["baseline"] * 2 + ["p"] * 2, "step": [0, 1, 0, 1],
        "measured_seconds": [2.0, 2.0, 1.0, 1.0], "predicted_seconds": [2.2, 1.9, 1.0, 1.1],
        "measured_tokens": [100, 100, 100, 100], "predicted_tokens": [100, 100, 100, 110],
        "exact_fraction": [1.0] * 4, "finish_order_spearman": [1.0, 0.5, 1.0, 1.0]})
    steps["ape_pct"] = (steps["predicted_seconds"] - steps["measured_seconds"]).abs() / steps["measured_seconds"] * 100
    responses = pd.DataFrame(columns=["policy", "end_step_measured", "end_step_predicted", "finish_time_measured",
                                      "finish_time_predicted"])
    table = fidelity_table(steps, responses, groups={"baseline": (10, 10), "p": (10, 10)})
    assert table.loc["baseline", "makespan_median_ape_pct"] == pytest.approx(7.5)
    assert table.loc["p", "tokens_error_pct"] == pytest.approx(5.0)
    assert table.loc["p", "speedup_measured"] == pytest.approx(2.0)
    assert table.loc["p", "speedup_predicted"] == pytest.approx(4.1 / 2.1)
    assert table.loc["p", "speedup_error_points"] == pytest.approx((4.1 / 2.1 - 2.0) * 100)
    assert table.loc["baseline", "finish_order_spearman"] == pytest.approx(0.75)


def test_median_over_repeats_takes_medians_apart_and_measures_the_spread():
    from lssim.fidelity import median_over_repeats

    rows = []
    for k, (measured, predicted) in enumerate([(1.0, 1.1), (1.2, 1.0), (1.1, 0.9)]):
        rows.append({"policy": "p", "step": 0, "measured_seconds": measured, "predicted_seconds": predicted, "measured_tokens": 10,
                     "predicted_tokens": 10, "exact_fraction": 1.0, "finish_order_spearman": 1.0, "repeat": k})
    steps, spread = median_over_repeats(pd.DataFrame(rows))
    assert len(steps) == 1 and steps["repeats"].iloc[0] == 3
    assert steps["measured_seconds"].iloc[0] == pytest.approx(1.1) and steps["predicted_seconds"].iloc[0] == pytest.approx(1.0)
    assert steps["ape_pct"].iloc[0] == pytest.approx(100 / 11)
    assert sorted(spread["ape_pct"].round(6)) == pytest.approx(sorted([100 / 11, 100 / 11, 0.0]))


def test_anchor_on_baseline_takes_the_machines_speed_from_the_reference_and_drops_it():
    from lssim.fidelity import anchor_on_baseline

    rows = []
    for step, measured in enumerate([1.2, 1.2, 1.2, 1.2, 1.8]):  # the machine 20% slow; one step an outlier
        rows.append({"policy": "baseline", "repeat": 0, "step": step, "predicted_seconds": 1.0, "measured_seconds": measured})
        rows.append({"policy": "p", "repeat": 0, "step": step, "predicted_seconds": 0.5, "measured_seconds": 0.5 * 1.2 * 1.1})
    out = anchor_on_baseline(pd.DataFrame(rows))
    assert set(out["policy"]) == {"p"} and out.attrs["speed_factor"] == pytest.approx(1.2)  # the median ignores the outlier
    assert out["ape_pct"].tolist() == pytest.approx([100 / 11] * 5)  # what is left is the model's own miss
    with pytest.raises(ValueError, match="baseline"):
        anchor_on_baseline(pd.DataFrame(rows).query("policy == 'p'"))


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


def test_length_distance():
    same = length_distance(np.arange(100), np.arange(100))
    assert same["ks"] == 0 and same["wasserstein_tokens"] == 0
    shifted = length_distance(np.arange(100), np.arange(100) + 10)
    assert shifted["wasserstein_tokens"] == pytest.approx(10) and shifted["ks"] == pytest.approx(0.1)
    assert np.isnan(length_distance(np.array([]), np.arange(3))["ks"])


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


# ---------------------------------------------------------------------------------------------------
# bad input: a clear error, exit status 2, nothing written


def test_load_run_names_what_is_missing(tmp_path):
    with pytest.raises(ValueError, match="missing trace.parquet"):
        load_run(tmp_path)


@pytest.mark.parametrize("args, message", [
    (["--profile", "no/such/profile.json"], "does not exist"),
    (["--runs", "no/such/run"], "not a recorded run"),
    (["--policies", "no_such_policy"], "no_such_policy"),
    (["--runs", "a", "--reprofile"], "--reprofile"),
    (["--repeats", "0"], "--repeats"),
])
def test_validate_bad_input_exits_2_and_writes_nothing(tmp_path, capsys, profile, args, message):
    out = tmp_path / "out"
    argv = ["validate", "--out", str(out), *args]
    if "--profile" not in args and "--reprofile" not in args:
        argv += ["--profile", profile]
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2 and message in capsys.readouterr().err and not out.exists()


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


# ---------------------------------------------------------------------------------------------------
# on the real engine


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
    # context grows along a cell: n * (prompt + tokens so far)
    cell = decode[(decode["n_seqs"] == 4) & (decode["prompt_len"] == 32)]
    assert cell["ctx_tokens"].is_monotonic_increasing and cell["ctx_tokens"].iloc[0] > 4 * 32
    model = fit(decode, prefill, batches)
    assert model.decode_time(4, 200, 1) > 0 and np.isfinite(model.fit_stats["median_ape_pct"])
    assert model.fit_stats["of"] == "batch makespan" and np.isfinite(model.fit_stats["iteration"]["median_ape_pct"])
    assert not vllm_engine._live and vllm_engine.sampling_kwargs.get("ignore_eos") is None  # left as found


@pytest.mark.real
def test_validate_replays_recorded_runs(vllm_engine, real_model_dir, tmp_path, profile):
    from lssim.tables import format_fidelity
    from real_backend.sim_vs_real import validate
    from real_backend.world import RealSetup, prepare, run_real

    setup = RealSetup(model_dir=str(real_model_dir), n_prompts=16, profile=profile)  # real steps get the profiled bound
    config = RunConfig(steps=2, groups_per_step=4, group_size=4, max_tokens=64, seed=0)
    runs = {}
    for spec in ("baseline", "lpt"):
        prompts, policy = prepare(setup, spec, config)
        run_real(setup, policy, config, tmp_path / spec, engine=vllm_engine, prompts=prompts, meta={"policy_spec": spec})
        runs[spec] = load_run(tmp_path / spec)
    assert (runs["baseline"].steps["lower_bound_seconds"] > 0).all()
    frames = validate(runs, profile)
    steps, summary = frames["steps"], frames["summary"]
    assert len(steps) == 4 and (steps["predicted_seconds"] > 0).all() and steps["ape_pct"].notna().all()
    # same policy, same seeds, same data loader: the simulator asks for exactly the responses vLLM produced
    assert (steps["predicted_tokens"] == steps["measured_tokens"]).all() and (steps["exact_fraction"] == 1).all()
    assert np.isfinite(summary.loc["lpt", "speedup_error_points"])
    assert "lpt" in frames["counterfactual"].index
    assert "median APE" in format_fidelity(frames)
