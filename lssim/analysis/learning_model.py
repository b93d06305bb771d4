"""A learning-progress model: held-out accuracy as a function of the useful signal a run has trained on, so that a
replay's steps (how long each took, what each trained) become a predicted time to a target accuracy.

    signal of a step   = groups with a non-zero advantage x (1 - (1 - stale_weight) x off-policy token share)
    accuracy(S)        = initial + (ceiling - initial) x (1 - exp(-S / scale)),   S the signal summed over the steps

A group whose rewards are all equal teaches GRPO nothing (its advantages are zero), so the unit is a group with
signal (`effective_groups`, in both worlds' step rows); tokens generated under older weights (partial rollouts, async
modes: `off_policy_token_fraction`) count `stale_weight` of a fresh one. The curve saturates towards `ceiling`.
`fit` chooses ceiling, scale and stale_weight by least squares over the evaluations of real runs (lssim learn's
eval.parquet beside steps.parquet); `initial` is their accuracy before training.

What it can claim: on the task and recipe it was fitted on, how a policy's signal per second turns into time to
accuracy. What it cannot: it sees a policy only through how many groups with signal it trains and how stale they
are, not which ones (a policy that trains on easier or shorter responses, a stopped response's made-up reward, a
length bias: none of it moves the curve here), and `scale` and `ceiling` belong to the task, model and batch it was
fitted on; another task needs its own runs.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd


@dataclass(frozen=True)
class LearningModel:
    initial: float  # held-out accuracy before training
    ceiling: float  # where the curve saturates
    scale: float  # signal (groups with a non-zero advantage) per e-fold of the remaining gap
    stale_weight: float  # what an off-policy token is worth against an on-policy one, in [0, 1]

    def accuracy(self, signal) -> np.ndarray:
        return self.initial + (self.ceiling - self.initial) * (1.0 - np.exp(-np.asarray(signal, float) / self.scale))

    def signal_to(self, target: float) -> float:
        """The signal at which accuracy reaches `target` (inf where the ceiling is below it)."""
        gap = (target - self.initial) / (self.ceiling - self.initial) if self.ceiling > self.initial else math.inf
        return 0.0 if gap <= 0 else math.inf if gap >= 1 else -self.scale * math.log1p(-gap)

    def step_signal(self, steps: pd.DataFrame) -> np.ndarray:
        """Each step's useful signal from its row (the controller's step rows, real or simulated)."""
        stale = steps["off_policy_token_fraction"].fillna(0.0).to_numpy(float)
        return steps["effective_groups"].to_numpy(float) * (1.0 - (1.0 - self.stale_weight) * stale)

    def time_to(self, target: float, steps: pd.DataFrame) -> tuple[float, float]:
        """(seconds, steps) at which a run with these step rows reaches `target`: linear within the step that crosses
        it; NaN where the steps end before."""
        need = self.signal_to(target)
        signal = np.r_[0.0, np.cumsum(self.step_signal(steps))]
        seconds = np.r_[0.0, np.cumsum(steps["step_seconds"].to_numpy(float))]
        if need == 0.0:
            return 0.0, 0.0
        after = int(np.searchsorted(signal, need))  # first index with signal >= need
        if after >= len(signal):
            return math.nan, math.nan
        f = (need - signal[after - 1]) / (signal[after] - signal[after - 1])
        return float(seconds[after - 1] + f * (seconds[after] - seconds[after - 1])), float(after - 1 + f)

    def to_dict(self) -> dict:
        return asdict(self)


def fit(runs: list[tuple[pd.DataFrame, pd.DataFrame]]) -> LearningModel:
    """Least squares over every evaluation of `runs` ((steps, evals) of each real run): ceiling, scale and
    stale_weight; initial is the runs' mean accuracy at step 0."""
    from scipy.optimize import least_squares

    initial = float(np.mean([e.loc[e["step"] == 0, "pass1"].mean() for _, e in runs if (e["step"] == 0).any()]))
    effective, stale, at, accuracy = [], [], [], []
    for steps, evals in runs:
        effective.append(steps["effective_groups"].to_numpy(float))
        stale.append(steps["off_policy_token_fraction"].fillna(0.0).to_numpy(float))
        at.append(evals["step"].to_numpy(int))
        accuracy.append(evals["pass1"].to_numpy(float))

    def residuals(x):
        model = LearningModel(initial, x[0], x[1], x[2])
        out = []
        for eff, st, k, acc in zip(effective, stale, at, accuracy):
            cumulative = np.r_[0.0, np.cumsum(eff * (1.0 - (1.0 - model.stale_weight) * st))]
            out.append(model.accuracy(cumulative[np.minimum(k, len(cumulative) - 1)]) - acc)
        return np.concatenate(out)

    top = float(max(a.max() for a in accuracy))
    result = least_squares(residuals, x0=[min(1.0, top + 0.05), 500.0, 0.5],
                           bounds=([initial, 1e-6, 0.0], [1.0, 1e9, 1.0]))
    return LearningModel(initial, *map(float, result.x))


def kendall_tau(predicted, measured) -> float:
    """Kendall's tau-b of two rankings (NaN where fewer than two pairs are finite)."""
    from scipy.stats import kendalltau

    pairs = [(p, m) for p, m in zip(predicted, measured) if p == p and m == m]
    if len(pairs) < 2:
        return math.nan
    return float(kendalltau(*zip(*pairs)).statistic)


__all__ = ["LearningModel", "fit", "kendall_tau"]
