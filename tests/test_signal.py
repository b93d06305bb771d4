"""lssim.analysis.signal: what a replayed policy costs the learner (issue 35, point 4): the invariants of the `signal`
record in every mode, the baseline's exact 1.0 length bias, and the length bias async's staleness bound brings."""

import json
import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lssim.analysis.replay import SimSetup, replay, replay_summary, summarize
from lssim.analysis.signal import cut_correct, length_bias, length_bias_within_prompts, signal_record, trace_lengths
from lssim.cli import main
from lssim.loop.rewards import RewardScale
from lssim.traces.synth import synthesize

FAST = settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])

traces = st.builds(
    lambda steps, prompts, group, seed, median, tail: synthesize(
        steps=steps, n_prompts=2 * prompts, prompts_per_step=prompts, group_size=group, max_tokens=2048,
        length_median=median, tail_fraction=tail, tail_alpha=1.0, seed=seed),
    steps=st.integers(1, 4), prompts=st.integers(1, 8), group=st.integers(1, 4), seed=st.integers(0, 10**6),
    median=st.floats(30, 400), tail=st.floats(0.01, 0.3))
MODES = [dict(mode="collocated"), dict(mode="disaggregated"), dict(mode="async", staleness=1),
         dict(mode="async", staleness=2), dict(mode="async", staleness=1, async_variant="areal"), dict(mode="hybrid")]
POLICIES = ["breaker(min_tokens=32)", "april", "hadb", "g2tp", "entropy_prune", "segment(bridge=True)"]


def signals(table: pd.DataFrame) -> dict:
    return {name: json.loads(text) for name, text in table["signal"].items()}


@FAST
@given(trace=traces, mode=st.sampled_from(MODES), policy=st.sampled_from(POLICIES))
def test_signal_invariants_in_every_mode(trace, mode, policy):
    table = replay_summary(trace, [policy], SimSetup(n_instances=2, **mode))
    for name, sig in signals(table).items():
        row = table.loc[name]
        assert sum(sig["trained_tokens_by_staleness"].values()) == sig["trained_tokens"]  # two sources, one total
        assert all(int(k) >= 0 for k in sig["trained_tokens_by_staleness"])
        responses = row["responses"]
        truncated_or_stopped = round((row["truncated_fraction"] + row["policy_stopped_fraction"]) * responses)
        assert sig["lost_correct"] + sig["lost_correct_unknown"] <= truncated_or_stopped
        assert sig["lost_correct_unknown"] == 0  # the simulator's Workload knows every response's uncut end
        assert 0 <= sig["nonzero_advantage_groups"] <= row["groups_trained"]
        assert sig["pruned_tokens"] is None or 0 <= sig["pruned_tokens"] <= sig["trained_tokens"]
        if name in ("baseline", "oracle") or policy.startswith(("breaker", "april", "hadb")):
            assert sig["pruned_tokens"] == 0  # no train mask
        assert sig["length_bias"] > 0 and sig["length_bias_within_prompts"] > 0
        assert sig["vs_baseline"]["trained_tokens"] == pytest.approx(sig["trained_tokens"] / signals(table)["baseline"]["trained_tokens"])
    assert signals(table)["baseline"]["vs_baseline"]["trained_tokens"] == 1.0


@FAST
@given(trace=traces, mode=st.sampled_from([dict(mode="collocated"), dict(mode="disaggregated"), dict(mode="hybrid")]))
def test_the_baseline_length_bias_on_its_own_trace_is_exactly_one(trace, mode):
    table = replay_summary(trace, [], SimSetup(n_instances=2, **mode))
    base = table.loc["baseline"]
    assert base["exact_fraction"] == 1.0 and base["responses"] == len(trace)  # exact replay of the whole trace
    assert base["length_bias"] == 1.0 and base["trained_response_tokens"] == trace["response_len"].sum()
    assert base["length_bias_within_prompts"] == 1.0 and signals(table)["baseline"]["length_bias"] == 1.0


@pytest.fixture(scope="module")
def long_tail(tmp_path_factory):
    """A long tail that runs over async's staleness bound: a fifth of the prompts Pareto-long (alpha 1)."""
    trace = synthesize(steps=8, n_prompts=64, prompts_per_step=16, group_size=4, max_tokens=4096, length_median=300,
                       tail_fraction=0.2, tail_alpha=1.0, seed=3)
    path = tmp_path_factory.mktemp("signal") / "long_tail.parquet"
    trace.to_parquet(path)
    return trace, path


def test_async_over_a_staleness_bound_trains_shorter_responses_and_says_so(long_tail, capsys):
    trace, path = long_tail
    collocated = summarize(replay(trace, [], SimSetup(n_instances=2)), trace).loc["baseline"]
    assert main(["replay", str(path), "--mode", "async", "--staleness", "2", "--async-variant", "roll", "--instances", "2",
                 "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    sig = data["baseline"]["signal"]
    assert data["baseline"]["groups_trained"] == collocated["groups_trained"]  # the same groups ...
    assert sig["trained_tokens"] < 0.9 * collocated["trained_response_tokens"]  # ... on far fewer tokens
    assert sig["length_bias"] < 0.9 and collocated["length_bias"] == 1.0  # named: the long ones were dropped
    assert sig["dropped_correct"] > 0 and data["baseline"]["dropped_stale"] > 0
    assert set(sig["trained_tokens_by_staleness"]) <= {"0", "1", "2"}
    for name in data:  # every policy carries the record
        assert {"nonzero_advantage_groups", "trained_tokens_by_staleness", "lost_correct", "pruned_tokens",
                "length_bias"} <= set(data[name]["signal"])


def test_the_printed_table_and_the_results_folder_carry_the_signal(long_tail, tmp_path, capsys):
    _, path = long_tail
    assert main(["replay", str(path), "--policy", "breaker", "--instances", "2", "--out", str(tmp_path / "res")]) == 0
    header = capsys.readouterr().out.splitlines()[1]
    assert "trained tok x" in header and "len bias" in header
    summary = pd.read_parquet(tmp_path / "res" / "summary.parquet")
    assert summary.loc["baseline", "length_bias"] == 1.0 and summary.loc["baseline", "trained_tokens_vs_baseline"] == 1.0
    assert json.loads(summary.loc["breaker", "signal"])["vs_baseline"]["trained_tokens"] < 1  # breaker stops long ones


def test_cut_correct_counts_only_responses_cut_short_of_a_correct_end():
    r = pd.DataFrame({
        "finish_reason": ["length", "length", "policy_stop", "policy_stop", "policy_stop", "abort", "stop", "length"],
        "response_len": [100, 100, 50, 50, 50, 70, 90, 100],
        "natural_len": [300, 100, 80, 80, -1, 200, 90, 300],
        "natural_reward": [5.0, 5.0, 5.0, -5.0, np.nan, 5.0, 5.0, np.nan],
    })
    # a +5/-5 scale: 5 is correct. Row 1 ended at its natural length (as the trace did): nothing lost.
    assert cut_correct(r, RewardScale(-5.0, 5.0)) == (2, 2, 1)


def test_length_biases_against_the_trace_and_within_prompts():
    trace = pd.DataFrame({"step": [0, 0, 1, 1, 1], "prompt_id": [1, 1, 2, 2, 2], "response_len": [10, 30, 5, 5, 8]})
    lengths = trace_lengths(trace)
    assert (lengths.tokens, lengths.rows) == (58, 5)
    assert lengths.per_prompt.loc[1].tolist() == [40, 2] and lengths.per_prompt.loc[2].tolist() == [18, 3]
    assert trace_lengths(trace, steps=1).rows == 2 and trace_lengths(trace, steps=9).rows == 5
    # two responses to prompt 1 (trace mean 20) of 15 tokens, one to prompt 2 (mean 6) of 6, one to an unknown prompt
    prompts, trained = pd.Series([1, 1, 2, 9]), np.array([15, 15, 6, 4])
    assert length_bias(trained, lengths) == pytest.approx((40 / 4) / (58 / 5))
    assert length_bias_within_prompts(prompts, trained, lengths.per_prompt) == pytest.approx(36 / 46)
    # the trace's own responses, once each: exactly 1.0 both ways
    assert length_bias(trace["response_len"].to_numpy(), lengths) == 1.0
    assert length_bias_within_prompts(trace["prompt_id"], trace["response_len"].to_numpy(), lengths.per_prompt) == 1.0
    assert math.isnan(length_bias_within_prompts(pd.Series([9]), np.array([3]), lengths.per_prompt))
    assert math.isnan(length_bias(np.array([], np.int64), lengths))


def test_signal_record_ratios_and_unknowns():
    row = dict(nonzero_advantage_groups=3, groups_trained=4, trained_response_tokens=50, staleness_histogram='{"0": 50}',
               lost_correct=2, lost_correct_unknown=0, dropped_correct=0, pruned_tokens=float("nan"), length_bias=0.5,
               length_bias_within_prompts=0.8)
    base = dict(row, nonzero_advantage_groups=2, trained_response_tokens=100, lost_correct=0, pruned_tokens=0, length_bias=1.0,
                length_bias_within_prompts=1.0)
    record = signal_record(row, base)
    assert record["nonzero_advantage_fraction"] == 0.75 and record["trained_tokens_by_staleness"] == {"0": 50}
    assert record["pruned_tokens"] is None
    assert record["vs_baseline"] == {"nonzero_advantage_groups": 1.5, "trained_tokens": 0.5, "lost_correct": None,
                                     "pruned_tokens": None, "length_bias": 0.5, "length_bias_within_prompts": 0.8}
    no_trace = {k: v for k, v in row.items() if not k.startswith("length_bias")}
    assert signal_record(no_trace, None) == {**record, "length_bias": None, "length_bias_within_prompts": None,
                                             "vs_baseline": None}
