"""`lssim replay` from the shell's point of view: the table, the JSON, the results folder, the errors."""

import json

import pytest

from lssim.cli import main
from lssim.results import read_results


@pytest.fixture(scope="module")
def small_trace(tmp_path_factory):
    path = tmp_path_factory.mktemp("t") / "small.parquet"
    main(["synth", "--preset", "math7b", "--steps", "6", "--prompts-per-step", "32", "--n-prompts", "96", "--group-size", "4",
          "--out", str(path)])
    return path


def test_replay_prints_each_policy_against_baseline_and_the_bound(small_trace, capsys):
    assert main(["replay", str(small_trace), "--policy", "hadb", "--instances", "2"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    # speedup is end to end (issue 14); the rollout-only figure stands beside it under its own name
    assert lines[1].split()[:8] == ["policy", "step", "s", "speedup", "rollout", "s", "rollout", "x"]
    assert [line.split()[0] for line in lines[3:6]] == ["baseline", "hadb", "oracle"]


def test_a_profiled_rollout_says_what_prices_its_training(small_trace, capsys):
    profile = "real_backend/data/profile_cpu.json"
    assert main(["replay", str(small_trace), "--instances", "1", "--profile", profile, "--steps", "1"]) == 0
    out = capsys.readouterr().out
    assert "training analytic for qwen2.5-7b" in out and "note: the rollout is priced by the profile" in out
    trainer = "real_backend/data/profile_trainer_cpu.json"
    assert main(["replay", str(small_trace), "--instances", "1", "--profile", profile, "--train-cost", trainer,
                 "--steps", "1"]) == 0
    out = capsys.readouterr().out
    assert f"training cost {trainer}" in out and "note: the rollout" not in out


def test_replay_json_has_the_documented_fields(small_trace, capsys):
    assert main(["replay", str(small_trace), "--policy", "hadb", "--policy", "hadb+oracle", "--json", "--instances", "2"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert list(data) == ["baseline", "hadb", "hadb+oracle", "oracle"]
    for row in data.values():
        assert row["rollout_seconds"] > 0 and row["tokens_per_second"] > 0 and 0 < row["lower_bound_efficiency"] <= 1
    assert data["baseline"]["speedup"] == 1.0 and data["baseline"]["exact_fraction"] == 1.0


def test_replay_writes_results_as_parquet(small_trace, tmp_path, capsys):
    out = tmp_path / "res"
    assert main(["replay", str(small_trace), "--policy", "hadb", "--out", str(out), "--instances", "2"]) == 0
    summary, frames = read_results(out)
    assert list(summary.index) == ["baseline", "hadb", "oracle"] and set(frames) == {"baseline", "hadb", "oracle"}
    assert len(frames["hadb"]["responses"]) == summary.loc["hadb", "responses"]


@pytest.mark.parametrize("args, message", [
    (["replay", "missing.parquet"], "missing.parquet"),
    (["replay", "{trace}", "--policy", "nope"], "unknown policy 'nope'"),
    (["replay", "{trace}", "--model", "gpt-9"], "unknown model"),
])
def test_bad_input_exits_2_with_a_clear_message_and_writes_nothing(small_trace, tmp_path, capsys, args, message):
    out = tmp_path / "res"
    args = [a.format(trace=small_trace) for a in args] + ["--out", str(out)]
    with pytest.raises(SystemExit) as e:
        main(args)
    assert e.value.code == 2
    assert message in capsys.readouterr().err
    assert not out.exists() and list(tmp_path.iterdir()) == []
