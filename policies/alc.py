"""alc -- adaptive length curriculum: a max_tokens schedule that starts short and opens up as reward rises.

Source: the seed plan's "adaptive length curriculum" (§2.2): early in RL the model cannot use a long
budget (it loops or rambles, and those responses are the long tail), so cap max_new_tokens short
(2k of 8k-16k, say), open the cap as the reward rises, and give a truncated response a small extra
penalty so the model learns to finish within its budget. Staged length schedules of this kind are
common practice (e.g. DeepScaleR's 8k -> 16k -> 24k). The trigger and the constants below are ours;
each is a parameter.

Rule:
- Budget levels: b_0 = start_fraction * max_tokens, b_(k+1) = min(max_tokens, growth * b_k).
  Every group of a step gets min(its planned max_tokens, current level).
- Reward signal: m_t, the mean reward of the responses that ended in step t (as the engine scored
  them, before the penalty); R_t = ema * m_t + (1 - ema) * R_(t-1), R_0 = m_0.
- Reward scale: `reward_gain` and `truncation_penalty` are fractions of the run's reward range
  (lssim.loop.rewards: of 1 for 0/1 rewards, of 10 for +5/-5), so they mean the same on any scale.
- Open up (next level) after a step t when the current level has run `min_steps` steps and either
      R_t >= R_ref + reward_gain   (the reward rose: R_ref is R after the level's first step), or
      `max_steps` steps have passed at this level (a time floor, so the curriculum always opens --
      and the simulator, whose trace cannot show learning, still exercises every level).
  The budget never shrinks.
- Penalty (in `select`, on copies -- the requests themselves are never changed): a member truncated
  by its budget (finish reason "length") trains with reward - truncation_penalty.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from lssim.loop.columns import GroupBatch
from lssim.loop.core import LENGTH, Group, GroupSpecs
from lssim.loop.policy import Policy
from lssim.loop.rewards import RewardScale


class ALC(Policy):
    name = "alc"

    def __init__(self, start_fraction: float = 0.25, growth: float = 2.0, reward_gain: float = 0.02, ema: float = 0.5,
                 min_steps: int = 2, max_steps: int | None = 8, truncation_penalty: float = 0.1):
        if not 0.0 < start_fraction <= 1.0 or growth <= 1.0:
            raise ValueError(f"alc: need 0 < start_fraction <= 1 and growth > 1, got {start_fraction}, {growth}")
        if not 0.0 < ema <= 1.0 or min_steps < 1 or (max_steps is not None and max_steps < min_steps):
            raise ValueError("alc: need 0 < ema <= 1 and 1 <= min_steps <= max_steps")
        if truncation_penalty < 0:
            raise ValueError("alc: truncation_penalty must be >= 0")
        self.start_fraction, self.growth, self.reward_gain, self.ema = start_fraction, growth, reward_gain, ema
        self.min_steps, self.max_steps, self.truncation_penalty = min_steps, max_steps, truncation_penalty
        self.level = 0
        self.budget: int | None = None  # the current cap (set at the first plan, from the run's max_tokens)
        self._max_tokens = 0
        self._steps_at_level = 0
        self._reward: float | None = None  # R_t
        self._reference: float | None = None  # R after the level's first step
        self.history: list[tuple[int, int]] = []  # (step, budget) each step ran with
        self._scale = RewardScale()  # the run's, from each step's context

    def plan(self, ctx, proposal):
        self._scale = ctx.reward_scale
        if self.budget is None:
            self._max_tokens = ctx.max_tokens
            self.budget = max(1, int(round(self.start_fraction * ctx.max_tokens)))
        self.history.append((ctx.step, self.budget))
        if isinstance(proposal, GroupSpecs) and proposal.untouched:  # a loader batch: its columns, budgets capped
            return GroupSpecs(proposal.prompt_id, proposal.n_samples, np.minimum(proposal.max_tokens, self.budget),
                              proposal.batch, proposal.members)
        return [dataclasses.replace(g, max_tokens=min(g.max_tokens, self.budget)) if g.max_tokens > self.budget else g
                for g in proposal]

    def select(self, groups, step):
        if self.truncation_penalty == 0:
            return groups
        penalty = self.truncation_penalty * self._scale.span
        if isinstance(groups, GroupBatch):  # the batch route's groups: a copy of the reward column, penalized
            cols = groups.columns
            reward = np.where(cols.finish_reason == LENGTH, cols.reward - penalty, cols.reward)
            return GroupBatch(dataclasses.replace(cols, reward=reward), groups.rows, groups.sizes)
        out = []
        for g in groups:
            if any(r.finish_reason == LENGTH for r in g.requests):
                members = [dataclasses.replace(r, reward=r.reward - penalty) if r.finish_reason == LENGTH else r
                           for r in g.requests]
                g = Group(g.prompt_id, g.step, members)
            out.append(g)
        return out

    def end_step(self, outcome):
        rewards = outcome.reward[~np.isnan(outcome.reward)].tolist()
        span = self._scale.span
        if not rewards or self.budget is None:
            return
        m = math.fsum(rewards) / len(rewards)
        self._reward = m if self._reward is None else self.ema * m + (1 - self.ema) * self._reward
        self._steps_at_level += 1
        if self._steps_at_level == 1:
            self._reference = self._reward
        if self.budget >= self._max_tokens or self._steps_at_level < self.min_steps:
            return
        rose = self._reward >= self._reference + self.reward_gain * span
        timed_out = self.max_steps is not None and self._steps_at_level >= self.max_steps
        if rose or timed_out:
            self.level += 1
            self.budget = min(self._max_tokens, int(round(self.budget * self.growth)))
            self._steps_at_level = 0
