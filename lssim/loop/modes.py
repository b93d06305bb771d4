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
  each response re-prefilled (prompt + its tokens so far) under the new weights, then continued. The trainer takes
  batches of B completed groups: groups completed beyond B in the same instant wait, whole, for the next batch
  (`groups_to_train`). A response is
  never dropped, so one long response can be trained more than K versions late (AReaL bounds admission, not
  tokens): `variant="areal"`. ROLL's async_generation_ratio also cancels groups older than the bound when a
  batch is taken (generate_scheduler.py gc): `variant="roll"` (the default) drops a group, and its tokens, once
  its oldest token would be more than K versions stale, so no trained token ever is.
- hybrid: RLinf's pipelined mode: finished groups stream into the trainer's micro-batches while the rollout goes
  on, weights are synced at the step's start (on-policy); with `elastic` the rollout devices join the update
  once the rollout ends (RLinf's auto-scheduler). The controller tells the mode of each group that ends during
  the rollout (`group_done`): the simulator prices the streaming (`_stream`); a real trainer takes the group
  into the step's update at once (`Trainer.feed`: its gradients accumulate; the optimizer step runs once the
  rollout ends).

Only the timing of training is world-specific, and the world supplies it as a `TrainJob`: a blocking phase is
`Engine.advance`d past (virtual time in the simulator, already spent on a real engine); one that overlaps the
rollout is a job beside it. The simulator's job (`TrainJob` here) is priced up front: its end is known, waiting
for it advances the virtual clock, its arrival is an `Engine.wake_at` timer and pushing its weights advances the
clock by the sync. A real trainer's job (real_backend.train_job.ThreadTrainJob, from `GRPOTrainer.start`) runs
on a thread beside vLLM: waiting joins it, its arrival is a wake from the engine when it finishes, and pushing
puts its weights into the idle engine. The modes below are written once over that protocol.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lssim.loop.contracts import Engine, ModeHooks, Trainer, TrainJob, TrainTiming
from lssim.loop.core import Group

MODES = ("collocated", "disaggregated", "async", "hybrid")
ASYNC_VARIANTS = ("roll", "areal")
_PHASES = ("logprob", "reference", "update", "sync", "switch")


class PricedTrainJob(TrainJob):
    """One step's training beside the rollout, as the simulator prices it: it runs on the train devices from
    `start` to `end` (world clock) and makes weights `version` = step + 1.

    The contract a mode uses (lssim.loop.contracts.TrainJob; a real trainer's job answers the same, real_backend.train_job):
    ready(engine) -- are its weights trained by now?     wait(engine) -- block until they are
    notify(engine) -- have the engine wake the controller (Event WAKE) once they are
    push(engine) -- put them into the idle rollout engine (here: the clock moves by the sync's seconds)
    `metrics`: what the trainer reported (the step row's trainer_* columns); here the priced phases."""

    __slots__ = ("step", "version", "start", "end", "phases", "metrics")
    groups = ()  # nothing kept: a real run prices a step with nothing to train this way, and re-runs it as empty

    def __init__(self, step: int, start: float, end: float, phases: dict, metrics: dict | None = None):
        if end < start:
            raise ValueError(f"PricedTrainJob of step {step}: end {end} before start {start}")
        self.step, self.version, self.start, self.end, self.phases = step, step + 1, start, end, phases
        self.metrics = metrics or {}

    def ready(self, engine: Engine) -> bool:
        return self.end <= engine.now()

    def wait(self, engine: Engine) -> None:
        engine.advance(max(0.0, self.end - engine.now()))

    def notify(self, engine: Engine) -> None:
        engine.wake_at(self.end)

    def push(self, engine: Engine) -> None:
        engine.advance(self.phases["sync"])


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


class ExecutionMode(ModeHooks):
    """The base mode: synchronous, on-policy and blocking: collocated, with no context switch (subclasses change a
    few answers). Every question and its synchronous answer is lssim.loop.contracts.ModeHooks; this prices the
    train phase and keeps the jobs whose weights are not on the engine yet."""

    def __init__(self, config: ModeConfig):
        self.config = config
        self.version = 0  # the weights version on the rollout engine now
        self._engine: Engine | None = None
        self._trainer: Trainer | None = None
        self._batch = 1  # the run's groups per step (B)
        self._lane_free = 0.0  # when the train devices are next free
        self._ready: list[TrainJob] = []  # jobs whose weights are not on the engine yet, by version

    def bind(self, engine: Engine, groups_per_step: int, trainer: Trainer | None = None) -> None:
        self._engine, self._batch, self._trainer = engine, groups_per_step, trainer

    # -- the train phase --------------------------------------------------------------------------------
    def train(self, metrics: dict, step: int, groups: list[Group], rollout_start: float, rollout_end: float,
              job=None, last: bool = False) -> TrainTiming:
        """Put step `step`'s training (priced or measured in `metrics`) on the world's clock. `job`: a real trainer's
        job already running beside the rollout (modes that `trains_beside` only; its times are known once it ends)."""
        phases = _phases(metrics)
        total = sum(phases.values())
        self._engine.advance(total)  # the simulator's clock moves; a real trainer has taken that long already
        self.version = step + 1
        busy = (phases["logprob"] + phases["reference"] + phases["update"]) * self.config.train_devices
        return TrainTiming(rollout_end, max(self._engine.now(), rollout_end + total), phases, busy)

    # -- helpers for the modes that train beside the rollout --------------------------------------------
    def _schedule(self, metrics: dict, ready_at: float, step: int, job=None, last: bool = False) -> TrainTiming:
        """Train on the train devices from when they and the batch are ready; the weights are ready at the end.
        A real trainer's `job` is already running (its own thread is the lane): its times come once it ends.
        The run's `last` step's job has no rollout beside it: it runs at its own speed on a shared host too."""
        if job is not None:
            self._ready.append(job)
            unknown = float("nan")
            return TrainTiming(ready_at, unknown, {p: unknown for p in _PHASES}, unknown)
        phases = _phases(metrics)
        start = max(ready_at, self._lane_free)
        compute = phases["logprob"] + phases["reference"] + phases["update"]
        # The driver's work at the step's end holds a trainer on its host first (a job still running is held as long:
        # this one starts as much later). Then begins + compute, unless the trainer shares the host with a rollout.
        begins = start + self._engine.driver_hold()
        end = begins + compute if last else self._engine.train_beside(begins, compute)
        self._lane_free = end
        self._ready.append(PricedTrainJob(step, start, end, phases, metrics))
        return TrainTiming(start, end, phases, compute * self.config.train_devices)

    # -- a checkpoint between steps (real_backend.checkpoint) -------------------------------------------
    def pending(self) -> list[TrainJob]:
        """The jobs whose weights are not on the engine yet, in version order (a checkpoint re-runs them)."""
        return list(self._ready)

    def resume_jobs(self, jobs: list[TrainJob]) -> None:
        """A resumed run's `pending` jobs, started again on its trainer, in version order."""
        self._ready = list(jobs)

    def _wait_for(self, version: int) -> None:
        """Block until weights `version` are trained, then sync them into the idle engine."""
        jobs = [j for j in self._ready if j.version <= version]
        if not jobs or self.version >= version:
            return
        for job in jobs:  # the simulator's clock moves to the last end; a real trainer's threads are joined
            job.wait(self._engine)
        self._ready = [j for j in self._ready if j.version > version]
        jobs[-1].push(self._engine)  # only the newest weights go into the engine
        self.version = version


class Collocated(ExecutionMode):
    """Rollout on every device, then training on the same devices (verl's default): fully synchronous."""


class Disaggregated(ExecutionMode):
    """R devices generate batch s+1 while T devices train on batch s (one step off-policy)."""

    trains_beside = True

    def before_rollout(self, step: int) -> None:
        self._wait_for(step - 1)  # rollout s needs train s-2's weights: exactly one version stale

    def train(self, metrics, step, groups, rollout_start, rollout_end, job=None, last=False):
        return self._schedule(metrics, rollout_end, step, job, last)


class Async(ExecutionMode):
    """The rollout never stops; the trainer takes each batch of B finished groups; weights arrive mid-generation."""

    keeps_generating = True
    interrupts = True
    trains_beside = True

    def admission(self, step, admitted_groups, default, limit):
        if step - self.version > self.config.staleness:  # its first tokens would already be too stale to train
            return 0
        capacity = (self.config.staleness + self.version + 1) * self._batch - admitted_groups  # AReaL's gate
        return max(0, min(capacity, limit))

    def rollout_done(self, state):
        return state.groups_done >= self._batch

    def groups_to_train(self):
        return self._batch  # what completed beyond a batch (in the same instant) trains in the next one

    def is_stale(self, step, first_version):
        return self.config.variant == "roll" and step - first_version > self.config.staleness

    def train(self, metrics, step, groups, rollout_start, rollout_end, job=None, last=False):
        timing = self._schedule(metrics, rollout_end, step, job, last)
        self._ready[-1].notify(self._engine)
        return timing

    def resume_jobs(self, jobs):
        super().resume_jobs(jobs)
        for job in jobs:  # each arrives mid-rollout, as when it was started
            job.notify(self._engine)

    def on_wake(self):
        """The jobs trained by now, in version order (a job's weights never overtake an older job's still running);
        the newest of them is pushed."""
        arrived = 0
        while arrived < len(self._ready) and self._ready[arrived].ready(self._engine):
            arrived += 1
        if not arrived:
            return None
        newest = self._ready[arrived - 1]
        self._ready = self._ready[arrived:]
        self.version = newest.version
        return newest


class Hybrid(ExecutionMode):
    """Finished groups stream into training on T devices while R devices roll out; on-policy (RLinf pipelined)."""

    trains_beside = True

    def before_rollout(self, step: int) -> None:
        self._wait_for(step)

    def group_done(self, group, step, trainer):
        trainer.feed(group, step)  # a real trainer computes its share of the update now; the simulator prices it below

    def train(self, metrics, step, groups, rollout_start, rollout_end, job=None, last=False):
        if job is not None:  # a real trainer's job: the groups it was fed are in; the rest and the optimizer step run now
            return self._schedule(metrics, rollout_end, step, job)
        phases = _phases(metrics)
        compute = phases["logprob"] + phases["reference"] + phases["update"]
        if not groups or compute <= 0:
            start = end = rollout_end
            busy = 0.0
        else:
            done, work = self._pieces(groups, step, compute, rollout_start, rollout_end)
            share = self._engine.streamed_share()  # None: the trainer has devices of its own
            if share is None:
                start, end, busy = _stream(done, work, rollout_end, self.config, phases["switch"])
            else:
                start, end, busy = _stream_shared(done, work, rollout_start, rollout_end, self.config, phases["switch"],
                                                  share, self._engine.driver_hold())
        self._ready.append(PricedTrainJob(step, start, end, phases, metrics))
        return TrainTiming(start, end, phases, busy)

    def _pieces(self, groups, step, compute, rollout_start, rollout_end) -> tuple[np.ndarray, np.ndarray]:
        """When each piece of the update is ready and its seconds on the train devices alone, in order: each group
        once it ends, priced by the trainer as a piece of its own (Trainer.price_streamed), then what is left of the
        update once every group is in; a trainer without that price: each group's share of `compute` by tokens."""
        done, tokens = _group_ends(groups, rollout_start, rollout_end)
        streamed = self._trainer.price_streamed(groups, step) if self._trainer is not None else None
        if streamed is None:
            work = compute * tokens / tokens.sum()
        else:  # the rest waits for the last piece
            done, work = np.append(done, done.max()), np.append(streamed.pieces, streamed.rest)
        order = np.argsort(done, kind="stable")
        return done[order], work[order]


def _group_ends(groups: list[Group], rollout_start: float, rollout_end: float) -> tuple[np.ndarray, np.ndarray]:
    """Each group's ready time (when its last member ended) and its tokens (prompt + response, every member)."""
    # A group with a member still carried (a bridged segment, Policy.bridge) is ready when the rollout stops it.
    from lssim.loop.columns import gather

    cols, sizes = gather(groups)
    starts = np.cumsum(sizes) - sizes
    # A member stopped or dropped by a policy has no finish time (NaN): the group is ready at its members' last one.
    last = np.fmax.reduceat(cols.finish_time, starts) if len(cols) else np.zeros(0)
    open_ = np.add.reduceat((cols.finish_reason == "").astype(np.int64), starts) > 0 if len(cols) else np.zeros(0, bool)
    done = np.where(open_, rollout_end, np.fmax(rollout_start, last))
    tokens = np.add.reduceat((cols.prompt_len + cols.generated).astype(float), starts) if len(cols) else np.zeros(0)
    return done, tokens


def _elastic_speedup(config: ModeConfig) -> float:
    """How much faster the update goes once the rollout's devices join it: (R + T) / T when elastic, else 1."""
    T = config.train_devices
    return (config.rollout_devices + T) / T if config.elastic else 1.0


def _drain(t: float, ready, work, join: float, speedup: float, train_devices: int) -> tuple[float, float]:
    """The train devices take each piece (`work` seconds alone) once it is `ready`, from `t` on; from `join` on the
    rollout devices help, `speedup` times faster. Returns (end, busy device-seconds)."""
    busy = 0.0
    for ready_at, w in zip(ready, work):
        t = max(t, float(ready_at))
        if t < join <= t + w and speedup > 1:  # the helpers arrive mid-way through this group
            before, after = join - t, (w - (join - t)) / speedup
            busy += before * train_devices + after * train_devices * speedup  # every device busy after the join
            t += before + after
            continue
        if t >= join:
            w /= speedup
        busy += w * (train_devices * speedup if t >= join else train_devices)
        t += w
    return t, busy


def _stream(done: np.ndarray, work: np.ndarray, rollout_end: float, config: ModeConfig,
            switch: float) -> tuple[float, float, float]:
    """The train devices take each piece (`work` seconds alone) once it is ready (`done`, in order); once the
    rollout ends, the rollout devices join (elastic) after their context switch and the rest goes (R + T) / T times
    faster. Returns (start, end, busy device-seconds)."""
    end, busy = _drain(float(done[0]), done, work, rollout_end + switch, _elastic_speedup(config), config.train_devices)
    return float(done[0]), end, busy


def _stream_shared(done: np.ndarray, work: np.ndarray, rollout_start: float, rollout_end: float, config: ModeConfig,
                   switch: float, share: tuple[float, float], hold: float = 0.0) -> tuple[float, float, float]:
    """_stream where the trainer shares the engine's host (Engine.streamed_share: `share` = (engine, piece)
    slow-downs while a piece runs beside the rollout). The rollout ran alone in `rollout_end - rollout_start`; it is
    replayed here against its pieces: while a piece runs, the rollout does 1 / engine of its work per second and the
    piece 1 / piece of its own; between pieces the rollout runs alone. Groups become ready at their point in the
    rollout's work, so one that finished later in it is ready later on the clock. The rollout's end moves out by
    what the pieces cost it, and the update ends no sooner (the job's end carries the loss onto the step; the step's
    rollout row keeps the engine's own seconds); what is left then runs as in _stream, `hold` seconds after that end
    (the driver's work at the step's end, Engine.driver_hold). Returns (start, end, busy device-seconds)."""
    engine_x, piece_x = share
    ready, span = done - rollout_start, rollout_end - rollout_start  # in seconds of the rollout's work
    wall = progress = beside = 0.0  # since the rollout's start: clock, the rollout's work done, the pieces' seconds
    left, nxt, first = 0.0, 0, None  # the running piece's work left (0: none), the next piece, the first's start
    while progress < span:
        if left == 0.0 and nxt < len(work) and ready[nxt] <= progress:
            left, nxt, first = float(work[nxt]), nxt + 1, wall if first is None else first
        elif left == 0.0:  # the engine alone until the next group is ready or the rollout ends
            until = min(float(ready[nxt]) if nxt < len(work) else span, span)
            wall, progress = wall + until - progress, until
        else:  # both: until the piece ends or the rollout does
            dt = min(left * piece_x, (span - progress) * engine_x)
            wall, beside = wall + dt, beside + dt
            progress = span if dt == (span - progress) * engine_x else progress + dt / engine_x
            left = 0.0 if dt == left * piece_x else left - dt / piece_x
    end_rollout = rollout_start + wall
    rest = ([left] if left > 0 else []) + [float(w) for w in work[nxt:]]  # all ready by now
    resume = end_rollout + hold  # the driver's work at the rollout's end holds the trainer first (Engine.driver_hold)
    end, busy = _drain(resume, [resume] * len(rest), rest, end_rollout + switch, _elastic_speedup(config),
                       config.train_devices)
    # the update trains the rollout's batch: it ends no sooner than the (slowed) rollout does
    return (rollout_start + first if first is not None else end_rollout), end, busy + beside * config.train_devices


def _phases(metrics: dict) -> dict:
    """The phase seconds a trainer reports (keys `<phase>_seconds`; a missing phase took no time)."""
    return {p: float(metrics.get(f"{p}_seconds", 0.0) or 0.0) for p in _PHASES}
