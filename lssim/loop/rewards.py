"""The run's reward scale: what "correct", "a failure" and "a soft landing" mean whatever the rewards are.

Traces come with rewards of any scale: 0/1 correctness (the reference traces, the real task), +5/-5
(RLinf's reasoning recipe), a reward model's unbounded score. Policies that read rewards say what they
assume through this one object, so the same policy means the same thing on every scale:

    scale.normalized(r)   0 at the lowest reward, 1 at the highest (outside [0, 1] beyond them)
    scale.value(x)        the reward at normalized position x (its inverse)
    scale.correct(r)      r is in the upper half of the range: "right" (for 0/1 rewards: r > 0.5, i.e. r == 1)

A run's scale is `RunConfig.reward_scale`, handed to policies in `StepContext.reward_scale`: the real
world's task scores 0/1 (the default); a trace's is the range of its recorded rewards (`RewardScale.of`).
On a 0/1 scale every policy computes exactly what it did before the scale existed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class RewardScale:
    low: float = 0.0  # the lowest reward (a wrong answer)
    high: float = 1.0  # the highest reward (a right answer)

    def __post_init__(self):
        if not (math.isfinite(self.low) and math.isfinite(self.high) and self.high > self.low):
            raise ValueError(f"RewardScale needs finite low < high, got ({self.low}, {self.high})")

    @classmethod
    def of(cls, rewards) -> "RewardScale":
        """The range of the rewards seen (NaN ignored). Where they do not span a range (every reward equal,
        or none known), the range is widened to hold [0, 1] too: a trace of all-zero rewards is a 0/1 task
        that was never solved."""
        r = np.asarray(rewards, dtype=float)
        r = r[np.isfinite(r)]
        lo, hi = (float(r.min()), float(r.max())) if len(r) else (0.0, 1.0)
        if hi > lo:
            return cls(lo, hi)
        return cls(min(lo, 0.0), max(hi, 1.0))

    @property
    def span(self) -> float:
        return self.high - self.low

    def normalized(self, reward):
        """(reward - low) / span: 0 at the lowest reward, 1 at the highest; numbers or numpy arrays."""
        return (reward - self.low) / self.span

    def value(self, position: float) -> float:
        """The reward at normalized `position` (e.g. -1: one whole range below the lowest reward)."""
        return self.low + position * self.span

    def correct(self, reward):
        """True where the reward lies in the upper half of the range (NaN: False)."""
        return self.normalized(reward) > 0.5
