"""The contracts: what every engine, trainer, train job, prompt source, step observer, policy and execution mode must
do, in one place; the cost-model contracts (CostModel, TrainCostModel, and price_each) live in
lssim.loop.cost_contracts.

Each is a class here; an implementation subclasses it explicitly, so what it leaves out it inherits: every OPTIONAL
ability is declared with its "unknown" (or "no opinion", or "cannot") answer as its body, and the controller and
the simulator call it without asking first whether it exists.

    Engine          rollout engine (lssim.sim.world.SimEngine, real_backend.engine.VLLMEngine)
    Trainer         the train phase (lssim.sim.trainer.SimTrainer, real_backend.trainer.GRPOTrainer)
    TrainJob        one step's training beside the rollout (lssim.loop.modes.PricedTrainJob,
                    real_backend.train_job.ThreadTrainJob)
    PromptSource    where a run's prompts come from (lssim.traces.workload.Workload, real_backend.prompts.TaskPrompts)
    StepObserver    told each step's row as the step completes (Controller.add_observer)
    PolicyHooks     a policy's hooks, each with "no opinion" (lssim.loop.policy.Policy implements composition)
    ModeHooks       the questions the controller asks an execution mode (lssim.loop.modes.ExecutionMode)
    TrainTiming     what a mode answers for a step's training

The data they exchange are lssim.loop.core (requests, events, groups) and lssim.loop.decisions (a policy's answers).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

import numpy as np

from lssim.loop.core import (Event, Group, GroupSpec, InstanceLoad, PromptPool, Request, RolloutState, Speculation,
                             StepContext, loader_key, loader_keys)
from lssim.loop.decisions import DROP, NO_NEEDS, Action, PolicyNeeds, StepOutcome, TrainBatch, TrainMask

__all__ = ["Engine", "Trainer", "TrainJob", "PromptSource", "OracleLength", "LengthFunction", "StepObserver",
           "PolicyHooks", "ModeHooks", "TrainTiming", "POLICY_HOOKS"]


# -- the world: engine, trainer, train job, prompts -------------------------------------------------------

class Engine(Protocol):
    """A rollout engine: N instances behind one dispatcher, simulated or real.

    The controller calls only these. `next_events` returns the next batch of events, advancing the
    clock (virtual time in the simulator, waiting on streams in the real world); it returns an empty
    list only when nothing is in flight. A WAKE event comes alone in its batch, and nothing that happened
    after it is applied to a request before the next call: the controller acts on it first (an async mode
    aborts what is in flight and resumes it under the new weights).

    Every engine has every method: those below are abilities an engine may lack, and an engine without one
    answers "unknown" (or refuses) explicitly rather than leaving the method out. The bodies here are those
    answers, so an engine that subclasses `Engine` inherits them:

    - `counterfactual(request)`: (length, reward) the response would have had had no policy stopped it;
      None where the engine cannot tell (the real world). The controller records it as natural_len /
      natural_reward (-1 / NaN for None).
    - `utilization()`: (busy seconds, sequence-seconds) summed over instances since the engine started; NaNs
      where the engine cannot tell. The controller turns the step's difference into busy_fraction and
      mean_running.
    - `set_speculation(speculation)`: called once by the controller before the first step with the policy's
      `PolicyNeeds.speculation` (None too); an engine that cannot speculate accepts None and raises ValueError
      otherwise.
    - `set_batch_rollout(on)` / `run_batch(requests)`: called once before the first step; on=True promises that
      each rollout is one submission run to its end with no reaction, abort or other submission (no per-event
      policy hook, a mode that never cuts a rollout short). An engine that can (the simulator, lssim.sim.fastsim)
      answers True and then takes each rollout whole, as columns, through run_batch; an engine that streams
      (vLLM) answers False and the controller keeps submitting and draining events.
    - `wake_at(time)` / `wake_when(future)`: timers for the execution modes; an engine without them refuses.
    - `spec_counters()` / `reset_spec_counters()`: the engine's speculative-decoding counters (vLLM's); None where
      the engine counts none. `driver_seconds(start, end)`: the caller's own share of a span; None unknown.
    - `begin_step()`: called as each step starts, before the mode's wait for weights (the driver's own seconds
      between steps, where a simulated host prices them).
    - `train_beside(start, seconds)`: when a priced train job beside the rollout ends; start + seconds unless the
      engine shares its host with the trainer. `streamed_share()`: the engine's and a streamed piece's slow-downs
      while both run (hybrid); None on devices of their own. `driver_hold()`: the seconds the driver's work at a
      step's end holds a train job on the host they share; 0 where they do not.
    """

    n_instances: int

    def now(self) -> float: ...

    def submit(self, requests: Sequence[Request]) -> None: ...

    def abort(self, request: Request) -> None: ...

    def abort_many(self, requests: Sequence[Request]) -> None:
        """Abort each of `requests`, in order, exactly as `abort` one by one would (an engine may do it at once where
        the result is the same: the simulator prices each instance's next event once)."""
        for request in requests:
            self.abort(request)

    def next_events(self) -> list[Event]: ...

    def loads(self) -> list[InstanceLoad]: ...

    def set_progress_interval(self, tokens: int | None) -> None: ...

    def advance(self, seconds: float) -> None:
        """The world is busy outside the engine for `seconds` (a blocking train phase, a weight sync with
        generation paused): virtual time passes in the simulator; on a real engine that work has already taken
        its time, so nothing happens. The one place the two clocks differ, as in SimPy's RealtimeEnvironment."""
        ...

    def wake_at(self, time: float) -> None:
        """Report an Event(WAKE, None, t) from next_events once the clock reaches `time` (t >= time), even with
        nothing in flight: the execution modes' timer (new weights arriving mid-rollout, the end of a wait)."""
        raise NotImplementedError(f"{type(self).__name__} has no timers: this execution mode needs them")

    def wake_when(self, future) -> None:
        """Report an Event(WAKE, None, t) from next_events once `future` (a concurrent.futures.Future: a real train
        job on its own thread, real_backend.train_job) is done: a timer whose time is not known in advance."""
        raise NotImplementedError(f"{type(self).__name__} cannot wake on a future: this execution mode needs it")

    def begin_step(self) -> None:
        """The driver's own work between one step's weights and the next rollout (recording the step, its
        observers, planning the next) has taken its time: nothing to do on a real engine. A simulated host that
        prices the driver (lssim.sim.shared_host, DriverPrice.per_step) lets that time pass here."""

    def train_beside(self, start: float, seconds: float) -> float:
        """When a train job that takes `seconds` on devices of its own, started at `start` beside the rollout,
        ends (the simulator's priced job, lssim.loop.modes). Independent devices: start + seconds. An engine that
        shares its host with the trainer (lssim.sim.shared_host) slows the job and itself over their overlap."""
        return start + seconds

    def streamed_share(self) -> tuple[float, float] | None:
        """(engine, piece): how many times slower the engine and a streamed train piece (hybrid: one finished group's
        forward and backward, lssim.loop.modes) run while both do. None: the trainer has devices of its own. An engine
        that shares its host with the trainer (lssim.sim.shared_host) answers its measured factors."""
        return None

    def driver_hold(self) -> float:
        """How long the driver's own work at a rollout's end (recording the step, planning the next) holds a train
        job that runs then: 0 on devices of their own or a real engine (its jobs take what they take). A simulated
        host that prices the driver (lssim.sim.shared_host) answers DriverPrice.per_step."""
        return 0.0

    def spec_counters(self) -> dict | None:
        """Speculative-decoding counters since the last reset (drafts, draft_tokens, accepted_tokens, steps,
        generation_tokens: real_backend.spec_stats); None: the engine counts none."""
        return None

    def reset_spec_counters(self) -> None:
        """Start the counters of `spec_counters` from zero (nothing to do where there are none)."""

    def driver_seconds(self, start: float, end: float) -> float | None:
        """Seconds of [start, end] on the engine's clock the caller's thread worked instead of waiting for the
        engine (its own share of a rollout, real_backend's VLLMEngine); None where the engine cannot tell."""
        return None

    def refresh(self, requests: Sequence[Request]) -> None:
        """Bring running requests' `generated` up to the clock (an engine that streams tokens keeps it current)."""

    def counterfactual(self, request: Request) -> tuple[int, float] | None:
        return None

    def utilization(self) -> tuple[float, float]:
        return float("nan"), float("nan")

    def set_speculation(self, speculation: Speculation | None) -> None:
        if speculation is not None:
            raise ValueError(f"a policy asks for speculative decoding ({speculation}), which {type(self).__name__} "
                             f"cannot do")

    def score_partial(self, request) -> float:
        """The reward of what a stopped response wrote so far (an early exit trains with it)."""
        raise ValueError(f"{type(self).__name__} cannot score a partial response")

    def set_signals(self, names: frozenset[str]) -> frozenset[str]:
        """The early-exit signals a policy reads at progress events (lssim.loop.signals: "repetition", "entropy"),
        asked once before the first step. Only what is asked is put in Request.signals (none asked: none computed).
        Returns those the engine cannot give where the run was told to go on without them (they stay absent from
        Request.signals); otherwise an engine that cannot give one refuses."""
        if names:
            raise ValueError(f"it reads the signals {', '.join(sorted(names))}, which {type(self).__name__} "
                             f"does not compute")
        return frozenset()

    def set_batch_rollout(self, on: bool) -> bool:
        """The controller's promise that rollouts need no per-event reaction. Returns True if the engine will then
        take each rollout whole through `run_batch` (the simulator); an engine that streams ignores it (False)."""
        return False

    def run_batch(self, requests, queue=None, progress=None) -> np.ndarray:
        """A whole rollout at once (only after set_batch_rollout returned True): every request of `requests`
        (lssim.loop.columns.RequestColumns, an idle engine) runs to its end; the columns are filled as the event route
        fills Request objects (generated, finish_reason, reward, times, exact, natural_len / natural_reward), the
        clock moves to the last finish, and the rows come back in the order the event route would end them.
        `queue`: the rows in submission order, where that is not row order (None: row order). `progress`: the
        policy's stops at its progress checkpoints (Policy.progress_stops), asked with the submission's checkpoints."""
        raise NotImplementedError(f"{type(self).__name__} streams events: it has no batch rollout")

    def set_requeue_rollout(self, on: bool) -> bool:
        """The controller's promise that a rollout is one submission whose only reactions to single events are
        requeues at progress checkpoints by seer's rules, answered for the whole submission (Policy.progress_requeues).
        Returns True if the engine then takes each rollout whole through `run_batch`, with the policy's
        progress_requeues as `progress` (the simulator); an engine that streams ignores it (False)."""
        return False

    def set_cut_rollout(self, on: bool) -> bool:
        """The controller's promise that a rollout reacts to no single event but where the policy's end_rollout, asked
        over the whole schedule (Policy.end_rollout_at), ends it, or where its on_progress carries responses, asked
        for the whole submission (Policy.progress_carries). Returns True if the engine then takes each submission
        through `run_cut` (the simulator); an engine that streams ignores it (False)."""
        return False

    def run_cut(self, requests, columns, cut_at=None, carry_at=None):
        """A submission (`columns`: lssim.loop.columns.RequestColumns, in the order queued, an idle engine; filled in
        place as the batch route fills them, natural_len / natural_reward as `counterfactual` answers: the books read
        them; `requests`: its lssim.loop.cut_books.RowRequests, a Request object per row, made when asked for)
        scheduled whole and, given `cut_at`, cut at the boundary `cut_at(progress)` names
        (lssim.loop.rollout_cut.RolloutProgress; -1: none): the rows ended by then, in the order the event route ends
        them; the rest stay in flight as the event route leaves them there (their objects made; abort them as usual).
        Given `carry_at` instead (`carry_at(checkpoints)`, where each response is carried), it runs until every
        response ended or was carried, and returns the rows in the order they left; a carried one has its object made,
        not ended, with its tokens so far and the carry's reason (stop_reason), out of the engine as an abort leaves it.
        Every object made (before or during the run) is filled as the event route fills it. None: the engine could
        not, nothing ran (submit them instead)."""
        raise NotImplementedError(f"{type(self).__name__} streams events: it has no cut rollout")


class TrainJob(Protocol):
    """One step's training beside the rollout (execution modes that `trains_beside`): it makes weights `version`
    (= step + 1). The simulator's is priced up front (lssim.loop.modes.PricedTrainJob); a real trainer's runs on a
    thread (real_backend.train_job.ThreadTrainJob). `start` / `end`: when it ran on the world's clock (NaN while
    unknown); `metrics`: what the trainer reported (the step row's trainer_* columns); `groups`: what it trains, kept
    where a checkpoint may re-run it (real_backend.checkpoint; empty otherwise)."""

    step: int
    version: int
    start: float
    end: float
    metrics: dict
    groups: Sequence[Group]

    def ready(self, engine: Engine) -> bool:
        """Are its weights trained by now?"""
        ...

    def wait(self, engine: Engine) -> None:
        """Block until they are (the simulator's clock moves; a real job is joined, its error raised)."""
        ...

    def notify(self, engine: Engine) -> None:
        """Have the engine report Event(WAKE) once they are (Engine.wake_at, Engine.wake_when)."""
        ...

    def push(self, engine: Engine) -> None:
        """Put its weights into the idle rollout engine."""
        ...


class Trainer(Protocol):
    """The train phase: updates the policy weights from a batch of groups and syncs them to the engine.

    The world's clock advances by however long that takes (modelled in the simulator, real on vLLM). `train`
    returns metrics for the step's record (e.g. loss, train_seconds, sync_seconds). Optional abilities:

    - `set_train_mask(hook)`: ask `hook` (a policy's train_mask) which tokens each step trains. Returns False
      where the trainer cannot (the controller then refuses a policy that needs it).
    - `start(groups, step)`: the same update as a job running beside the rollout (a TrainJob), for the modes that
      train beside it; None where the trainer cannot (the controller then calls `train`, which prices or blocks).
      `started_jobs()`: the jobs started so far, in order ([] for a trainer that starts none); `finish_jobs()`: wait
      for them all (a run's end).
    - `feed(group, step)`: step `step`'s update takes a group that ended mid-rollout now (hybrid streams them,
      ModeHooks.group_done); `start(groups, step)` then finishes it with the step's batch, the same update as
      unstreamed. Nothing where the trainer cannot stream (the simulator prices the streaming instead).
    - `price_streamed(groups, step)`: a simulated trainer's price of that streamed update, one piece per group
      (an lssim.sim.train_batches.StreamedUpdate); None where it has none (a real trainer streams for real): the
      mode then shares the whole update's price among the groups by tokens.
    """

    def train(self, groups: list[Group], step: int) -> dict: ...

    def set_train_mask(self, hook) -> bool:
        return False

    def start(self, groups: list[Group], step: int) -> TrainJob | None:
        return None

    def feed(self, group: Group, step: int) -> None:
        """Nothing streams: the update takes the step's groups at `start` or `train`."""

    def price_streamed(self, groups: list[Group], step: int):
        return None

    def started_jobs(self) -> list[TrainJob]:
        return []

    def finish_jobs(self) -> None:
        """Nothing runs beside the rollout: nothing to wait for."""


class OracleLength:
    """Every response's true length before it is generated (`StepContext.oracle_length`; the simulator's
    lssim.traces.workload.OracleLengths). A world that cannot know lengths gives None instead. A base class, not a
    Protocol: the controller wraps a plain function in `LengthFunction`, and implementations inherit the defaults."""

    def __call__(self, step: int, prompt_id: int, sample_idx: int, max_tokens: int) -> int:
        """The length the response (step, prompt, sample) would reach under `max_tokens`."""
        raise NotImplementedError

    def many(self, step: np.ndarray, prompt_id: np.ndarray, sample_idx: np.ndarray, max_tokens: np.ndarray) -> np.ndarray:
        """`__call__` over arrays; by default one by one."""
        return np.fromiter((self(*k) for k in zip(step.tolist(), prompt_id.tolist(), sample_idx.tolist(),
                                                  max_tokens.tolist())), np.int64, len(step))

    def key(self, request: Request) -> tuple[int, int]:
        """The (step, sample) to ask for `request` by; by default its loader batch's (lssim.loop.core.loader_key)."""
        return loader_key(request)

    def keys(self, requests) -> tuple[np.ndarray, np.ndarray]:
        """`key` of every request of columns (lssim.loop.columns.RequestColumns)."""
        return loader_keys(requests)


class LengthFunction(OracleLength):
    """A plain function of (step, prompt_id, sample_idx, max_tokens) as an OracleLength (tests, notebooks)."""

    def __init__(self, length):
        self.length = length

    def __call__(self, step: int, prompt_id: int, sample_idx: int, max_tokens: int) -> int:
        return self.length(step, prompt_id, sample_idx, max_tokens)


class PromptSource(Protocol):
    """Where prompts come from: the trace's own prompts (simulator) or a task's dataset (real)."""

    pool: PromptPool

    def default_groups(self, step: int, n_groups: int, group_size: int, max_tokens: int) -> Sequence[GroupSpec]:
        """What a policy with no opinion trains on at `step` (verl's default: a random batch; a trace's Workload:
        the batch it recorded at that step, with its own group sizes and budgets).

        The controller asks for each step's batch once, steps in increasing order, always with the run's
        `groups_per_step`, and proposes it whole, less the groups carried in (see `DataLoader.proposal_size`
        and `DataLoader.take`, lssim.loop.loader)."""
        ...

    def prompt_len(self, prompt_id: int) -> int:
        """A prompt's length in tokens."""
        ...

    def prompt_lens(self, prompt_ids: np.ndarray) -> np.ndarray:
        """The lengths of many prompts (the controller asks once a step); by default `prompt_len` one by one."""
        return np.fromiter(map(self.prompt_len, prompt_ids.tolist()), np.int64, len(prompt_ids))

    def loader_state(self) -> dict:
        """Where the source's own cursor is (a checkpoint keeps it); {} for a source with none."""
        return {}

    def set_loader_state(self, state: dict) -> None:
        """Put back a `loader_state`; a source with no cursor takes only {}."""
        if state:
            raise ValueError(f"{type(self).__name__} keeps no loader state, got {sorted(state)}")


class StepObserver(Protocol):
    """Told each step's row (lssim.loop.step_row.step_row) as the step completes, after the controller has recorded
    it (Controller.add_observer): progress bars, a real run's recorder, its checkpoints."""

    def __call__(self, row: dict) -> None: ...


# -- policies and execution modes -------------------------------------------------------------------------

class PolicyHooks:
    """A policy's hooks and declarations, each answering "no opinion" (lssim.loop.policy's docstring: when the
    controller asks each and how compositions combine them). lssim.loop.policy.Policy subclasses this and adds
    composition; a policy subclasses Policy and overrides a few."""

    name = "baseline"
    progress_interval: int | None = None  # ask on_progress every this many tokens (None: never)

    def needs(self) -> PolicyNeeds:
        """What this policy needs of the world (PolicyNeeds); the default needs nothing."""
        return NO_NEEDS

    def plan(self, ctx: StepContext, proposal: Sequence[GroupSpec]) -> Sequence[GroupSpec]:
        # The proposal is a read-only sequence (a loader batch as columns, lssim.loop.core.GroupSpecs, or a list): return
        # it, a slice of it, or a list of your own; `proposal + ctx.draw(n)` is such a sequence too.
        return proposal

    def priority(self, request: Request) -> int | None:
        return None

    def place(self, request: Request, loads: list[InstanceLoad]) -> int | None:
        return None

    def priorities(self, requests) -> np.ndarray:
        """`priority` of every request of a submission (lssim.loop.columns.RequestColumns), a request's own priority
        where the policy has no opinion."""
        return np.array([r.priority if (p := self.priority(r)) is None else p for r in requests.to_requests()], np.int64)

    def placements(self, requests, loads: list[InstanceLoad]) -> np.ndarray:
        """`place` of every request of a submission, in its order (priority order); a request's own instance (-1:
        the engine's dispatcher) where the policy has no opinion."""
        out = requests.instance.copy()
        for i, r in enumerate(requests.to_requests()):
            choice = self.place(r, loads)
            if choice is not None:
                out[i] = choice
        return out

    def on_progress(self, request: Request, state: RolloutState) -> Action | None:
        return None

    def on_finish(self, request: Request, state: RolloutState) -> None:
        return None

    def end_rollout(self, state: RolloutState) -> bool:
        return False

    def top_up(self, state: RolloutState) -> list[GroupSpec]:
        return []

    def on_unfinished(self, request: Request) -> str:
        return DROP

    def select(self, groups: list[Group], step: int) -> list[Group]:
        return groups

    def end_step(self, outcome: StepOutcome) -> None:
        return None

    def bridge(self, open_groups: list[Group], step: int) -> list[Group]:
        """Groups to train now although some members are still carried (open: waiting for them): copies whose
        members' rewards are what the trainer takes as each one's return (a carried member's: a bootstrapped value).
        Which of their tokens are trained is this policy's `train_mask`; none: nothing is bridged."""
        return []

    def run_notes(self) -> dict:
        """What the policy reports about the run so far, for a real run's meta.json (policies/tlt.py: its per-step
        speculation decisions); none by default. Not combined by Compose."""
        return {}

    def ran_blind(self) -> str | None:
        """Why this policy could not act in the run so far: a sentence naming what it lacked (hadb: prompts seen
        again; lpt: a prompt's own past lengths), or None when it could. Asked once a run's result is made, so a
        replay that ran as the baseline says why rather than showing a tie (lssim.analysis.replay's `ran_blind`)."""
        return None

    def train_mask(self, batch: TrainBatch) -> TrainMask | None:
        """Which of `batch`'s tokens are trained (TrainMask); None: all of them. Asked once per step by the trainer,
        after `select`, before the log-prob recompute and the update, so what is pruned is never computed."""
        return None


# The hooks a composition (lssim.loop.policy.Compose) combines, each by its rule.
POLICY_HOOKS = ("plan", "priority", "place", "on_progress", "on_finish", "end_rollout", "top_up", "on_unfinished", "select",
                "end_step", "bridge", "train_mask")


@dataclass(slots=True, frozen=True)
class TrainTiming:
    """When a step's training ran on the world's clock, and what it cost, phase by phase."""

    start: float  # the train devices started on the step's groups
    end: float  # the new weights are ready (on the rollout engine for blocking modes)
    phases: dict  # seconds: logprob, reference, update, sync, switch
    busy_device_seconds: float  # device-seconds the update kept busy (train devices; rollout devices that joined)


class ModeHooks:
    """The questions the controller asks an execution mode (lssim.loop.modes), each with the synchronous, on-policy,
    blocking answer; lssim.loop.modes.ExecutionMode subclasses this and prices the train phase."""

    keeps_generating = False  # unfinished responses stay in flight across the step boundary
    interrupts = False  # weights arriving mid-rollout interrupt generation (abort, re-prefill, continue)
    trains_beside = False  # training runs beside the rollout (a trainer's `start` runs it as a job)
    version = 0  # the weights version on the rollout engine now

    def bind(self, engine: Engine, groups_per_step: int, trainer: Trainer | None = None) -> None:
        """The run's engine, its groups per step and its trainer (None: a mode priced without one, in tests), given
        once before the first step."""

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

    def on_wake(self) -> TrainJob | None:
        """A timer went off: weights that were ready by now are taken for the engine. Returns the job whose weights
        the controller pushes (`job.push(engine)`, once nothing is in flight), or None if no new weights arrived."""
        return None

    def group_done(self, group: Group, step: int, trainer: Trainer) -> None:
        """A group of step `step`'s rollout ended (every member) while the rollout goes on. A mode that streams
        groups into training (hybrid) hands it to `trainer.feed`; the others wait for the rollout's end."""

    def groups_to_train(self) -> int | None:
        """At most this many of a step's completed groups train in it (async: batches of B); the last to complete
        wait, whole, for the next step, and count as done in its rollout. None: every completed group trains."""
        return None

    def is_stale(self, step: int, first_version: int) -> bool:
        """Must a kept group whose oldest token is of `first_version` be dropped before step `step` trains?"""
        return False

    def train(self, metrics: dict, step: int, groups: list[Group], rollout_start: float, rollout_end: float,
              job: TrainJob | None = None, last: bool = False) -> TrainTiming:
        """Put step `step`'s training (priced or measured in `metrics`) on the world's clock. `job`: a real trainer's
        job already running beside the rollout (modes that `trains_beside` only; its times are known once it ends).
        `last`: the run's last step, so no rollout runs beside this training (a shared host does not slow it).
        Every mode answers this one."""
        raise NotImplementedError(f"{type(self).__name__} does not put training on the clock")
