"""`replay(..., workers=N)` runs the policies and their references in forked processes: the same results as one
after the other, frame for frame; `lssim replay --workers` prints the same table."""

import json

import pandas as pd
import pytest

from lssim.cli import main
from lssim.cli.handlers import replay_workers
from lssim.analysis.replay import SimSetup, replay
from lssim.traces.synth import get_preset, synthesize


@pytest.fixture(scope="module")
def trace():
    trace = synthesize(get_preset("math7b").replace(steps=4, prompts_per_step=16, n_prompts=40, group_size=4))
    return trace.assign(prompt_id=trace["prompt_id"].map(lambda p: f"uid-{p}"))  # text ids come back as written


def test_forked_runs_give_the_results_of_runs_one_after_the_other(trace):
    setup = SimSetup(n_instances=2)
    alone = replay(trace, ["hadb", "april"], setup, workers=1)
    forked = replay(trace, ["hadb", "april"], setup, workers=2)
    assert list(forked) == list(alone) == ["baseline", "hadb", "april", "oracle"]
    for name in alone:
        pd.testing.assert_frame_equal(forked[name].responses, alone[name].responses)
        pd.testing.assert_frame_equal(forked[name].steps, alone[name].steps)
        assert forked[name].meta == alone[name].meta
    assert forked["hadb"].responses["prompt_id"].iloc[0].startswith("uid-")


def test_cli_workers_print_the_same_table(trace, tmp_path, capsys):
    path = tmp_path / "t.parquet"
    trace.to_parquet(path)
    tables = []
    for workers in ("1", "2"):
        assert main(["replay", str(path), "--policy", "hadb", "--instances", "2", "--json", "--workers", workers]) == 0
        tables.append(json.loads(capsys.readouterr().out))
    assert tables[0] == tables[1]


def test_default_workers_fork_only_for_big_traces():
    assert replay_workers(None, 1_000) == 1 and replay_workers(3, 1_000) == 3
    assert replay_workers(None, 10**6) >= 1


def test_replay_summary_is_summarize_of_replay(trace):
    from lssim.analysis.replay import replay_summary, summarize

    setup = SimSetup(n_instances=2)
    # the summary-only runs build just the response columns a summary reads; a stopping policy reads the most of them
    want = summarize(replay(trace, ["hadb", "breaker(min_tokens=64)"], setup), trace)
    assert want.loc["breaker(min_tokens=64)", "policy_stopped_fraction"] > 0
    for workers in (1, 2):
        pd.testing.assert_frame_equal(replay_summary(trace, ["hadb", "breaker(min_tokens=64)"], setup, workers=workers),
                                      want, check_exact=True)
    pd.testing.assert_frame_equal(replay_summary(trace, ["hadb"], setup, references=False),
                                  summarize(replay(trace, ["hadb"], setup, references=False), trace))


def test_a_run_keeps_only_the_response_columns_asked_for(trace):
    from lssim.analysis.replay import SUMMARY_RESPONSE_COLUMNS, simulate
    from lssim.traces.workload import Workload

    workload, setup = Workload(trace), SimSetup()
    full = simulate(workload, "april", setup)
    cut = simulate(workload, "april", setup, response_columns=SUMMARY_RESPONSE_COLUMNS)
    assert set(cut.responses.columns) == set(SUMMARY_RESPONSE_COLUMNS) < set(full.responses.columns)
    pd.testing.assert_frame_equal(cut.responses, full.responses[list(cut.responses.columns)])
    pd.testing.assert_frame_equal(cut.steps, full.steps)
    with pytest.raises(ValueError, match="no response column"):
        simulate(workload, "baseline", setup, response_columns=["reward", "rewrad"])
