"""The learning-progress model (lssim.analysis.learning_model): its curve, its fit, its time to a target."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lssim.analysis.learning_model import LearningModel, fit, kendall_tau


def steps_frame(effective, stale=0.0, seconds=1.0) -> pd.DataFrame:
    n = len(effective)
    return pd.DataFrame({"effective_groups": effective, "off_policy_token_fraction": np.full(n, stale),
                         "step_seconds": np.full(n, seconds)})


def evals_of(model: LearningModel, steps: pd.DataFrame, every: int) -> pd.DataFrame:
    at = np.arange(0, len(steps) + 1, every)
    signal = np.r_[0.0, np.cumsum(model.step_signal(steps))]
    return pd.DataFrame({"step": at, "pass1": model.accuracy(signal[at])})


def test_fit_recovers_the_model_that_made_the_curves():
    true = LearningModel(initial=0.55, ceiling=0.8, scale=300.0, stale_weight=0.4)
    rng = np.random.default_rng(0)
    runs = []
    for stale in (0.0, 0.0, 0.5, 0.8):  # on-policy runs and runs with stale tokens: the stale weight is identifiable
        steps = steps_frame(rng.integers(2, 9, 120).astype(float), stale)
        runs.append((steps, evals_of(true, steps, 5)))
    got = fit(runs)
    assert got.initial == pytest.approx(0.55)
    assert (got.ceiling, got.scale, got.stale_weight) == (pytest.approx(0.8, abs=1e-3), pytest.approx(300.0, rel=1e-2),
                                                           pytest.approx(0.4, abs=1e-2))


def test_time_to_a_target_interpolates_within_the_step_that_crosses_it():
    model = LearningModel(initial=0.5, ceiling=1.0, scale=10.0, stale_weight=1.0)
    need = model.signal_to(0.75)  # half the gap: 10 ln 2 = 6.93 groups
    assert need == pytest.approx(10 * math.log(2))
    seconds, steps = model.time_to(0.75, steps_frame([4.0, 4.0, 4.0], seconds=2.0))
    assert steps == pytest.approx(1 + (need - 4) / 4) and seconds == pytest.approx(2 * steps)
    assert math.isnan(model.time_to(0.75, steps_frame([1.0, 1.0]))[0])  # not reached within the steps
    assert model.time_to(0.4, steps_frame([1.0])) == (0.0, 0.0)  # reached before training
    assert model.signal_to(1.0) == math.inf


@settings(max_examples=50, deadline=None)
@given(effective=st.lists(st.integers(0, 8), min_size=1, max_size=40), stale=st.floats(0, 1), extra=st.integers(1, 8),
       weight=st.floats(0, 1))
def test_more_signal_per_step_never_reaches_a_target_later(effective, stale, extra, weight):
    model = LearningModel(initial=0.5, ceiling=0.9, scale=20.0, stale_weight=weight)
    base = steps_frame(np.asarray(effective, float), stale)
    more = steps_frame(np.asarray(effective, float) + extra, stale)
    slow, fast = model.time_to(0.6, base)[0], model.time_to(0.6, more)[0]
    assert math.isnan(slow) or fast <= slow + 1e-9
    fresher = model.time_to(0.6, steps_frame(np.asarray(effective, float) + extra, 0.0))[0]
    assert math.isnan(fast) or fresher <= fast + 1e-9  # stale tokens count at most as much as fresh ones


def test_kendall_tau_ranks_and_skips_what_never_reached_the_target():
    assert kendall_tau([1, 2, 3], [10, 20, 30]) == pytest.approx(1.0)
    assert kendall_tau([3, 2, 1], [10, 20, 30]) == pytest.approx(-1.0)
    assert kendall_tau([1, float("nan"), 3, 4], [1, 2, 4, 3]) == pytest.approx(1 / 3)
    assert math.isnan(kendall_tau([1.0], [2.0]))
