"""The objects passed between the controller, the policy and an engine.

One `Request` is one response being generated (a member of a prompt's group). The controller owns it;
an engine fills in what happened (tokens, finish reason, reward, times); a policy reads it. Engines in
both worlds -- the simulator and real vLLM -- implement the small `Engine` protocol at the bottom.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, Sequence

import numpy as np

# How a response ended. Every response ends in exactly one of these (or is carried to the next step).
STOP = "stop"  # ended by itself (EOS)
LENGTH = "length"  # hit its max_tokens budget
POLICY_STOP = "policy_stop"  # a policy stopped it; Request.stop_reason says why
ABORT = "abort"  # the rollout ended without it and the policy dropped it
FINISH_REASONS = (STOP, LENGTH, POLICY_STOP, ABORT)


@dataclass(slots=True)
class GroupSpec:
    """What a policy asks for one prompt: how many samples, with which budget, priority and placement."""

    prompt_id: int
    n_samples: int
    max_tokens: int
    priority: int = 0  # lower runs first, as in vLLM's priority scheduling
    instance: int | None = None  # pin to an engine instance; None lets the engine/placement decide

    def __post_init__(self):
        if self.n_samples < 1:
            raise ValueError(f"GroupSpec(prompt_id={self.prompt_id}): n_samples must be >= 1, got {self.n_samples}")
        if self.max_tokens < 1:
            raise ValueError(f"GroupSpec(prompt_id={self.prompt_id}): max_tokens must be >= 1, got {self.max_tokens}")


@dataclass(slots=True, eq=False)
class Request:
    """One response in flight. Policies must treat it as read-only (`check_policy` verifies this)."""

    rid: int
    group_id: int  # the group (one prompt's samples, submitted together) it belongs to
    step: int  # the step it was first submitted in
    prompt_id: int
    sample_idx: int
    prompt_len: int
    max_tokens: int  # budget for the whole response, tokens already generated included
    priority: int = 0
    instance: int | None = None
    seed: int = 0
    # filled in by the engine
    generated: int = 0  # tokens generated so far (a carried response resumes from here)
    finish_reason: str = ""
    stop_reason: str = ""
    reward: float = float("nan")
    submit_time: float = float("nan")  # seconds on the world's clock, for the latest submission
    first_token_time: float = float("nan")
    finish_time: float = float("nan")
    first_version: int = -1  # policy versions (steps) whose weights generated its tokens
    last_version: int = -1
    tokens_before_resume: int = 0  # tokens generated under older weights (off-policy after a carry)
    exact: bool = True  # simulator: replayed exactly from the trace (False: modelled)
    tokens: list[int] | None = None  # real world: generated token ids so far
    signals: dict = field(default_factory=dict)  # early-exit signals (world-specific), read by policies

    @property
    def done(self) -> bool:
        return self.finish_reason != ""


@dataclass(slots=True)
class Event:
    """Something an engine reports: a request finished, or passed a progress checkpoint."""

    kind: str  # "finished" or "progress"
    request: Request
    time: float


@dataclass(slots=True, frozen=True)
class InstanceLoad:
    """What placement rules may see of one engine instance."""

    running: int
    waiting: int
    pending_tokens: int  # sum over its unfinished requests of (max_tokens - generated): an upper bound of its work


@dataclass(slots=True, frozen=True)
class PromptPool:
    """The prompts a policy may choose from, as arrays (fast to filter and sort)."""

    prompt_id: np.ndarray
    prompt_len: np.ndarray

    def __len__(self) -> int:
        return len(self.prompt_id)


@dataclass(slots=True, frozen=True)
class StepContext:
    """What a policy sees when it plans a step."""

    step: int
    groups_per_step: int  # the run's nominal number of groups (prompts) per step
    group_size: int
    max_tokens: int
    groups_left: int  # groups the run may still train on (the run ends at zero)
    carried_groups: int  # groups carried over from the last step, resubmitted before the plan
    pool: PromptPool
    rng: np.random.Generator  # the policy's own generator, seeded by the run
    oracle_length: object = None  # simulator only: f(step, prompt_id, sample_idx, max_tokens) -> length; None in the real world


@dataclass(slots=True)
class RolloutState:
    """Counters of the rollout phase in progress, kept by the controller and read by policies."""

    step: int
    started: float
    now: float = 0.0
    groups_submitted: int = 0
    groups_done: int = 0  # groups whose every member has ended
    requests_in_flight: int = 0
    responses_done: int = 0
    extra_rounds: int = 0  # top-up rounds submitted after the first (DAPO-style)

    @property
    def elapsed(self) -> float:
        return self.now - self.started


@dataclass(slots=True)
class Group:
    """A prompt's group as it goes to training: its members and their rewards."""

    prompt_id: int
    step: int
    requests: list[Request]

    @property
    def rewards(self) -> np.ndarray:
        return np.array([r.reward for r in self.requests], dtype=float)

    @property
    def has_signal(self) -> bool:
        """GRPO learns nothing from a group whose rewards are all equal."""
        rewards = self.rewards
        return len(rewards) > 1 and float(rewards.max() - rewards.min()) > 0.0


class Engine(Protocol):
    """A rollout engine: N instances behind one dispatcher, simulated or real.

    The controller calls only these. `next_events` returns the next batch of events, advancing the
    clock (virtual time in the simulator, waiting on streams in the real world); it returns an empty
    list only when nothing is in flight.
    """

    n_instances: int

    def now(self) -> float: ...

    def submit(self, requests: Sequence[Request]) -> None: ...

    def abort(self, request: Request) -> None: ...

    def next_events(self) -> list[Event]: ...

    def loads(self) -> list[InstanceLoad]: ...

    def set_progress_interval(self, tokens: int | None) -> None: ...


class Trainer(Protocol):
    """The train phase: updates the policy weights from a batch of groups and syncs them to the engine.

    The world's clock advances by however long that takes (modelled in the simulator, real on vLLM).
    Returns metrics for the step's record (e.g. loss, train_seconds, sync_seconds).
    """

    def train(self, groups: list[Group], step: int) -> dict: ...
