"""early_exit (seed plan §4.2) in the simulator, on measured signals: it stops the confident responses, keeps the
partial response's score, counts its false positives, and refuses a trace without entropy."""

from __future__ import annotations

import numpy as np
import pytest
from test_sim import make_trace, run

from lssim.loop.decisions import Action
from lssim.traces.signal_trace import measure_response
from lssim.traces.trace import validate_trace

LENGTHS = [300, 300, 500, 200]  # one step, one group of four


def measured_trace(confident: list[bool], rewards: list[float]):
    """Random tokens; log-probs near 0 (entropy ~0.01 nats) for the confident responses, about -2 for the others."""
    rng = np.random.default_rng(0)
    df = make_trace([[LENGTHS]], max_tokens=1024, rewards=[[rewards]])
    rows = [measure_response(rng.integers(0, 1000, n).tolist(),
                             (-rng.uniform(0, 0.02, n) if sure else -rng.uniform(1.5, 2.5, n)).tolist(), max_tokens=1024)
            for n, sure in zip(LENGTHS, confident)]
    for column in rows[0]:
        df[column] = [row[column] for row in rows]
    return validate_trace(df)


def test_early_exit_stops_the_confident_responses_and_keeps_the_partial_score():
    trace = measured_trace([True, False, True, False], [1.0, 1.0, 0.0, 1.0])
    res, _ = run(trace, "early_exit(check_every=32, min_tokens=64, patience=3)")
    r = res.responses.set_index("sample_idx")
    assert r.loc[[0, 2], "stop_reason"].tolist() == ["early_exit"] * 2
    assert r.loc[[0, 2], "response_len"].tolist() == [128, 128]  # confident at 64, 96, 128: the third check stops
    # before its answer (modelled at the end) the partial response scores the lowest reward: a would-be-correct
    # response stopped is a false positive, counted as breaker's are
    assert r.loc[[0, 2], "reward"].tolist() == [0.0, 0.0] and r.loc[0, "natural_reward"] == 1.0
    assert (r.loc[[1, 3], "finish_reason"] == "stop").all()
    from lssim.analysis.replay import summarize

    assert summarize({"early_exit": res}).iloc[0]["stopped_correct_fraction"] == 0.5


def test_early_exit_refuses_a_trace_without_entropy():
    trace = measured_trace([True] * 4, [1.0] * 4)
    trace["signal_entropy"] = [np.full(len(a), np.nan, np.float32) for a in trace["signal_entropy"]]
    with pytest.raises(ValueError, match="early_exit: it reads the early-exit signal.*entropy"):
        run(trace, "early_exit")
    run(trace, "breaker(entropy_below=0, entropy_above=1e999)")  # repetition only: runs


def test_a_stop_gives_a_reward_or_asks_for_the_score_not_both():
    assert Action.stop("early_exit", score=True).score
    with pytest.raises(ValueError, match="not both"):
        Action.stop("x", reward=1.0, score=True)
