"""An RL run's shape (`RunConfig`) and what it produced (`RunResult`): what the controller (lssim.loop.controller)
is given and gives back, the same in both worlds."""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from lssim.loop.rewards import RewardScale


@dataclass(slots=True)
class RunConfig:
    """The RL run's shape. A run ends after `steps` steps or once `total_groups` groups have trained (a recorded
    group that the recorded run left out of training counts as used: see `DataLoader.leave_out`)."""

    steps: int
    groups_per_step: int
    group_size: int
    max_tokens: int
    total_groups: int | None = None  # default: steps * groups_per_step (the same data for every policy)
    seed: int = 0
    reward_scale: RewardScale = RewardScale()  # the rewards' range, told to policies (a trace's own; a task's 0/1)

    def __post_init__(self):
        for name in ("steps", "groups_per_step", "group_size", "max_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"RunConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.total_groups is None:
            self.total_groups = self.steps * self.groups_per_step
        if isinstance(self.reward_scale, dict):  # a config read back from JSON (dataclasses.asdict writes one)
            self.reward_scale = RewardScale(**self.reward_scale)
        if not isinstance(self.reward_scale, RewardScale):
            raise ValueError(f"RunConfig.reward_scale must be a lssim.loop.rewards.RewardScale, got {self.reward_scale!r}")


@dataclass
class RunResult:
    """Everything a run produced, as pandas frames (one row per response, one row per step)."""

    policy: str
    responses: pd.DataFrame
    steps: pd.DataFrame
    meta: dict = field(default_factory=dict)
