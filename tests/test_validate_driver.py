"""The driver's price in the policies' validation (real_backend.validate_twin.world_driver, sim_vs_real.validate_worlds)
and the validations pooled per policy (lssim.analysis.fidelity.pool), without vLLM: 'real' runs are recorded from
the simulator, with the driver's seconds a real run would hold written into their steps."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from lssim.analysis.fidelity.run import RecordedRun
from lssim.analysis.replay import SimSetup, simulate
from lssim.loop.controller import RunConfig
from lssim.sim.shared_host import DriverPrice
from lssim.traces.trace import load_trace
from lssim.traces.workload import Workload

from fidelity_helpers import MODEL, REAL_TRACE, replay_twin, shared_cells, two_instance_run

CELLS_PER_REQUEST, CELLS_PER_TOKEN, RUN_PER_TOKEN = 2e-4, 3e-6, 2e-6


def _profile_with_cells(tmp_path, driver: bool = True) -> str:
    """MODEL's profile with its cells beside it (profile_batches.parquet), whose driver took CELLS_PER_REQUEST a
    request and CELLS_PER_TOKEN a token (`driver`: recorded)."""
    path = tmp_path / "profile.json"
    MODEL.to_json(path, meta={"command": "test"})
    rng = np.random.default_rng(0)
    n = rng.integers(1, 64, size=12)
    lengths = [rng.integers(8, 256, size=k).tolist() for k in n]
    cells = pd.DataFrame({"n_seqs": n, "prompt_len": 64, "lengths": lengths, "cut": 1.0,
                          "seconds": [MODEL.makespan(ls, 64) for ls in lengths]})
    if driver:
        cells["driver_seconds"] = [CELLS_PER_REQUEST * k + CELLS_PER_TOKEN * sum(ls) for k, ls in zip(n, lengths)]
    cells.to_parquet(tmp_path / "profile_batches.parquet")
    return str(path)


def _run(profile: str, policy: str = "baseline", driver: bool = True, speculation: bool = False) -> RecordedRun:
    """A one-instance 'real' run recorded from the simulator on `profile`; with `driver`, its steps hold the driver
    seconds of the cells' driver plus RUN_PER_TOKEN a token streamed (the controller's and the policy's work)."""
    from real_backend.recorder import to_trace

    source = load_trace(REAL_TRACE)
    config = RunConfig(steps=3, groups_per_step=8, group_size=4, max_tokens=256, seed=5)
    setup = SimSetup(model="tiny-ref", n_instances=1, max_num_seqs=256, kv_capacity_tokens=262_144, profile=profile)
    result = simulate(Workload(source, seed=5), policy, setup, config=config, prompts=Workload(source, seed=5))
    steps = result.steps
    if driver:
        steps = steps.assign(driver_seconds=CELLS_PER_REQUEST * steps["responses_in"] + CELLS_PER_TOKEN * steps["tokens"]
                             + RUN_PER_TOKEN * steps["tokens"])
    meta = {"setup": {"n_instances": 1, "cpus": None, "max_num_seqs": 256, "max_model_len": 1024},
            "engine": {"n_instances": 1, **({"speculation": {"method": "ngram"}} if speculation else {})}}
    return RecordedRun(name=policy, trace=to_trace(result.responses, steps), steps=steps, responses=result.responses,
                       config=config, meta=meta)


@pytest.fixture
def replay_offline(monkeypatch):
    """The twins draw from the trace's own loader (a recorded run's loader needs the model's tokenizer)."""
    from real_backend import sim_vs_real

    monkeypatch.setattr(sim_vs_real, "run_prompts", lambda run: Workload(load_trace(REAL_TRACE), seed=run.config.seed))


def test_the_policies_twin_charges_the_driver_its_worlds_baseline_holds_beyond_the_cells(tmp_path, replay_offline):
    """The baseline's runs hold the cells' driver plus 2 us a token streamed: the world's price is those 2 us, and
    every twin of the world (the baseline's and the policy's) is longer by 2 us a token per step (one instance: every
    decode iteration is on the step's path)."""
    from lssim.analysis.fidelity.report import fidelity_markdown
    from lssim.analysis.fidelity.summary import policy_results
    from real_backend.sim_vs_real import validate_worlds

    profile = _profile_with_cells(tmp_path)
    runs = {"baseline": [_run(profile)], "lpt": [_run(profile, "lpt")]}
    frames = validate_worlds({"w": runs}, profile, counterfactual=False)
    row = frames["driver"].loc["w"]
    assert row["driver_priced"] and row["driver_why"] == "" and row["driver_steps"] == 3
    assert row["driver_per_token"] == pytest.approx(RUN_PER_TOKEN, rel=1e-6)
    assert row["driver_per_request"] == pytest.approx(0, abs=1e-9) and row["driver_per_finish"] == pytest.approx(0, abs=1e-9)
    priced, unpriced = frames["steps"].set_index(["policy", "step"]), frames["unpriced"].set_index(["policy", "step"])
    for name, label in (("baseline", "baseline@w"), ("lpt", "lpt")):
        tokens = runs[name][0].steps.set_index("step")["tokens"]
        rise = priced.loc[label, "predicted_seconds"] - unpriced.loc[label, "predicted_seconds"]
        assert np.allclose(rise.to_numpy(), RUN_PER_TOKEN * tokens.loc[rise.index].to_numpy(), rtol=1e-5), name
    # the twin without the price is the one before it: exact here (the runs were recorded from it)
    assert frames["summary"]["unpriced_median_ape_pct"].max() < 1e-6
    assert (frames["summary"]["makespan_median_ape_pct"] > 0.1).all()
    result = json.loads(json.dumps(policy_results(frames["summary"])))
    entry = result["policies"]["lpt"]
    assert entry["driver"]["priced"] and entry["driver"]["per_token"] == pytest.approx(RUN_PER_TOKEN, rel=1e-6)
    assert entry["step_error_median_unpriced"] < 1e-6 and result["driver"]["w"]["priced"]
    assert "The driver's price per world" in fidelity_markdown(frames["summary"])


def test_a_world_whose_runs_did_not_record_the_driver_replays_as_before_and_says_why(tmp_path, replay_offline):
    from lssim.analysis.fidelity.report import fidelity_markdown
    from lssim.analysis.fidelity.summary import policy_results
    from real_backend.sim_vs_real import validate, validate_worlds

    profile = _profile_with_cells(tmp_path)
    runs = {"baseline": [_run(profile, driver=False)], "lpt": [_run(profile, "lpt", driver=False)]}
    frames = validate_worlds({"w": runs}, profile, counterfactual=False)
    before = validate(runs, profile, counterfactual=False, probe=False)["steps"]
    assert np.array_equal(frames["steps"]["predicted_seconds"].to_numpy(), before["predicted_seconds"].to_numpy())
    row = frames["driver"].loc["w"]
    assert not row["driver_priced"] and "driver_seconds" in row["driver_why"]
    summary = frames["summary"]
    assert (summary["unpriced_median_ape_pct"] == summary["makespan_median_ape_pct"]).all()
    entry = policy_results(summary)["policies"]["lpt"]
    assert entry["driver"]["priced"] is False and "driver_seconds" in entry["driver"]["why"]
    assert row["driver_why"] in fidelity_markdown(summary)
    # the cells without the driver's seconds: not priced either, and the reason names the cells
    (tmp_path / "bare").mkdir()
    bare = _profile_with_cells(tmp_path / "bare", driver=False)
    frames = validate_worlds({"w": {"baseline": [_run(bare)]}}, bare, counterfactual=False)
    assert "cells" in frames["driver"].loc["w", "driver_why"]


def test_the_speculation_world_is_fitted_but_not_charged(tmp_path):
    """An engine started with speculation: the twin that charges the driver (lssim.sim.shared_host) does not model
    speculation, so the world's price is reported and not charged."""
    from real_backend.validate_twin import world_driver

    profile = _profile_with_cells(tmp_path)
    price, row = world_driver({"baseline": [_run(profile, speculation=True)]}, profile)
    assert price is None and not row["driver_priced"] and "speculation" in row["driver_why"]
    assert row["driver_per_token"] == pytest.approx(RUN_PER_TOKEN, rel=1e-6)
    price, row = world_driver({"lpt": [_run(profile, "lpt")]}, profile)
    assert price is None and "no baseline" in row["driver_why"]


def test_two_instances_on_a_shared_host_keep_their_slow_down_and_charge_the_driver(tmp_path):
    from real_backend.layout import write_layout
    from real_backend.validate_twin import sim_setup

    profile = _profile_with_cells(tmp_path)
    write_layout(profile, "0|1", shared_cells(MODEL, (1.0, 1.5)), meta={"command": "test"})
    run = two_instance_run("baseline", profile)
    price = DriverPrice(per_token=RUN_PER_TOKEN)
    twin = sim_setup(run, profile, probe=False, driver=price)
    assert twin.host_slowdown == pytest.approx((1.0, 1.5)) and twin.driver == price
    plain = replay_twin(run, sim_setup(run, profile, probe=False)).steps
    charged = replay_twin(run, twin).steps
    tokens = plain["tokens"].to_numpy()
    rise = charged["rollout_seconds"].to_numpy() - plain["rollout_seconds"].to_numpy()
    # the two instances decode side by side: each step longer, by less than every token charged one after another
    assert (rise > 0).all() and (rise < RUN_PER_TOKEN * tokens).all()


def _folder(path, summary: pd.DataFrame, by_repeat: pd.DataFrame):
    path.mkdir(parents=True)
    summary.rename_axis("policy").to_csv(path / "summary.csv")
    by_repeat.to_parquet(path / "steps_by_repeat.parquet")
    return str(path)


def _steps(policies: dict[str, int], driver: dict[str, float]) -> pd.DataFrame:
    """steps_by_repeat rows: each policy's repeats (policies: name -> repeats) of two steps, measured_driver_seconds
    as `driver` says per policy (NaN: not recorded)."""
    return pd.DataFrame([{"policy": p, "repeat": k, "step": s, "measured_seconds": 1.0 + 0.01 * k,
                          "measured_driver_seconds": driver[p]} for p, n in policies.items() for k in range(n) for s in (0, 1)])


def test_the_pool_takes_each_policy_over_the_folders_and_says_where_the_driver_was_priced(tmp_path):
    from lssim.analysis.fidelity.pool import NOT_RECORDED, NOT_REPLAYED, PRICED, folder_drivers, pool_policies, pool_rows

    new = _folder(tmp_path / "new", pd.DataFrame({
        "world": ["w", "w", "s"], "runs": [3, 3, 3], "makespan_median_ape_pct": [4.0, 3.0, 5.0],
        "unpriced_median_ape_pct": [6.0, 5.0, 5.0], "noise_floor_median_pct": [2.0, 2.0, 2.5],
        "driver_priced": [True, True, False], "driver_why": ["", "", "the engine was started with speculation"]},
        index=["baseline@w", "p", "baseline@s"]), _steps({"baseline@w": 3, "p": 3, "baseline@s": 3},
                                                          {"baseline@w": 0.1, "p": 0.1, "baseline@s": 0.1}))
    old = _folder(tmp_path / "old", pd.DataFrame({
        "world": ["w", "w"], "makespan_median_ape_pct": [6.0, 8.0], "noise_floor_median_pct": [1.5, 2.0]},
        index=["baseline@w", "p"]), _steps({"baseline@w": 4, "p": 4}, {"baseline@w": 0.1, "p": np.nan}))
    rows = pool_rows([new, old])
    assert list(rows["driver"]) == [PRICED, PRICED, "not priced: the engine was started with speculation", NOT_REPLAYED,
                                    NOT_RECORDED]
    table = pool_policies(rows)
    p = table.loc["p"]
    assert (p["rows"], p["runs"], p["priced"]) == (2, 7, "1 of 2")  # old's runs counted from its repeats
    assert (p["twin"], p["exact"], p["ratio"]) == pytest.approx((5.5, 2.0, (1.5 + 4.0) / 2))
    assert (p["twin_unpriced"], p["ratio_unpriced"]) == pytest.approx((6.5, (2.5 + 4.0) / 2))
    base = table.loc["baseline@w"]
    assert (base["ratio"], base["ratio_unpriced"]) == pytest.approx(((2.0 + 4.0) / 2, (3.0 + 4.0) / 2))
    assert table.loc["all", "rows"] == 5 and table.loc["all", "priced"] == "2 of 5"
    assert folder_drivers(rows).loc[(old, "w"), "driver"] == NOT_REPLAYED  # the folder's first row of the world
    out = subprocess.run([sys.executable, "-m", "lssim.analysis.fidelity", "--pool", new, old], capture_output=True,
                         text=True, check=True).stdout
    assert "baseline@s" in out and "1 of 2" in out and "recorded, not priced" in out
    bad = subprocess.run([sys.executable, "-m", "lssim.analysis.fidelity", "--pool", str(tmp_path)], capture_output=True,
                         text=True)
    assert bad.returncode == 2 and "summary.csv" in bad.stderr


def test_one_reader_gives_an_exact_models_scores_the_summarys_where_written_else_as_validate_computes_them(tmp_path):
    """read_folder is the one reader of a validation folder (the pool's and paper/experiments/validation_noise's)."""
    from lssim.analysis.fidelity.noise import noise_floor
    from lssim.analysis.fidelity.pool import EXACT_MODEL_COLUMNS, read_folder
    from paper.experiments.validation_noise import folder_table

    rng = np.random.default_rng(0)
    steps = pd.DataFrame([{"policy": p, "repeat": k, "step": s, "measured_seconds": float(rng.lognormal(0, 0.05))}
                          for p in ("a", "b") for k in range(3) for s in range(20)])
    computed = noise_floor(steps)  # searching repeats_for_goal, as `lssim validate` does
    summary = pd.DataFrame({"world": ["w", "w"], "makespan_median_ape_pct": [4.0, 3.0], "makespan_p90_ape_pct": [8.0, 6.0]},
                           index=["a", "b"])
    old = read_folder(_folder(tmp_path / "old", summary, steps))
    pd.testing.assert_frame_equal(old.exact_model(), computed[list(EXACT_MODEL_COLUMNS)], check_names=False)
    written = read_folder(_folder(tmp_path / "new", summary.assign(noise_floor_median_pct=[1.5, 2.5]), steps))
    exact = written.exact_model()
    assert list(exact["noise_floor_median_pct"]) == [1.5, 2.5]  # the summary's own
    assert list(exact["noise_bound_p90_pct"]) == list(computed["noise_bound_p90_pct"])  # the rest computed
    assert list(folder_table(written.path)["noise_floor_median_pct"]) == [1.5, 2.5]  # the paper reads the same
    (tmp_path / "new" / "steps_by_repeat.parquet").unlink()
    with pytest.raises(ValueError, match=r"new: no steps_by_repeat.parquet"):
        read_folder(tmp_path / "new")


def _timed_steps(rollouts, trains, gaps) -> pd.DataFrame:
    """Steps run one after another: gap, rollout, train; step_seconds from the previous step's end (the run's start)."""
    rows, t = [], 0.0
    for k, (roll, train, gap) in enumerate(zip(rollouts, trains, gaps)):
        start = t + gap
        rows.append({"step": k, "rollout_start": start, "rollout_end": start + roll, "train_end": start + roll + train,
                     "step_seconds": gap + roll + train, "driver_seconds": 0.01 * 8, "responses_in": 8, "tokens": 800,
                     "finished": 8, "truncated": 0})
        t = start + roll + train
    return pd.DataFrame(rows)


def test_the_driver_between_steps_is_read_from_runs_whose_steps_follow_each_other(tmp_path):
    from lssim.analysis.fidelity.driver import fit_against_cells, step_gaps

    rng = np.random.default_rng(3)
    runs = [_timed_steps(rng.uniform(1, 2, 5), rng.uniform(0.2, 0.8, 5), np.r_[0.3 + 0.01 * i, np.full(4, 0.1 + 0.01 * i)])
            for i in range(3)]
    np.testing.assert_allclose(step_gaps(runs[0]), [0.3, 0.1, 0.1, 0.1, 0.1])
    _profile_with_cells(tmp_path)
    price, fit = fit_against_cells(runs, tmp_path / "profile_batches.parquet")
    assert price.per_step == pytest.approx(0.11) and price.first_step == pytest.approx(0.31)
    assert fit["per_step_runs"] == 3
    # a run whose next rollout started before the last step's weights (training beside it) has no such gap to read
    overlapping = runs[0].assign(rollout_start=runs[0]["rollout_start"] - np.r_[0, 0.5, 0.5, 0.5, 0.5])
    assert step_gaps(overlapping) is None
    assert step_gaps(runs[0].drop(columns="train_end")) is None
    price, fit = fit_against_cells([overlapping], tmp_path / "profile_batches.parquet")
    assert price.per_step == 0.0 and price.first_step == 0.0 and fit["per_step_runs"] == 0
