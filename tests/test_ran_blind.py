"""A policy that cannot see what its rule reads says so (PolicyHooks.ran_blind): hadb that never leaves its warm-up,
lpt and ebs whose history never meets a prompt twice; a replay prints it beside the table."""

import json

import numpy as np
import pandas as pd
import pytest

from lssim.cli import main
from lssim.loop.history import LengthHistory
from lssim.loop.policy import make_policy
from test_policies_issue5 import outcome
from test_sim import run as run_with_engine


def run(trace, policy):
    return run_with_engine(trace, policy)[0]


def unique_prompts_trace(steps=4, prompts=8, group=4, seed=0) -> pd.DataFrame:
    """A trace whose every step draws prompts never seen before (as a run over a large pool records it)."""
    rng = np.random.default_rng(seed)
    rows = [dict(step=s, prompt_id=s * prompts + p, sample_idx=k, prompt_len=16, response_len=int(rng.integers(5, 400)),
                 reward=float(k % 2), finish_reason="stop", max_tokens=400)
            for s in range(steps) for p in range(prompts) for k in range(group)]
    return pd.DataFrame(rows)


def recurring_prompts_trace(steps=6, prompts=8, group=4, seed=0) -> pd.DataFrame:
    """The same prompts every step, each with lengths of its own (so a history can tell them apart)."""
    rng = np.random.default_rng(seed)
    rows = [dict(step=s, prompt_id=p, sample_idx=k, prompt_len=16, response_len=int(20 + 40 * p + rng.integers(0, 10)),
                 reward=float(k % 2), finish_reason="stop", max_tokens=400)
            for s in range(steps) for p in range(prompts) for k in range(group)]
    return pd.DataFrame(rows)


def test_history_is_blind_until_a_prompt_comes_back():
    h = LengthHistory()
    assert "no prompt came back" in h.blindness()
    h.update(outcome(0, {1: [100, 300], 2: [50]}))
    assert h.revisited == 0 and "2 prompts seen once" in h.blindness()
    h.update(outcome(1, {3: [10]}))
    assert h.blindness() is not None
    h.update(outcome(2, {2: [60], 4: [5]}))
    assert h.revisited == 1 and h.blindness() is None


@pytest.mark.parametrize("name", ["hadb", "lpt", "ebs"])
def test_a_history_policy_says_it_ran_blind_on_prompts_that_never_recur(name):
    res = run(unique_prompts_trace(), name)
    assert res.meta["ran_blind"] and "recur" in res.meta["ran_blind"]


@pytest.mark.parametrize("name", ["hadb", "lpt", "ebs"])
def test_a_history_policy_that_saw_prompts_again_did_not_run_blind(name):
    res = run(recurring_prompts_trace(), name)
    assert res.meta["ran_blind"] is None


def test_hadb_blind_runs_as_the_baseline_and_says_how_far_its_warm_up_got():
    trace = unique_prompts_trace()
    hadb, baseline = run(trace, "hadb"), run(trace, "baseline")
    assert "knew 24 of the pool's 32 prompts" in hadb.meta["ran_blind"]
    pd.testing.assert_frame_equal(hadb.steps, baseline.steps)


def test_a_composition_names_each_blind_member_and_nothing_else():
    res = run(unique_prompts_trace(), make_policy("seer+lpt"))
    assert res.meta["ran_blind"].startswith("lpt: no prompt came back") and "seer" not in res.meta["ran_blind"]
    assert run(unique_prompts_trace(), "seer").meta["ran_blind"] is None


def test_replay_prints_a_note_for_a_blind_policy_and_puts_it_in_the_json(tmp_path, capsys):
    path = tmp_path / "unique.parquet"
    unique_prompts_trace().to_parquet(path)
    assert main(["replay", str(path), "--policy", "hadb", "--policy", "april", "--instances", "2"]) == 0
    notes = [line for line in capsys.readouterr().out.splitlines() if line.startswith("note:")]
    assert len(notes) == 1 and notes[0].startswith("note: hadb ran blind on this trace: never left its warm-up")
    assert main(["replay", str(path), "--policy", "hadb", "--json", "--instances", "2"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert "warm-up" in data["hadb"]["ran_blind"] and data["baseline"]["ran_blind"] == ""
