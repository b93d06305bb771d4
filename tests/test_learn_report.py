"""lssim learn's figures (real_backend.learn_report): time to a target accuracy, interpolated between evaluations, the
accuracy at a budget, and the bootstrap interval of the median over seeds."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from real_backend.learn_report import bootstrap_interval, summarize, time_to_target, value_at


def test_time_to_target_interpolates_between_the_evaluations_around_the_crossing():
    x, y = [0, 10, 20, 30], [0.5, 0.55, 0.65, 0.70]
    assert time_to_target(x, y, 0.60) == pytest.approx(15.0)
    assert time_to_target(x, y, 0.65) == pytest.approx(20.0)
    assert time_to_target(x, y, 0.5) == 0.0  # reached at the start
    assert math.isnan(time_to_target(x, y, 0.71))  # never reached
    assert time_to_target([0, 10, 20], [0.5, 0.7, 0.4], 0.6) == pytest.approx(5.0)  # the first crossing, not a later dip


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0, 1, allow_nan=False), min_size=2, max_size=12), st.floats(0.01, 1, allow_nan=False))
def test_time_to_target_lands_on_the_line_that_crosses_it(ys, target):
    x = np.arange(len(ys), dtype=float) * 7.0
    t = time_to_target(x, ys, target)
    first = next((i for i, v in enumerate(ys) if v >= target), None)
    if first is None:
        assert math.isnan(t)
    elif first == 0:
        assert t == 0.0
    else:
        assert x[first - 1] <= t <= x[first]
        assert np.interp(t, x[first - 1:first + 1], ys[first - 1:first + 1]) == pytest.approx(target, abs=1e-6)


def test_value_at_takes_the_latest_evaluation_at_or_before():
    assert value_at([0, 10, 20], [0.1, 0.2, 0.3], 15) == 0.2
    assert value_at([0, 10, 20], [0.1, 0.2, 0.3], 20) == 0.3
    assert math.isnan(value_at([5, 10], [0.1, 0.2], 1))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(-100, 100, allow_nan=False), min_size=1, max_size=15))
def test_the_bootstrap_interval_holds_the_median_and_stays_within_the_values(values):
    lo, hi = bootstrap_interval(values)
    assert min(values) <= lo <= hi <= max(values)
    if len(values) == 1:
        assert lo == hi == values[0]


def test_bootstrap_interval_is_seeded_and_leaves_nan_out():
    v = [1.0, 2.0, 3.0, 10.0, math.nan]
    assert bootstrap_interval(v) == bootstrap_interval(v)
    assert all(math.isnan(b) for b in bootstrap_interval([math.nan]))
    narrow, wide = bootstrap_interval([5.0] * 8 + [5.1, 4.9]), bootstrap_interval([1.0, 9.0, 2.0, 8.0, 5.0])
    assert narrow[1] - narrow[0] < wide[1] - wide[0]


def _run(tmp_path, name: str, evals: list[tuple[int, float, float]], step_seconds: float) -> str:
    d = tmp_path / name
    d.mkdir(parents=True)
    pd.DataFrame([{"step": s, "version": s, "train_seconds": t, "wall_seconds": t, "pass1": p, "greedy_accuracy": p,
                   "mean_length": 90.0, "truncation_rate": 0.0, "samples": 8, "prompts": 2, "eval_seconds": 1.0}
                  for s, t, p in evals]).to_parquet(d / "eval.parquet")
    n = max(s for s, _, _ in evals)
    pd.DataFrame({"step": range(n), "step_seconds": [step_seconds] * n,
                  "rollout_seconds": [step_seconds / 2] * n}).to_parquet(d / "steps.parquet")
    return str(d)


def test_summarize_compares_at_equal_wall_clock_and_by_time_to_target(tmp_path):
    runs = {"baseline": {0: _run(tmp_path, "b0", [(0, 0.0, 0.5), (10, 40.0, 0.6), (20, 80.0, 0.7)], 4.0),
                         1: _run(tmp_path, "b1", [(0, 0.0, 0.5), (10, 40.0, 0.5), (20, 80.0, 0.6)], 4.0)},
            "fast": {0: _run(tmp_path, "f0", [(0, 0.0, 0.5), (10, 20.0, 0.6), (20, 40.0, 0.7)], 2.0)}}
    result = summarize(runs)
    assert result["target"] == 0.6 and result["target_rule"] == "initial + 0.10"
    assert result["budget_seconds"] == 40.0  # the smallest budget every run reached
    b, f = result["runs"]["baseline"], result["runs"]["fast"]
    assert b[0]["time_to_target_seconds"] == pytest.approx(40.0) and b[1]["time_to_target_seconds"] == pytest.approx(80.0)
    assert f[0]["time_to_target_seconds"] == pytest.approx(20.0) and f[0]["time_to_target_steps"] == pytest.approx(10.0)
    assert b[0]["accuracy_at_budget"] == 0.6 and f[0]["accuracy_at_budget"] == 0.7
    s = result["summary"]
    assert s["baseline"]["time_to_target_seconds"]["median"] == pytest.approx(60.0)
    assert s["baseline"]["time_to_target_seconds"]["spread"] == pytest.approx(40.0)
    lo, hi = s["baseline"]["time_to_target_seconds"]["interval"]
    assert 40.0 - 1e-9 <= lo <= hi <= 80.0 + 1e-9
    assert s["fast"]["step_speedup"] == 2.0 and s["baseline"]["step_speedup"] == 1.0
    assert s["fast"]["time_to_target_speedup"] == pytest.approx(3.0)  # 60 s against its 20 s
    assert s["fast"]["verdict"] == "faster per step, faster to accuracy"
    assert summarize(runs, target=0.7)["runs"]["fast"][0]["time_to_target_steps"] == pytest.approx(20.0)


def test_the_verdict_names_a_policy_faster_per_step_and_slower_to_accuracy():
    from real_backend.learn_report import verdict

    assert verdict(1.5, 0.8) == "faster per step, slower to accuracy"
    assert verdict(1.02, 0.99) == "even per step, even to accuracy"  # within 5%
    assert verdict(1.5, float("nan")) == "target not reached"
