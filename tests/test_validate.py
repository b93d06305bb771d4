"""`lssim validate` (real_backend/validate_command.py, validate_record.py, sim_vs_real.py): its input checks, the
validation worlds, recording repeats until the goal can be tested, and validating recorded runs. The tests marked
`real` use the session's shared vLLM engine."""

from __future__ import annotations

import json
import re

import numpy as np
import pandas as pd
import pytest

from lssim.cli import main
from lssim.loop.controller import RunConfig
from lssim.analysis.fidelity.run import load_run

from fidelity_helpers import noisy_repeats, profile, speedup_repeats  # noqa: F401  (profile: a fixture)


@pytest.mark.parametrize("args, message", [
    (["--profile", "no/such/profile.json"], "does not exist"),
    (["--runs", "no/such/run"], "not a recorded run"),
    (["--policies", "no_such_policy"], "no_such_policy"),
    (["--runs", "a", "--reprofile"], "--reprofile"),
    (["--repeats", "0"], "--repeats"),
    (["--repeats", "5", "--max-repeats", "3"], "--max-repeats (3) must be at least --repeats (5)"),
    (["--runs", "a", "--max-repeats", "9"], "--max-repeats"),
])
def test_validate_bad_input_exits_2_and_writes_nothing(tmp_path, capsys, profile, args, message):
    out = tmp_path / "out"
    argv = ["validate", "--out", str(out), *args]
    if "--profile" not in args and "--reprofile" not in args:
        argv += ["--profile", profile]
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2 and message in capsys.readouterr().err and not out.exists()


@pytest.mark.real
def test_validate_replays_recorded_runs(vllm_engine, real_model_dir, tmp_path, profile):
    from lssim.analysis.tables import format_fidelity
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


def test_every_listed_policy_has_a_world_and_a_spec_that_builds():
    from lssim.loop.policy import make_policy
    from real_backend.validation_workloads import load_workloads

    table = load_workloads()
    assert {"seer", "breaker", "hadb"} <= set(table.select("ci")) <= set(table.select("all"))
    for name, w in table.policies.items():
        assert make_policy(w.spec).name == name.split("+")[0] and w.world.name in table.worlds and w.why
    for name in ("seer", "lpt", "ebs"):  # placement and order are decisions only with several instances
        assert table.for_spec(name).world.n_instances >= 2
    assert table.for_spec("seer(chunk=8)").world is table.policies["seer"].world
    assert table.for_spec("hadb+lpt").world.name == "default"
    cfg = table.worlds["tail"].config(seed=3, steps=2, max_tokens=None)
    assert (cfg.steps, cfg.max_tokens, cfg.seed) == (2, table.worlds["tail"].max_tokens, 3)


@pytest.mark.parametrize("text, message", [
    ("[worlds.default]\nsteps = 2\nbogus = 1\n", "unknown keys ['bogus']"),
    ("[worlds.x]\nsteps = 2\n", "no [worlds.default]"),
    ("[worlds.default]\n[policies.seer]\nspec = 'seer'\nworld = 'nowhere'\n", "names world 'nowhere'"),
    ("[worlds.default]\n[policies.seer]\nspec = 'seer(chunk=0)'\n", "does not build"),
    ("[worlds.default]\nsteps = 0\n", "steps must be an int >= 1"),
    ("[worlds.default]\n[policies.seer]\nworld = 'default'\n", "needs spec"),
    ("[world]\n", "unknown sections"),
])
def test_a_bad_workload_table_is_refused_naming_the_entry(tmp_path, text, message):
    from real_backend.validation_workloads import load_workloads

    path = tmp_path / "w.toml"
    path.write_text(text)
    with pytest.raises(ValueError, match=re.escape(message)) as e:
        load_workloads(path)
    assert str(path) in str(e.value)


@pytest.mark.real
def test_the_ci_policies_act_on_the_real_engine(vllm_engine, real_model_dir, tmp_path, profile):
    """The small subset's one-instance worlds (breaker: the default 256-token world; hadb: a 32-prompt pool revisited), each
    beside its world's baseline, fewer steps than the table's: each acts, and the JSON has its fields. (seer's
    world needs a two-instance engine: `lssim validate --policies ci` runs it.)"""
    from lssim.analysis.fidelity.summary import policy_results, unacted
    from real_backend.sim_vs_real import validate_worlds
    from real_backend.validation_workloads import load_workloads
    from real_backend.world import RealSetup, prepare, run_real

    table = load_workloads()
    by_world = {}
    for name, steps in (("breaker", 2), ("hadb", 4)):
        w = table.policies[name]
        assert w.ci and w.world.n_instances == 1
        setup = RealSetup(model_dir=str(real_model_dir), n_prompts=w.world.n_prompts)
        config = w.world.config(seed=0, steps=steps)
        for label, spec in (("baseline", "baseline"), (name, w.spec)):
            prompts, policy = prepare(setup, spec, config)
            folder = tmp_path / w.world.name / label
            run_real(setup, policy, config, folder, engine=vllm_engine, prompts=prompts,
                     meta={"policy_spec": spec, "validation_name": label, "world": w.world.name})
            by_world.setdefault(w.world.name, {})[label] = [load_run(folder)]
    frames = validate_worlds(by_world, profile, counterfactual=False)
    summary = frames["summary"]
    assert unacted(summary) == []
    assert summary.loc["breaker", "stopped"] > 0 and summary.loc["hadb", "reselected"] > 0
    # the twin reads the signals the run measured from its tokens: it stops the responses the engine stopped
    assert summary.loc["breaker", "stop_precision"] == 1.0 and summary.loc["breaker", "stop_recall"] == 1.0
    result = json.loads(json.dumps(policy_results(summary)))
    assert set(result["policies"]) == {"breaker", "hadb"} and set(result["baselines"]) == {"baseline@default", "baseline@history"}
    for entry in result["policies"].values():
        assert entry["acted"] > 0 and entry["step_error_median"] >= 0 and entry["speedup_error"] is not None
        assert {"step_error_p90", "repeat_spread", "world", "acted_by"} <= set(entry)


def test_reprofile_gives_the_speculating_policies_the_speculation_measured_beside_the_profile():
    """--reprofile on an engine started with speculation measures its speculation into <profile>_speculation.json and
    hands it to every policy whose spec names a measured speculation profile (the world's spec_tail), with its cost
    model where it takes one; a policy on its default profile (tlt: it decides with it) and the others run as named."""
    from lssim.loop.policy import make_policy
    from real_backend.validate_record import speculation_path, with_speculation_fit

    fit = speculation_path("runs/v/profile.json")
    assert fit.as_posix() == "runs/v/profile_speculation.json"
    assert with_speculation_fit("spec_tail(profile='real_backend/data/speculation_cpu.json', max_batch=8)", fit,
                                "runs/v/profile.json") == \
        "spec_tail(profile='runs/v/profile_speculation.json', max_batch=8)"
    assert with_speculation_fit("tlt(profile='real_backend/data/speculation_cpu.json')", fit, "runs/v/profile.json") == \
        "tlt(profile='runs/v/profile_speculation.json', cost_profile='runs/v/profile.json')"
    for unchanged in ("tlt", "spec_tail(max_batch=8)", "baseline", "hadb(warmup_fraction=0.5)", "breaker(check_every=64)"):
        assert with_speculation_fit(unchanged, fit, "runs/v/profile.json") == unchanged
    assert with_speculation_fit("hadb+spec_tail(profile='real_backend/data/speculation_cpu.json')", fit, "p.json") == \
        "hadb+spec_tail(profile='runs/v/profile_speculation.json')"
    built = make_policy(with_speculation_fit("spec_tail(profile='real_backend/data/speculation_cpu.json')", "real_backend/data/speculation_cpu.json", "p.json"))
    assert built.profile == "real_backend/data/speculation_cpu.json"  # the rewritten spec builds


def test_the_validation_noise_benchmark_reads_shipped_validations_and_names_a_bad_folder(tmp_path, capsys):
    from paper.experiments.validation_noise import folder_table, main

    table = folder_table("paper/experiments/validation/probe2")
    assert {"seer", "hadb", "breaker"} <= set(table.index)
    assert (table["noise_floor_median_pct"] > 0).all() and table["repeats_for_goal"].min() >= 2
    assert main(["paper/experiments/validation/probe2"]) == 0
    out = capsys.readouterr().out
    assert "an exact model (noise floor)" in out and "at the probed level" in out
    assert "speedups, pooled" in out and table.loc["seer", "speedup_noise_bound_points"] > 0
    assert main([str(tmp_path)]) == 2 and "summary.csv" in capsys.readouterr().err


def test_validate_keeps_recording_while_a_speedup_cannot_be_told_from_noise(capsys):
    """Steps quiet enough to test the goal, but a 10x speedup whose 1% noise is 10 points: record on."""
    from real_backend.validate_record import enough_repeats

    rng = np.random.default_rng(5)
    rows = speedup_repeats(rng, 0.02, 5, 3, speedup=10.0)
    assert not enough_repeats(rows, 3, 3, 30)
    assert "miss the speedup by" in capsys.readouterr().err
    many = speedup_repeats(rng, 0.02, 5, 60, speedup=10.0)
    assert enough_repeats(many, 60, 3, 100)  # enough repeats bring it under the goal
    assert enough_repeats(speedup_repeats(rng, 0.02, 5, 3, speedup=1.2), 3, 3, 30)  # a modest speedup: 3 suffice


def test_validate_records_repeats_until_the_goal_can_be_tested(capsys):
    from real_backend.validate_record import enough_repeats

    rng = np.random.default_rng(0)
    quiet = pd.concat([noisy_repeats(rng, 0.005, 5, 3, "a@w"), noisy_repeats(rng, 0.005, 5, 3, "b@w")])
    noisy = pd.concat([noisy_repeats(rng, 0.005, 5, 3, "a@w"), noisy_repeats(rng, 0.3, 5, 3, "b@w")])
    assert not enough_repeats(quiet, 2, 3, 30)  # never fewer than --repeats
    assert enough_repeats(quiet, 3, 3, 30)  # a quiet machine: the minimum tests the goal
    assert not enough_repeats(noisy, 3, 3, 30)  # one noisy policy keeps the engine recording
    assert "cannot be tested yet for b@w" in capsys.readouterr().err
    assert enough_repeats(noisy, 30, 3, 30)  # up to --max-repeats, not beyond
    assert enough_repeats(noisy, 3, 3, 3)  # with --max-repeats equal to --repeats: exactly --repeats
    many = pd.concat([noisy_repeats(rng, 0.005, 5, 40, "a@w"), noisy_repeats(rng, 0.08, 5, 40, "b@w")])
    assert enough_repeats(many, 40, 3, 60)  # more repeats bring the floor under the goal


def test_a_subset_validation_records_up_to_three_times_its_repeats_until_testable_and_a_full_one_its_repeats():
    import argparse

    from real_backend.validate_command import add_arguments
    from real_backend.validate_record import default_max_repeats

    p = argparse.ArgumentParser()
    add_arguments(p)

    def max_repeats(*argv):
        return default_max_repeats(p.parse_args(["--out", "x", *argv]))

    assert max_repeats("--policies", "seer,breaker,hadb") == 15  # the command: 5 repeats, up to 15
    assert max_repeats("--repeats", "4") == 12  # the default subset too
    assert max_repeats("--policies", "hadb", "--max-repeats", "7") == 7  # given: as given
    assert max_repeats("--full") is None and max_repeats("--policies", "all") is None  # ~100 runs a repeat: --repeats
    assert max_repeats("--runs", "a", "b") is None  # nothing recorded
