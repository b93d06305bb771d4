"""A simulated engine on a shared host: engine instances, the trainer and the driver on the same cores.

    engine = SharedHostEngine(workload, cost, EngineConfig(n_instances=2, ...), slowdown=(0.99, 1.52))
    engine = SharedHostEngine(workload, cost, config, slowdown=(1.0,), training=TrainingShare(1.3, 1.6),
                              driver=DriverPrice(per_request=2e-4, per_finish=1e-4))

Why: SimEngine's instances are independent, and the trainer of a mode that trains beside the rollout has devices
of its own, as on GPUs. On a CPU host they share the cores, the front end that streams the tokens and the memory
bus: measured on a 2-core machine, an instance runs at about its profiled speed alone and ~1.5x slower while the
other is busy, the engine slower while a GRPO update runs on the trainer's thread beside it and the update slower
while the engine decodes, and the driver's own work (the controller, the policy, rewards, the submit calls) is time
the engine loses. The factors are measured on the host by `lssim profile` (real_backend/layout.py: the instances;
real_backend/host_sharing.py: the trainer beside the engine) and used only when the world says it is shared.

How:
- Instances (`slowdown`): every instance prices with the base model times slowdown[b - 1] (b: instances with a
  sequence running, at most len(slowdown) counted). When b changes (a submission, an abort, an event that empties
  or fills an instance), every busy instance is first brought to its last iteration boundary at the old speed, then
  its next event is priced again at the new one (the iteration in progress is priced at the new speed: off by at
  most one iteration per change).
- Training beside the rollout (`training`, a TrainingShare): a mode that trains beside the rollout asks
  `train_beside(start, seconds)` for its job's end. The job is priced as if the engine decoded throughout it
  (seconds x trainer_slowdown), and the engine runs engine_slowdown x slower from its start to that end, repriced
  at both boundaries as above. The approximation's bound: where the rollout ends before the job, the job's part
  past the rollout's end runs slowed though the engine is idle, so its end is late by at most
  (1 - 1 / trainer_slowdown) x that part; on this host's worlds the rollout (~1.3 s) outlasts the update. The run's
  last step's job has no rollout beside it: the mode does not ask, and it runs at its own speed (lssim.loop.modes).
- Training streamed in pieces (hybrid, `streamed_share`): each finished group's forward and backward runs on the
  trainer's thread while the rollout goes on, and the engine runs alone between pieces, so the whole update's
  factors over-price it (issue 37). The mode prices the pieces once the rollout has run (lssim.loop.modes
  `_stream_shared`): while a piece runs, the engine does 1 / engine_slowdown of its work per second and the piece
  1 / trainer_slowdown of its own, with TrainingShare.streamed's factors (the whole update's where the profile
  has none); the engine is slowed over the pieces' seconds only.
- The driver (`driver`, a DriverPrice): the caller's own seconds the engine loses, charged to the instances: per
  request submitted (a stall of the instance it lands on, before its next iteration), per token streamed (added to
  every decode iteration, n_seqs x per_token) and per finish (added to the re-pack of the boundary it leaves at);
  per step (`begin_step`), the clock moves on by the driver's seconds between steps before the mode's wait (the
  first step: by the run's start-up to its first rollout). Those seconds also hold a train job that runs then
  (`driver_hold`, with a trainer on the host): the modes start its work after them. Measured: hybrid's first piece
  after a rollout ran at 0.95-0.97 of the trainer profile's price with the driver's work beside it and at 0.66 (the
  alone level) with the controller held until the update ended: ~33 ms a step, the fitted per_step
  (`python -m paper.experiments.measure_driver_hold`).
  What the profile's cells already hold of the driver is in the cost model; a DriverPrice is the excess a run adds
  (real_backend.validate_modes fits it on the world's reference runs).
The batch route (lssim.sim.fastsim) prices instances apart, so this engine keeps every rollout on the event route;
speculation is not modelled on a shared host.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import Sequence

from lssim.cost.protocol import settle_iterations
from lssim.loop.cost_contracts import CostModel
from lssim.sim.world import SimEngine


def slowdown_problem(slowdown) -> str | None:
    """Why `slowdown` is not a host slow-down (None if it is): one finite factor > 0 per number of busy instances."""
    try:
        values = [float(v) for v in slowdown]
    except (TypeError, ValueError):
        return f"host slow-down must be a sequence of numbers (one per number of busy instances), got {slowdown!r}"
    if not values or not all(math.isfinite(v) and v > 0 for v in values):
        return f"host slow-down must be one finite factor > 0 per number of busy instances, got {slowdown!r}"
    return None


@dataclass(frozen=True, slots=True)
class TrainingShare:
    """Rollout and training on one host: the engine's times x `engine_slowdown` while a train job runs beside it,
    the job's x `trainer_slowdown` while the engine decodes (both measured by `lssim profile --shared-host`).
    `streamed`: the same two for an update streamed in pieces (hybrid: one finished group's forward and backward at
    a time, the engine alone between them), measured alike; None (a profile from before) prices the pieces with the
    whole update's factors (`for_pieces`)."""

    engine_slowdown: float
    trainer_slowdown: float
    streamed: "TrainingShare | None" = None

    def __post_init__(self):
        for name in ("engine_slowdown", "trainer_slowdown"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise ValueError(f"TrainingShare.{name} must be a finite number > 0, got {value!r}")
        if self.streamed is not None and (not isinstance(self.streamed, TrainingShare) or self.streamed.streamed is not None):
            raise ValueError(f"TrainingShare.streamed must be None or a TrainingShare of two factors, got {self.streamed!r}")

    def for_pieces(self) -> "TrainingShare":
        """The factors a streamed piece and the engine beside it are priced with: `streamed`, else the whole update's."""
        return self.streamed if self.streamed is not None else self


@dataclass(frozen=True, slots=True)
class DriverPrice:
    """The driver's seconds the engine loses: per request submitted, per token streamed, per response finished; and
    per step, the seconds between one step's weights and the next rollout's start (recording the step, planning the
    next), which delay that rollout while whatever still runs keeps running."""

    per_request: float = 0.0
    per_token: float = 0.0
    per_finish: float = 0.0
    per_step: float = 0.0
    first_step: float = 0.0  # the same gap before the engine's first step: the run's start up to its first rollout

    def __post_init__(self):
        for name in ("per_request", "per_token", "per_finish", "per_step", "first_step"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ValueError(f"DriverPrice.{name} must be a finite number >= 0, got {value!r}")


class ScaledCost(CostModel):
    """A cost model whose every time is `factor` times its base's."""

    def __init__(self, base, factor: float):
        self.base, self.scale = base, float(factor)

    def decode_time(self, n_seqs: int, ctx_tokens: float, n_iters: int) -> float:
        return self.scale * self.base.decode_time(n_seqs, ctx_tokens, n_iters)

    def iterations_within(self, n_seqs: int, ctx_tokens: float, seconds: float) -> int:
        # the base's answer for seconds / scale, settled against this model's own decode_time (the contract: the
        # largest k whose decode_time fits; the division can round it one off)
        estimate = self.base.iterations_within(n_seqs, ctx_tokens, seconds / self.scale)
        return settle_iterations(self.decode_time, n_seqs, ctx_tokens, seconds, estimate)

    def prefill_time(self, n_tokens: int) -> float:
        return self.scale * self.base.prefill_time(n_tokens)

    def departure_time(self, n_leaving: int) -> float:
        return self.scale * self.base.departure_time(n_leaving)

    def abort_time(self, n_aborted: int) -> float:  # the caller's, not the instances': not slowed by their sharing
        return self.base.abort_time(n_aborted)

    def resume_time(self, n_resumed: int) -> float:  # the front end's, measured on the shared host already
        return self.base.resume_time(n_resumed)

    def work_time(self, tokens: float, context_reads: float, max_num_seqs: int) -> float:
        return self.scale * self.base.work_time(tokens, context_reads, max_num_seqs)

    def factor(self, n_seqs: int) -> float:  # speculation's per-token factor: none here
        return 1.0

    def describe(self) -> dict:
        return {**self.base.describe(), "scaled_by": self.scale}


class DriverCost(ScaledCost):
    """ScaledCost plus the driver's per-token and per-finish seconds (DriverPrice; per request: the engine's)."""

    def __init__(self, base, factor: float, driver: DriverPrice):
        super().__init__(base, factor)
        self.driver = driver

    def decode_time(self, n_seqs: int, ctx_tokens: float, n_iters: int) -> float:
        return super().decode_time(n_seqs, ctx_tokens, n_iters) + self.driver.per_token * n_seqs * n_iters

    def iterations_within(self, n_seqs: int, ctx_tokens: float, seconds: float) -> int:
        hi = super().iterations_within(n_seqs, ctx_tokens, seconds)  # the driver only adds: an upper bound
        lo = 0
        while lo < hi:  # the largest k whose decode_time fits (monotone in k)
            mid = (lo + hi + 1) // 2
            if self.decode_time(n_seqs, ctx_tokens, mid) <= seconds:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def departure_time(self, n_leaving: int) -> float:
        return super().departure_time(n_leaving) + self.driver.per_finish * max(0, n_leaving)

    def describe(self) -> dict:
        return {**super().describe(), "driver": {"per_request": self.driver.per_request,
                                                 "per_token": self.driver.per_token, "per_finish": self.driver.per_finish,
                                                 "per_step": self.driver.per_step, "first_step": self.driver.first_step}}


class SharedHostEngine(SimEngine):
    """SimEngine whose instances, trainer and driver share one host (module docstring)."""

    def __init__(self, workload, cost, config=None, *args, slowdown: Sequence[float],
                 training: TrainingShare | None = None, driver: DriverPrice | None = None, **kwargs):
        problem = slowdown_problem(slowdown)
        if problem:
            raise ValueError(problem)
        kwargs["batch_route"] = False  # the batch route prices instances apart
        self._base_model = cost  # unscaled: every state's cost model wraps it
        super().__init__(workload, cost, config, *args, **kwargs)
        self.slowdown = tuple(float(v) for v in slowdown)
        self.training, self.driver = training, driver
        self._costs: dict[tuple[int, bool], CostModel] = {}
        self._spans: list[tuple[float, float]] = []  # train jobs beside the rollout: (start, end)
        self._boundaries: list[float] = []  # heap of their starts and ends not yet passed
        self._state = (1, False)  # (busy instances counted, a train job running)
        self._steps_begun = 0
        self.cost = self.base_cost = self._cost_for(self._state)

    def _cost_for(self, state: tuple[int, bool]) -> CostModel:
        if state not in self._costs:
            busy, training = state
            factor = self.slowdown[busy - 1] * (self.training.engine_slowdown if training else 1.0)
            self._costs[state] = (ScaledCost(self._base_model, factor) if self.driver is None
                                  else DriverCost(self._base_model, factor, self.driver))
        return self._costs[state]

    def set_speculation(self, speculation) -> None:
        if speculation is not None:
            raise ValueError("speculative decoding is not modelled on instances that share a host (SharedHostEngine)")

    def streamed_share(self) -> tuple[float, float] | None:
        """(engine, piece) slow-downs while a streamed piece runs beside the rollout (TrainingShare.for_pieces);
        None where the trainer has devices of its own."""
        if self.training is None:
            return None
        pieces = self.training.for_pieces()
        return pieces.engine_slowdown, pieces.trainer_slowdown

    def train_beside(self, start: float, seconds: float) -> float:
        """A train job of `seconds` (alone) from `start` beside the rollout: priced as if the engine decoded
        throughout it, and the engine slowed from its start to its end (module docstring, with the bound)."""
        if self.training is None:
            return super().train_beside(start, seconds)
        end = start + seconds * self.training.trainer_slowdown
        if end > start:
            self._spans.append((start, end))
            heapq.heappush(self._boundaries, start)
            heapq.heappush(self._boundaries, end)
        self._pass_boundaries(self.clock)
        return end

    def driver_hold(self) -> float:
        """The driver's seconds between steps, which hold a train job on this host (module docstring); 0 without a
        trainer on the host or a driver priced."""
        return self.driver.per_step if self.driver is not None and self.training is not None else 0.0

    def begin_step(self) -> None:
        if self.driver is not None:
            self.advance(self.driver.per_step if self._steps_begun else self.driver.first_step)
        self._steps_begun += 1

    def submit(self, requests) -> None:
        self._pass_boundaries(self.clock)
        super().submit(requests)  # (a resume's seconds, cost.resume_time, pass at the state before it: tens of ms)
        if self.driver is not None and self.driver.per_request and requests:
            stalled = {}
            for r in requests:  # the submit call's seconds, on the instance each request lands on
                stalled[r.ran_on] = stalled.get(r.ran_on, 0) + 1
            for idx, n in stalled.items():
                inst = self.instances[idx]
                if inst.n:
                    inst.owed += self.driver.per_request * n
                    self._schedule(inst)
        self._reprice(self.clock)

    def abort(self, r) -> None:
        self._pass_boundaries(self.clock)
        super().abort(r)
        self._reprice(self.clock)

    def abort_many(self, requests) -> None:  # each abort may change the host's state (and reprice): one by one
        for r in requests:
            self.abort(r)

    def next_events(self):
        self._pass_boundaries(self._next_time())
        out = super().next_events()
        self._reprice(self.clock)
        return out

    def _next_time(self) -> float:
        """When the next live event or timer is due (inf: none); stale instance entries are dropped."""
        events = self._events
        while events and events[0][3] != self.instances[events[0][2]].version:
            heapq.heappop(events)
        t = events[0][0] if events else math.inf
        return min(t, self._timers[0][0]) if self._timers else t

    def _pass_boundaries(self, until: float) -> None:
        """Every train job's start or end at or before `until`, in order, each repriced at its own time."""
        while self._boundaries and self._boundaries[0] <= until:
            self._reprice(heapq.heappop(self._boundaries))
            until = min(until, self._next_time())  # a reschedule may have moved the next event earlier

    def _training_at(self, t: float) -> bool:
        return any(s <= t < e for s, e in self._spans)

    def _reprice(self, at: float) -> None:
        """If the state changed (busy instances, a train job running at `at`): the busy instances to `at` at the
        old speed, then rescheduled at the new one."""
        busy = [inst for inst in self.instances if inst.n]
        state = (min(max(len(busy), 1), len(self.slowdown)), self.training is not None and self._training_at(at))
        if state == self._state:
            return
        for inst in busy:
            self._catch_up(inst, at)
        self._state = state
        self.cost = self.base_cost = self._cost_for(state)
        for inst in busy:
            self._schedule(inst)


__all__ = ["SharedHostEngine", "ScaledCost", "DriverCost", "DriverPrice", "TrainingShare", "slowdown_problem"]
