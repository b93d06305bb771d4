"""Execution modes: where rollout and training run, and how far the rollout may run ahead of the weights.

A mode is part of the world the controller runs in, beside the engine and the trainer (DESIGN.md, "The whole
step"). The controller asks it a few questions and the policy's hooks are asked exactly as before, so every
rollout policy composes with every mode (april under async, hadb under disaggregated, ...).

Versions: the weights after `j` train steps are version `j`; train step `s` (the update on step `s`'s groups)
makes version `s + 1`. A token generated under version `v` and trained at step `s` is `s - v` versions stale.

| mode | devices | rollout of step s starts | weights reach the engine | unfinished at the step's end |
|---|---|---|---|---|
| collocated | all, in turn | after train s-1 and the context switch | between steps | the policy carries or drops them |
| disaggregated | R roll out, T train | once train s-2's weights are synced | between steps: staleness exactly 1 | the policy carries or drops them |
| async K | R roll out, T train | at once; groups are admitted while admitted <= (K + v + 1) B | mid-generation: abort, re-prefill, continue | kept generating |
| hybrid | R roll out, T train, R join at the end | after train s-1 (on-policy) | between steps | the policy carries or drops them |

What each is, as read in the frameworks' code (commits in the README's "Execution modes"):
- collocated: verl's hybrid engine: vLLM sleeps (weights and KV dropped) while the actor trains, the actor's
  state is offloaded while vLLM generates; the switch both ways is a phase of its own (`TrainPhases.switch`).
- disaggregated: verl's one-step-off-policy recipe and slime's train_async.py: batch s+1 is generated while
  batch s trains; weights are synced only between batches, with nothing in flight.
- async: AReaL's interruptible rollout: new rollouts are admitted while the groups admitted so far are at most
  (K + v + 1) B (staleness_manager.py); when new weights arrive, generation is aborted, the KV cache dropped and
  each response re-prefilled (prompt + its tokens so far) under the new weights, then continued. A response is
  never dropped, so one long response can be trained more than K versions late (AReaL bounds admission, not
  tokens): `variant="areal"`. ROLL's async_generation_ratio also cancels groups older than the bound when a
  batch is taken (generate_scheduler.py gc): `variant="roll"` (the default) drops a group, and its tokens, once
  its oldest token would be more than K versions stale, so no trained token ever is.
- hybrid: RLinf's pipelined mode: finished groups stream into the trainer's micro-batches while the rollout goes
  on, weights are synced at the step's start (on-policy); with `elastic` the rollout devices join the update
  once the rollout ends (RLinf's auto-scheduler).

Only the timing of training is world-specific: a blocking phase is `Engine.advance`d past (virtual time in the
simulator, already spent on a real engine); one that overlaps the rollout is priced up front and its weights
arrive as an `Engine.wake_at` timer, which the simulator has and the real engine does not yet (so only
`collocated` runs on vLLM today).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .core import Engine, Group, RolloutState

MODES = ("collocated", "disaggregated", "async", "hybrid")
ASYNC_VARIANTS = ("roll", "areal")
_PHASES = ("logprob", "reference", "update", "sync", "switch")


@dataclass(slots=True, frozen=True)
class TrainTiming:
    """When a step's training ran on the world's clock, and what it cost, phase by phase."""

    start: float  # the train devices started on the step's groups
    end: float  # the new weights are ready (on the rollout engine for blocking modes)
    phases: dict  # seconds: logprob, reference, update, sync, switch
    busy_device_seconds: float  # device-seconds the update kept busy (train devices; rollout devices that joined)


@dataclass(slots=True)
class ModeConfig:
    """An execution mode and its device split (the CLI's --mode, --staleness, --rollout-devices, --train-devices).

    `rollout_devices` / `train_devices`: for collocated both are the cluster (the same devices take turns); for
    the others, disjoint groups. `staleness` (async): how many versions the rollout may run ahead of the weights.
    """

    mode: str = "collocated"
    rollout_devices: int = 8
    train_devices: int | None = None  # default: the rollout devices (collocated) or as many (the others)
    staleness: int = 1
    variant: str = "roll"  # async: "roll" drops groups that would train over the bound, "areal" never drops
    elastic: bool = True  # hybrid: rollout devices join the update once the rollout ends

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"unknown mode {self.mode!r}; known: {', '.join(MODES)}")
        if self.variant not in ASYNC_VARIANTS:
            raise ValueError(f"unknown async variant {self.variant!r}; known: {', '.join(ASYNC_VARIANTS)}")
        if self.train_devices is None:
            self.train_devices = self.rollout_devices
        for name in ("rollout_devices", "train_devices"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"ModeConfig.{name} must be an int >= 1, got {value!r}")
        if self.mode == "collocated" and self.train_devices != self.rollout_devices:
            raise ValueError(f"collocated: rollout and training share the devices; got {self.rollout_devices} rollout "
                             f"and {self.train_devices} train devices")
        if isinstance(self.staleness, bool) or not isinstance(self.staleness, int) or self.staleness < 1:
            raise ValueError(f"ModeConfig.staleness must be an int >= 1, got {self.staleness!r}")

    @property
    def devices(self) -> int:
        """Devices the run holds in all."""
        return self.rollout_devices if self.mode == "collocated" else self.rollout_devices + self.train_devices

    @property
    def collocated(self) -> bool:
        return self.mode == "collocated"

    def label(self) -> str:
        if self.mode == "collocated":
            return f"collocated {self.rollout_devices}"
        extra = f" K={self.staleness} {self.variant}" if self.mode == "async" else ""
        return f"{self.mode} {self.rollout_devices}+{self.train_devices}{extra}"

    def build(self) -> "ExecutionMode":
        return {"collocated": Collocated, "disaggregated": Disaggregated, "async": Async, "hybrid": Hybrid}[self.mode](self)


class ExecutionMode:
    """The questions the controller asks a mode. The base class is synchronous, on-policy and blocking:
    collocated, with no context switch (subclasses change a few answers)."""

    keeps_generating = False  # unfinished responses stay in flight across the step boundary
    interrupts = False  # weights arriving mid-rollout interrupt generation (abort, re-prefill, continue)

    def __init__(self, config: ModeConfig):
        self.config = config
        self.version = 0  # the weights version on the rollout engine now
        self._engine: Engine | None = None
        self._batch = 1  # the run's groups per step (B)
        self._lane_free = 0.0  # when the train devices are next free
        self._ready: list[tuple[float, int]] = []  # (time, version) of weights trained and not yet on the engine
        self._sync = 0.0  # seconds the last priced weight sync pauses the rollout engines for

    def bind(self, engine: Engine, groups_per_step: int) -> None:
        self._engine, self._batch = engine, groups_per_step

    # -- before and during the rollout ----------------------------------------------------------------
    def before_rollout(self, step: int) -> None:
        """Called when step `step` starts: wait (engine.advance, or a timer) until its weights may be used."""

    def admission(self, step: int, admitted_groups: int, default: int, limit: int) -> int:
        """Fresh groups to admit now (at the step's start, or when weights arrive mid-rollout): `admitted_groups`
        so far in the run (less those dropped), `default` what the step would take by itself, `limit` what the
        run has left to train."""
        return default

    def rollout_done(self, state: RolloutState) -> bool:
        """Must the rollout end now, whatever the policy says?"""
        return False

    def on_wake(self) -> float | None:
        """A timer went off: weights that were ready by now reach the engine. Returns the seconds the weight
        sync pauses generation for, or None if no new weights arrived."""
        return None

    def is_stale(self, step: int, first_version: int) -> bool:
        """Must a kept group whose oldest token is of `first_version` be dropped before step `step` trains?"""
        return False

    # -- the train phase --------------------------------------------------------------------------------
    def train(self, metrics: dict, step: int, groups: list[Group], rollout_start: float, rollout_end: float) -> TrainTiming:
        """Put step `step`'s training (priced or measured in `metrics`) on the world's clock."""
        phases = _phases(metrics)
        total = sum(phases.values())
        self._engine.advance(total)  # the simulator's clock moves; a real trainer has taken that long already
        self.version = step + 1
        busy = (phases["logprob"] + phases["reference"] + phases["update"]) * self.config.train_devices
        return TrainTiming(rollout_end, max(self._engine.now(), rollout_end + total), phases, busy)

    # -- helpers for the modes that train beside the rollout --------------------------------------------
    def _schedule(self, phases: dict, ready_at: float, step: int) -> TrainTiming:
        """Train on the train devices from when they and the batch are ready; the weights are ready at the end."""
        start = max(ready_at, self._lane_free)
        compute = phases["logprob"] + phases["reference"] + phases["update"]
        end = start + compute
        self._lane_free = end
        self._ready.append((end, step + 1))
        return TrainTiming(start, end, phases, compute * self.config.train_devices)

    def _wait_for(self, version: int) -> None:
        """Block until weights `version` are trained, then sync them into the idle engine."""
        ready = [t for t, v in self._ready if v <= version]
        if not ready or self.version >= version:
            return
        engine = self._engine
        engine.advance(max(0.0, max(ready) - engine.now()))
        self._ready = [(t, v) for t, v in self._ready if v > version]
        engine.advance(self._sync)
        self.version = version


class Collocated(ExecutionMode):
    """Rollout on every device, then training on the same devices (verl's default): fully synchronous."""


class Disaggregated(ExecutionMode):
    """R devices generate batch s+1 while T devices train on batch s (one step off-policy)."""

    def before_rollout(self, step: int) -> None:
        self._wait_for(step - 1)  # rollout s needs train s-2's weights: exactly one version stale

    def train(self, metrics, step, groups, rollout_start, rollout_end):
        phases = _phases(metrics)
        self._sync = phases["sync"]
        return self._schedule(phases, rollout_end, step)


class Async(ExecutionMode):
    """The rollout never stops; the trainer takes each batch of B finished groups; weights arrive mid-generation."""

    keeps_generating = True
    interrupts = True

    def admission(self, step, admitted_groups, default, limit):
        if step - self.version > self.config.staleness:  # its first tokens would already be too stale to train
            return 0
        capacity = (self.config.staleness + self.version + 1) * self._batch - admitted_groups  # AReaL's gate
        return max(0, min(capacity, limit))

    def rollout_done(self, state):
        return state.groups_done >= self._batch

    def is_stale(self, step, first_version):
        return self.config.variant == "roll" and step - first_version > self.config.staleness

    def train(self, metrics, step, groups, rollout_start, rollout_end):
        phases = _phases(metrics)
        self._sync = phases["sync"]
        timing = self._schedule(phases, rollout_end, step)
        self._engine.wake_at(timing.end)
        return timing

    def on_wake(self):
        now = self._engine.now()
        arrived = [v for t, v in self._ready if t <= now]
        if not arrived:
            return None
        self._ready = [(t, v) for t, v in self._ready if t > now]
        self.version = max(arrived)
        return self._sync


class Hybrid(ExecutionMode):
    """Finished groups stream into training on T devices while R devices roll out; on-policy (RLinf pipelined)."""

    def before_rollout(self, step: int) -> None:
        self._wait_for(step)

    def train(self, metrics, step, groups, rollout_start, rollout_end):
        phases = _phases(metrics)
        self._sync = phases["sync"]
        compute = phases["logprob"] + phases["reference"] + phases["update"]
        start, end, busy = _stream(groups, compute, rollout_start, rollout_end, self.config, phases["switch"])
        self._ready.append((end, step + 1))
        return TrainTiming(start, end, phases, busy)


def _stream(groups: list[Group], compute: float, rollout_start: float, rollout_end: float, config: ModeConfig,
            switch: float) -> tuple[float, float, float]:
    """The train devices take each group as it finishes (its share of the compute, by tokens); once the rollout
    ends, the rollout devices join (elastic) after their context switch and the rest goes (R + T) / T times
    faster. Returns (start, end, busy device-seconds)."""
    if not groups or compute <= 0:
        return rollout_end, rollout_end, 0.0
    # A group with a member still carried (a bridged segment, Policy.bridge) is ready when the rollout stops it.
    done = np.array([rollout_end if not all(r.done for r in g.requests) else max(rollout_start, max(r.finish_time for r in g.requests))
                     for g in groups])
    tokens = np.array([sum(r.prompt_len + r.generated for r in g.requests) for g in groups], dtype=float)
    order = np.argsort(done, kind="stable")
    work = compute * tokens[order] / tokens.sum()  # seconds on the train devices alone
    t, T = float(done[order][0]), config.train_devices
    speedup = (config.rollout_devices + T) / T if config.elastic else 1.0
    join = rollout_end + switch  # the rollout devices are free once they have switched to training
    busy = 0.0
    for ready, w in zip(done[order], work):
        t = max(t, float(ready))
        if t < join <= t + w and speedup > 1:  # the helpers arrive mid-way through this group
            w = (join - t) + (w - (join - t)) / speedup
        elif t >= join:
            w /= speedup
        busy += w * (T * speedup if t >= join else T)
        t += w
    return float(done[order][0]), t, busy


def _phases(metrics: dict) -> dict:
    """The phase seconds a trainer reports (keys `<phase>_seconds`; a missing phase took no time)."""
    return {p: float(metrics.get(f"{p}_seconds", 0.0) or 0.0) for p in _PHASES}
