"""`lssim validate --mode`'s report against the noise (lssim.analysis.fidelity.modes), the shared host's measurement
(real_backend.host_sharing) and the driver's price (lssim.analysis.fidelity.driver), without vLLM."""

from __future__ import annotations

import json
import shutil
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from lssim.analysis.fidelity.driver import cells_driver, fit_driver_price
from lssim.analysis.fidelity.modes import mode_noise, modes_results
from real_backend.host_sharing import fit_sharing, training_share, write_sharing
from real_backend.validate_modes import host_pricing, summarize

LABELS = {"collocated": ("collocated 1 / baseline", 2.0), "async": ("async 1+1 K=1 roll / baseline", 1.2)}


def _by_repeat(rng, predicted_factor: dict, repeats: int = 4, steps: int = 6, noise: float = 0.05) -> pd.DataFrame:
    """Per run and step: measured seconds around each mode's truth (log-normal noise), predicted = truth x factor."""
    rows = []
    for mode, (label, truth) in LABELS.items():
        for k in range(repeats):
            for step in range(steps):
                rows.append({"label": label, "mode": mode, "policy": "baseline", "repeat": k, "step": step, "in_twin": True,
                             "measured_seconds": truth * float(np.exp(rng.normal(0, noise))),
                             "predicted_seconds": truth * predicted_factor[mode], "measured_groups": 8,
                             "predicted_groups": 8, "measured_max_staleness": 0, "predicted_max_staleness": 0,
                             "measured_rollout_seconds": truth, "predicted_rollout_seconds": truth})
    return pd.DataFrame(rows)


def _table(by_repeat):
    steps = (by_repeat.groupby(["label", "mode", "policy", "step"], sort=False)
             .agg({"in_twin": "any", **{c: "median" for c in by_repeat if c.startswith(("measured_", "predicted_"))}})
             .reset_index())
    steps["ape_pct"] = (steps["predicted_seconds"] - steps["measured_seconds"]).abs() / steps["measured_seconds"] * 100
    steps["signed_pct"] = (steps["predicted_seconds"] / steps["measured_seconds"] - 1) * 100
    return mode_noise(by_repeat, summarize(steps))


def test_an_exact_twin_scores_about_the_noise_floor_and_a_biased_one_its_bias_over_it():
    rng = np.random.default_rng(0)
    exact = _table(_by_repeat(rng, {"collocated": 1.0, "async": 1.0}))
    # an exact model's error is the noise of a 4-repeat median: a few %, and the twin here is that model
    assert (exact["exact_step_error_median"] > 0.5).all() and (exact["exact_step_error_median"] < 5).all()
    assert (exact["noise_ratio"] < 3).all() and (exact["runs"] == 4).all()
    biased = _table(_by_repeat(np.random.default_rng(0), {"collocated": 1.0, "async": 0.8}))
    row = biased.loc[LABELS["async"][0]]
    assert row["step_median_ape_pct"] == pytest.approx(20, abs=3)
    assert row["noise_ratio"] == pytest.approx(row["step_median_ape_pct"] / row["exact_step_error_median"])
    assert row["noise_ratio"] > 5
    # the speedup over collocated: measured ~2.0 / 1.2, predicted 2.0 / 0.96; its error in points, with a bound
    assert row["speedup_measured"] == pytest.approx(2.0 / 1.2, rel=0.05)
    assert row["speedup_error_points"] == pytest.approx((2.0 / 0.96 - row["speedup_measured"]) * 100)
    assert 0 < row["speedup_noise_bound_points"] < abs(row["speedup_error_points"])
    assert biased.loc[LABELS["collocated"][0], "speedup_error_points"] == 0


def test_modes_json_has_every_field_the_issue_names_per_mode_and_pools_the_runs():
    by_repeat = _by_repeat(np.random.default_rng(1), {"collocated": 0.9, "async": 0.8})
    result = modes_results(_table(by_repeat), by_repeat, "OUT")
    assert set(result["modes"]) == {"collocated", "async"}
    for entry in result["modes"].values():
        for key in ("step_error_median", "step_error_p90", "exact_step_error_median", "noise_ratio", "speedup_error", "runs"):
            assert entry[key] is not None, key
    assert result["pooled"]["runs"] == 8 and result["pooled"]["labels"] == 2
    json.dumps(result)  # plain JSON: no numpy scalars left


def test_the_pool_takes_each_mode_over_the_recordings_and_a_policy_folder_beside_them(tmp_path):
    import subprocess
    import sys

    from lssim.analysis.fidelity.modes import pool_modes

    rows = [_table(_by_repeat(np.random.default_rng(k), {"collocated": 1.0, "async": f})) for k, f in enumerate((0.9, 0.8, 1.0))]
    folders = []
    for k, summary in enumerate(rows):  # three recordings, each folder as `lssim validate --mode --out` writes its summary
        (tmp_path / f"modes{k}").mkdir()
        summary.to_csv(tmp_path / f"modes{k}" / "modes_summary.csv")
        folders.append(str(tmp_path / f"modes{k}"))
    table = pool_modes(folders)
    assert list(table.index) == ["collocated", "async", "all"]
    ratios = [r.loc[LABELS["async"][0], "noise_ratio"] for r in rows]
    row = table.loc["async"]
    assert (row["recordings"], row["runs"]) == (3, 12)
    assert row["ratio"] == pytest.approx(np.median(ratios))
    assert row["ratio_range"] == f"{min(ratios):.2f}-{max(ratios):.2f}"
    assert row["twin"] == pytest.approx(np.median([r.loc[LABELS["async"][0], "step_median_ape_pct"] for r in rows]))
    assert table.loc["all", "runs"] == 24
    out = subprocess.run([sys.executable, "-m", "lssim.analysis.fidelity", "--pool", *folders], capture_output=True,
                         text=True, check=True).stdout
    assert "per execution mode, pooled over 3" in out and "async" in out
    (tmp_path / "modes2" / "modes_summary.csv").write_text("run,mode\nx,async\n")
    bad = subprocess.run([sys.executable, "-m", "lssim.analysis.fidelity", "--pool", *folders], capture_output=True, text=True)
    assert bad.returncode == 2 and "modes2/modes_summary.csv: no column(s)" in bad.stderr and "noise_ratio" in bad.stderr


def test_the_shared_host_factors_are_the_median_over_rounds_of_beside_over_alone(tmp_path):
    rows = []
    for rnd, (engine, trainer) in enumerate([(1.5, 1.2), (1.7, 1.4), (1.6, 1.3)]):
        rows += [{"round": rnd, "phase": "engine_alone", "seconds": s} for s in (1.0, 1.1, 0.9)]
        rows += [{"round": rnd, "phase": "engine_beside", "seconds": s * engine} for s in (1.0, 1.2, 0.8)]
        rows += [{"round": rnd, "phase": "trainer_alone", "seconds": 2.0}, {"round": rnd, "phase": "trainer_beside", "seconds": 2.0 * trainer}]
    fit = fit_sharing(pd.DataFrame(rows))
    assert fit["engine_slowdown"] == pytest.approx(1.6) and fit["trainer_slowdown"] == pytest.approx(1.3)
    faster = pd.DataFrame(rows).assign(seconds=lambda d: np.where(d["phase"] == "trainer_beside", 1.8, d["seconds"]))
    assert fit_sharing(faster)["trainer_slowdown"] == 1.0  # beside the engine "faster": the noise, priced as no slow-down
    with pytest.raises(ValueError, match="no round measured both trainer"):
        fit_sharing(pd.DataFrame(rows).query("phase != 'trainer_beside'"))
    # beside full cells (every request decoding throughout, as a run's update meets the engine): the trainer's factor
    # comes from them; the engine's still from the long-tailed cells; rows without them fit as before (above)
    full = pd.DataFrame(rows + [{"round": rnd, "phase": "trainer_beside_full", "seconds": 2.0 * x}
                                for rnd, x in enumerate((1.45, 1.35, 1.4))])
    assert fit_sharing(full)["trainer_slowdown"] == pytest.approx(1.4)
    assert fit_sharing(full)["engine_slowdown"] == pytest.approx(1.6)
    profile = _bare_profile(tmp_path)
    assert training_share(profile) is None
    write_sharing(profile, fit)
    share = training_share(profile)
    assert (share.engine_slowdown, share.trainer_slowdown) == (pytest.approx(1.6), pytest.approx(1.3))
    from lssim.cost import ProfiledCostModel

    ProfiledCostModel.from_json(profile)  # still the engine's profile


def _bare_profile(tmp_path):
    """The shipped engine profile without its shared-host measurement, its cells beside it."""
    payload = json.loads(open("real_backend/data/profile_cpu.json").read())
    payload["measured_by"].pop("shared_host", None)
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(payload))
    shutil.copyfile("real_backend/data/profile_cpu_batches.parquet", tmp_path / "profile_batches.parquet")
    return path


def _run(mode: str, steps: pd.DataFrame | None = None, device: str = "cpu"):
    return SimpleNamespace(meta={"mode": {"mode": mode}, "setup": {"trainer_device": device}}, folder=f"runs/{mode}",
                           steps=steps if steps is not None else pd.DataFrame())


def test_a_run_whose_trainer_shared_the_host_needs_the_profiles_measurement_naming_the_command(tmp_path):
    profile = _bare_profile(tmp_path)
    with pytest.raises(ValueError, match="--shared-host"):
        host_pricing([_run("collocated"), _run("async")], str(profile))
    share, driver, said = host_pricing([_run("collocated"), _run("async", device="cuda")], str(profile))
    assert share is None and "devices of its own" in said  # a GPU trainer shares nothing
    write_sharing(profile, {"engine_slowdown": 1.4, "trainer_slowdown": 1.2})
    share, driver, said = host_pricing([_run("collocated"), _run("async")], str(profile))
    assert share.engine_slowdown == 1.4 and "x1.400" in said
    assert driver is None and "driver not priced" in said  # these runs recorded no driver time


def test_the_driver_price_is_the_runs_excess_over_the_cells_driver():
    rng = np.random.default_rng(0)
    n = rng.integers(1, 96, size=40)
    lengths = [rng.integers(1, 256, size=k).tolist() for k in n]
    cells = pd.DataFrame({"n_seqs": n, "lengths": lengths, "cut": 1.0,
                          "driver_seconds": [2e-4 * k + 3e-6 * sum(ls) for k, ls in zip(n, lengths)]})
    assert cells_driver(cells) == (pytest.approx(2e-4), pytest.approx(3e-6))
    # the runs' driver: the cells' plus 0.5 ms a finished response (the controller and the policy)
    steps = pd.DataFrame({"responses_in": rng.integers(16, 40, size=20), "tokens": rng.integers(1000, 5000, size=20),
                          "finished": rng.integers(10, 30, size=20), "truncated": rng.integers(0, 3, size=20)})
    steps["driver_seconds"] = (2e-4 * steps["responses_in"] + 3e-6 * steps["tokens"]
                               + 5e-4 * (steps["finished"] + steps["truncated"]))
    price, fit = fit_driver_price([steps], cells)
    assert price.per_finish == pytest.approx(5e-4, rel=1e-3)
    assert price.per_request == pytest.approx(0, abs=1e-7) and price.per_token == pytest.approx(0, abs=1e-9)
    assert fit["steps"] == 20
    price, why = fit_driver_price([steps.drop(columns="driver_seconds")], cells)
    assert price is None and "driver_seconds" in why
    price, why = fit_driver_price([steps], cells.drop(columns="driver_seconds"))
    assert price is None and "cells" in why


def test_the_policies_json_reports_the_twins_error_over_an_exact_models_beside_it():
    from lssim.analysis.fidelity.summary import load_summary, policy_results

    summary = load_summary("paper/experiments/validation/full4")
    entry = policy_results(summary)["policies"]["april"]
    assert entry["exact_step_error_median"] == pytest.approx(summary.loc["april", "noise_floor_median_pct"])
    assert entry["noise_ratio"] == pytest.approx(entry["step_error_median"] / entry["exact_step_error_median"])
    assert entry["noise_ratio"] == pytest.approx(15.5 / 5.6, rel=0.02)  # the headline table's april row
    pooled = policy_results(summary)["pooled"]
    assert pooled["rows"] == len(summary) == 20 and pooled["noise_ratio"] > 1  # every row of full4, baselines too
    assert pooled["runs"] == 100 and entry["runs"] == 5  # full4: 100 recorded runs, 5 repeats each


def test_recording_puts_the_profile_and_the_hosts_measurement_in_out_before_the_runs(tmp_path, monkeypatch):
    import real_backend.host_sharing as host_sharing
    import real_backend.trainer as trainer_module
    import real_backend.validate_record as validate_record
    from real_backend.profile import measurement_files
    from real_backend.validate_modes import profile_host

    made = []

    class Trainer:  # what profile_host asks of a GRPOTrainer: its vocabulary, and to end its worker once measured
        def __init__(self, *args, **kwargs):
            self.model = SimpleNamespace(config=SimpleNamespace(vocab_size=64))
            self.process, self.closed = kwargs["process"], False
            made.append(self)

        def close(self):
            self.closed = True

    measured, profiled = [], []
    rows = pd.DataFrame([{"round": 0, "phase": p, "seconds": s} for p, s in
                         (("engine_alone", 1.0), ("engine_beside", 1.3), ("trainer_alone", 2.0), ("trainer_beside", 2.4))])
    monkeypatch.setattr(trainer_module, "GRPOTrainer", Trainer)
    monkeypatch.setattr(host_sharing, "measure_sharing", lambda engine, trainer, vocab, rounds, group_size: measured.append(vocab) or rows)
    setup = SimpleNamespace(model_dir="m", trainer_threads=1, trainer_process=True)  # as the runs' trainer
    base = _bare_profile(tmp_path)
    out = tmp_path / "out" / "profile.json"
    profile_host(None, setup, out, str(base), reprofile=False, beside=False, length=256)
    assert training_share(out) is None and not measured  # collocated alone: nothing trains beside the rollout
    profile_host(None, setup, out, str(base), reprofile=False, beside=True, length=256)
    assert measured == [64] and training_share(out).engine_slowdown == pytest.approx(1.3)
    assert [(t.process, t.closed) for t in made] == [(True, True)]
    assert json.loads(out.read_text())["measured_by"]["shared_host"]["trainer_process"] is True
    assert measurement_files(out)["batches"].is_file()  # the cells came along (the driver's price reads them)

    def measure_engine(engine, setup, folder, profile_to, first, length):
        profiled.append((folder, profile_to, first, length))
        shutil.copyfile(base, profile_to)

    monkeypatch.setattr(validate_record, "_measure_engine", measure_engine)
    again = tmp_path / "again" / "profile.json"
    profile_host(None, setup, again, str(base), reprofile=True, beside=True, length=128)
    assert profiled == [(again.parent, str(again), True, 128)] and training_share(again) is not None


def test_runs_named_in_any_order_are_replayed_in_the_order_recorded():
    from real_backend.validate_modes import _recording_order

    def run(mode, repeat):
        return SimpleNamespace(meta={"mode": {"mode": mode}, "repeat": repeat}, folder=f"real/{mode}/baseline/repeat{repeat}")

    recorded = [run(m, k) for k in range(2) for m in ("collocated", "disaggregated", "async", "hybrid")]
    globbed = sorted(recorded, key=lambda r: r.folder)  # a shell glob: alphabetical, async first
    assert globbed[0].meta["mode"]["mode"] == "async"
    assert sorted(globbed, key=_recording_order) == recorded


def test_a_path_recorded_in_another_checkout_is_found_in_this_one():
    from real_backend.validate_twin import recorded_path

    here = recorded_path("/somewhere/else/checkout/real_backend/data/prompts.jsonl")
    assert here.is_file() and here.parts[-3:] == ("real_backend", "data", "prompts.jsonl")
    with pytest.raises(FileNotFoundError, match="neither there nor under"):
        recorded_path("/somewhere/else/no_such_folder/nothing.jsonl")


def test_each_twin_trains_at_its_runs_probed_level_and_a_jobs_first_step_has_no_start_up():
    from lssim.sim.shared_host import DriverPrice
    from lssim.sim.training import TrainCostAtLevel
    from real_backend.validate_modes import DEFAULT_TRAIN_PROFILE, mode_sim_setup
    from real_backend.validate_twin import load_recorded, speed_level

    folder = "paper/experiments/validation/modes38"
    price = DriverPrice(per_request=1e-3, per_step=0.1, first_step=0.3)
    for mode, first in (("collocated", 0.3), ("async", 0.0)):
        run = load_recorded(f"{folder}/real/{mode}/baseline/repeat0")
        setup = mode_sim_setup(run, f"{folder}/profile.json", str(DEFAULT_TRAIN_PROFILE), driver=price)
        assert isinstance(setup.train, TrainCostAtLevel)
        assert setup.train.level == pytest.approx(speed_level(run, f"{folder}/profile.json")) and setup.train.level > 1
        # a collocated run's first step counts from the run's start; a job's from its first rollout (fill_step_rows)
        assert (setup.driver.per_step, setup.driver.first_step) == (0.1, first)
