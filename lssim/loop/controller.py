"""The rollout controller: runs synchronous RL steps, asks the policy, commands an engine.

Written once for both worlds. It sees an `Engine` (simulated or vLLM), a `Trainer` (a time model or a
torch GRPO trainer) and a `PromptSource` (a trace's prompts or a task's dataset); it never learns which.

A step: plan the groups (carried responses first), submit, react to events until the rollout ends,
settle what is still running (carry or drop), train on the finished groups, let the policy remember.
The books balance at every step: every response that entered the step ended in it or was carried out.
The books themselves -- a step's state while it runs, the rows it leaves behind -- are lssim.loop.records; the
rollout's entries in them (requests registered, responses ended, the batch route's rollout) lssim.loop.rollout_books.
"""

from __future__ import annotations

import itertools
from typing import Callable, Iterable, Sequence

import numpy as np
import pandas as pd

from lssim.loop.contracts import Engine, LengthFunction, ModeHooks, OracleLength, PromptSource, StepObserver, Trainer
from lssim.loop.core import (ABORT, FINISHED, POLICY_STOP, WAKE, Group, GroupSpec, Request, RolloutState, StepContext,
                             note_resume)
from lssim.loop.decisions import CARRY
from lssim.loop.loader import DataLoader
from lssim.loop.modes import ExecutionMode, ModeConfig
from lssim.loop.policy import Policy
from lssim.loop.columns import RequestColumns, gather, rids_of
from lssim.loop.plan_columns import plan_requests
from lssim.loop.closed_books import HeldRows, close_step, held_rows, with_rows
from lssim.loop.row_requests import CarriedRows
from lssim.loop.records import LowerBound, ResponseTable, StepBooks, StepEnd, StepState
from lssim.loop.step_row import mode_fields, step_outcome, step_row
from lssim.loop.cut_books import rollout_cut, settle_rows
from lssim.loop.rollout_books import (carry_out, defer_last_completed, drop_stale, end_response, order, register,
                                      rollout_batch)
from lssim.loop.run_config import RunConfig, RunResult  # noqa: F401  (imported from here by most callers)


class Controller:
    """One run: a policy over an engine and a trainer, step by step. Every counter and generator belongs to
    the run (the same seed gives the same result); what a step tracks while it runs is its `StepState`."""

    def __init__(self, engine: Engine, trainer: Trainer, prompts: PromptSource, policy: Policy, config: RunConfig,
                 lower_bound: LowerBound | None = None, oracle_length: OracleLength | None = None, mode: ExecutionMode | None = None):
        self.engine, self.trainer, self.prompts, self.policy, self.config = engine, trainer, prompts, policy, config
        # Where rollout and training run and how far the rollout runs ahead of the weights (lssim.loop.modes); the
        # default is the synchronous, collocated step.
        self.mode = mode or ModeConfig(rollout_devices=engine.n_instances).build()
        self.mode.bind(engine, config.groups_per_step, trainer)
        self.lower_bound = lower_bound
        # A plain length function is wrapped in the contract, so a policy asks every oracle the same way.
        self.oracle_length = oracle_length if oracle_length is None or isinstance(oracle_length, OracleLength) \
            else LengthFunction(oracle_length)
        self._observers: list[StepObserver] = []  # told each step's row as it completes (add_observer)
        self.rng = np.random.default_rng(config.seed)
        self.policy_rng = np.random.default_rng([config.seed, 1])
        self._next_rid = 0
        self._next_group = 0
        self._carried: list[Request] | CarriedRows = []  # unfinished responses waiting for the next step
        self._carried_rows: RequestColumns | None = None  # ... as the last step closed them, in order (None: unknown)
        self._kept: dict[int, Request] = {}  # unfinished responses still generating across the step boundary (async)
        self._admitted = 0  # groups submitted so far, less those dropped as stale (the async admission gate)
        self._last_end = engine.now()  # when the last step's training ended (its weights were ready)
        self._waiting_groups: dict[int, list[Request]] = {}  # carried groups: every member, ended or not
        self._held: HeldRows | None = None  # the rows of their ended members, as the steps they ended in closed them
        self.loader = DataLoader(prompts, config)  # the data loader's batches, cursor and samples drawn
        # room for the rows a run usually makes (up to 4M at first: a larger run grows the table as it goes)
        self._responses = ResponseTable(capacity=min(config.total_groups * config.group_size, 4_000_000))
        self._step_rows, self.groups_trained = [], 0  # (the steps' rows; groups trained so far)
        # Skip hooks nobody overrides: the simulator's hot path runs these checks per event.
        self._asks = {h: policy.overrides(h) for h in ("priority", "place", "on_progress", "on_finish", "end_rollout", "top_up", "on_unfinished")}
        engine.set_progress_interval(policy.progress_interval if self._asks["on_progress"] else None)
        self._bridges = policy.overrides("bridge")
        self._drops_stale = type(self.mode).is_stale is not ModeHooks.is_stale  # else no group is ever stale
        # Nobody reacts to single events when the policy has no per-event hook and the mode never cuts a rollout
        # short: an engine that can (the simulator) then runs each rollout as one batch (lssim.sim.fastsim), with the
        # same results (lssim.loop.contracts.Engine.set_batch_rollout; vLLM streams events and ignores it).
        self._batched = bool(engine.set_batch_rollout(self._batch_rollout()))
        # ... and so does one that only requeues, by seer's rules, run by the engine itself (Policy.requeues_in_batches)
        self._batched = self._batched or (policy.requeues_in_batches() and self._mode_runs_whole()
                                          and bool(engine.set_requeue_rollout(True)))
        # A policy that reacts only by ending the rollout, or by carrying at checkpoints, with an array form of that
        # rule, has each submission scheduled whole and cut where the rule ends it, or run with its carries
        # (lssim.loop.contracts.Engine.set_cut_rollout; the event route's books).
        self._cut = not self._batched and bool(engine.set_cut_rollout(self._cut_rollout()))
        # Execution features are set once per run, before the first step (vLLM configures them at start); an
        # engine that cannot speculate refuses a policy that asks (lssim.loop.contracts.Engine.set_speculation).
        engine.set_speculation(policy.needs().speculation)
        # A policy that reads early-exit signals never runs blind: an engine (a trace) without them refuses it, or,
        # told to go on, says which are missing; the run's result names them (meta "missing_signals").
        try:
            self.missing_signals = engine.set_signals(policy.needs().signals)
        except ValueError as e:
            raise type(e)(f"policy {policy.name}: {e}") from None
        if policy.overrides("train_mask"):  # training-side policies (token pruning): the trainer asks the policy
            if not trainer.set_train_mask(policy.train_mask):
                raise ValueError(f"policy {policy.name} decides which tokens are trained (train_mask), which trainer "
                                 f"{type(trainer).__name__} cannot do (no set_train_mask)")

    def _batch_rollout(self) -> bool:
        """True when a step's rollout is one submission drained to its end (and any top-ups, each drained in turn): no
        per-event hook without an array form (Policy.reacts_to_events) and a mode that runs a rollout whole."""
        # top_up is asked only once nothing is in flight, and on_finish's array form only keeps the policy's books:
        # neither reacts to a single event (lssim.loop.rollout_books.rollout_batch).
        return not self.policy.reacts_to_events() and self._mode_runs_whole()

    def _cut_rollout(self) -> bool:
        """True when a step's rollout is one submission that only the policy's end_rollout cuts short, answered over
        the whole schedule (Policy.cuts_in_batches: no progress checkpoints, no top-ups), or in which the policy only
        carries responses at its checkpoints, answered for the whole submission (Policy.carries_in_batches); no group
        streamed to training, none dropped as stale (the cut's responses are the step's first to end)."""
        policy = self.policy
        return ((policy.cuts_in_batches() or policy.carries_in_batches()) and self._mode_runs_whole()
                and type(self.mode).group_done is ModeHooks.group_done and not self._drops_stale)

    def _mode_runs_whole(self) -> bool:
        """The mode neither ends a rollout early nor keeps or interrupts it."""
        mode = self.mode
        return (not mode.keeps_generating and not mode.interrupts and type(mode).rollout_done is ModeHooks.rollout_done
                and type(mode).on_wake is ModeHooks.on_wake)

    def set_lower_bound(self, bound: LowerBound | None) -> None:
        """The bound each step's row prices its rollout against (made once the engine's cost model is set up)."""
        self.lower_bound = bound

    def add_observer(self, observer: StepObserver) -> None:
        """Tell `observer` each step's row once the step is recorded; observers are told in the order added."""
        self._observers.append(observer)

    # -- the run -----------------------------------------------------------------------------------
    def run(self, first_step: int = 0, progress: Callable[[Iterable[int]], Iterable[int]] | None = None,
            response_columns: Sequence[str] | None = None) -> RunResult:
        """The run's steps from `first_step` (a resumed run's next) to its end; the result's responses frame has
        `response_columns` only, if given (a summary reads a few of them, and a million rows of the others cost time
        to assemble)."""
        steps = range(first_step, self.config.steps)
        for step in progress(steps) if progress else steps:
            # Done once enough groups trained, but not while responses are carried: those run to their end
            # first (steps with no fresh groups), so nothing is left hanging. `steps` bounds it all.
            if self._enough_trained():
                break
            self.run_step(step)
        return self.result(response_columns, final=True)

    def _enough_trained(self) -> bool:
        """Whether the run is done before `steps` runs out: enough groups trained and nothing carried or kept."""
        return self.groups_trained >= self.config.total_groups and not self._carried and not self._kept

    def result(self, response_columns: Sequence[str] | None = None, *, final: bool = False) -> RunResult:
        """The run so far; `final`: the run is over, and the responses frame may share the table's memory."""
        responses = self._responses.frame(response_columns, share=final)
        steps = pd.DataFrame(self._step_rows)
        return RunResult(self.policy.name, responses, steps, meta={"policy": repr(self.policy), "seed": self.config.seed,
                                                                     "missing_signals": sorted(self.missing_signals),
                                                                     "ran_blind": self.policy.ran_blind()})

    # -- what lives on between steps ---------------------------------------------------------------
    @property
    def step_rows(self) -> list[dict]:
        """Each finished step's row, in order: the live rows (a real run fills in its jobs' times once they end)."""
        return self._step_rows

    @property
    def carried(self) -> list[Request]:
        """Unfinished responses waiting for the next step (paused: they resume there)."""
        return list(self._carried)

    @property
    def kept(self) -> list[Request]:
        """Unfinished responses still generating in the engine across the step boundary (async modes)."""
        return list(self._kept.values())

    def held(self) -> dict[str, list[Request]]:
        """Every response held between steps, by where: carried, kept, and every member of a group still open
        (ended or not); a response may be in two lists (a kept member of an open group)."""
        return {"carried": self.carried, "kept": self.kept,
                "open group": [r for members in self._waiting_groups.values() for r in members]}

    def state(self) -> dict:
        """The run's state between steps, what a checkpoint needs (real_backend.checkpoint); not the world (engine,
        trainer, prompts, policy, mode) nor its clock. Responses still generating across the boundary (`kept`, async)
        are held as carried: restored on a new engine, they resume from their tokens so far."""
        return {"rng": self.rng, "policy_rng": self.policy_rng, "next_rid": self._next_rid, "next_group": self._next_group,
                "carried": list(self._carried) + list(self._kept.values()), "admitted": self._admitted,
                "waiting_groups": {gid: list(members) for gid, members in self._waiting_groups.items()},
                "batches": self.loader.batches, "cursor": self.loader.cursor, "batch_samples": self.loader.batch_samples,
                "responses": self._responses, "left_out": self.loader.left_out, "step_rows": self._step_rows,
                "groups_trained": self.groups_trained, "mode_version": self.mode.version}

    def restore(self, state: dict) -> None:
        """Put back a `state()` into this controller, built for the same run with the same policy object; the next
        step's time counts from the new engine's clock. (An older checkpoint names the attributes: _carried, ...)"""
        s = {k.lstrip("_"): v for k, v in state.items()}
        self.rng, self.policy_rng = s["rng"], s["policy_rng"]
        self._next_rid, self._next_group, self._admitted = s["next_rid"], s["next_group"], s["admitted"]
        self._carried, self._kept, self._waiting_groups = s["carried"], {}, s["waiting_groups"]
        self._carried_rows = None
        self.loader.batches, self.loader.cursor, self.loader.batch_samples = s["batches"], s["cursor"], s["batch_samples"]
        self._responses, self.loader.left_out, self._step_rows = s["responses"], s["left_out"], s["step_rows"]
        self.groups_trained = s["groups_trained"]
        if "mode_version" in s:
            self.mode.version = s["mode_version"]
        self._last_end = self.engine.now()

    def run_step(self, step: int) -> dict:
        """One synchronous RL step; returns its row (lssim.loop.step_row.step_row)."""
        s = self._start_step(step)  # carried groups reopen; carried responses resume where they stopped
        ctx, proposal = self._proposal(s)
        plan = self._admit(self.policy.plan(ctx, proposal), s)
        fresh = self._make_requests(plan, s)
        if self._batched:  # the whole rollout at once, as columns (lssim.sim.fastsim): nothing is carried out of it
            rollout_batch(fresh, s, self.engine, self.policy, self._asks,
                          (lambda: self._top_up_batch(s)) if self._asks["top_up"] else None)
        else:
            self._rollout_phase(fresh, s)
            self._settle_unfinished(s)  # what still runs is carried or dropped
        end = self._train(s)
        row, books = self._record(s, end)
        self.policy.end_step(step_outcome(s, books, end))
        for observe in self._observers:
            observe(row)
        return row

    def _rollout_phase(self, fresh: RequestColumns, s: StepState) -> None:
        """The rollout of the step's carried responses and the plan's (`fresh`): on the cut route where the engine can
        (booked as they leave it, objects made only where read: lssim.loop.cut_books), else as events until it ends."""
        launched = self._asks["priority"] or self._asks["place"]  # hooks that read every request before it runs
        if self._cut and not launched and rollout_cut(fresh, s, self.engine, self.policy, self._asks):
            return
        if isinstance(s.carried_in, CarriedRows):  # (not resumed yet: as objects, here)
            s.carried_in = list(s.carried_in)
            for r in s.carried_in:
                note_resume(r, s.version)
        s.fresh = register(fresh, s)
        submission = self._launch(s)  # carried responses and the plan's, in one submission
        if self._cut and launched and rollout_cut(fresh, s, self.engine, self.policy, self._asks, submission):
            return
        self.engine.submit(submission)
        self._rollout(s)  # events until the rollout ends (top-ups submitted on the way)

    def _start_step(self, step: int) -> StepState:
        """A new step's books: the groups carried over reopen, carried responses resume from where they are."""
        self.engine.begin_step()  # the driver's own seconds since the last step's weights (a priced host's)
        before = self.engine.now()
        self.mode.before_rollout(step)  # disaggregated and hybrid wait here for the weights this step may use
        t0, version = self.engine.now(), self.mode.version
        s = StepState(step=step, started=t0, busy_at_start=self.engine.utilization(),
                      rollout=RolloutState(step=step, started=t0, now=t0), carried_in=self._carried,
                      kept_in=list(self._kept.values()), version=version, waited=t0 - before)
        s.carried_rows, self._carried, self._kept, self._carried_rows = self._carried_rows, [], {}, None
        s.members.update(self._waiting_groups)  # open members: those carried or kept (every other one ended)
        if self.mode.groups_to_train() is not None:  # groups deferred whole by the last step are done already
            s.rollout.groups_done = sum(1 for members in self._waiting_groups.values() if all(r.done for r in members))
        open_members, self._waiting_groups = s.open_members, {}
        open_members.update(dict.fromkeys(s.members, 0))
        if isinstance(s.carried_in, CarriedRows):  # carried as rows (nothing kept): they resume as rows when submitted
            s.open_carried_rows()
            return s
        for r in itertools.chain(s.carried_in, s.kept_in):  # (kept: still generating, tokens counted where they ran)
            s.context_at_start[r.rid] = r.prompt_len + r.generated
            open_members[r.group_id] += 1
        for r in s.carried_in:
            note_resume(r, version)
        return s

    def _proposal(self, s: StepState) -> tuple[StepContext, Sequence[GroupSpec]]:
        """What the policy plans from: its view of the step, and the data loader's default groups for it."""
        cfg, step = self.config, s.step
        groups_left = cfg.total_groups - self.groups_trained
        ctx = StepContext(step=step, groups_per_step=cfg.groups_per_step, group_size=cfg.group_size, max_tokens=cfg.max_tokens,
                          groups_left=groups_left, carried_groups=len(s.members), pool=self.prompts.pool,
                          rng=self.policy_rng, oracle_length=self.oracle_length, draw=lambda n: self.draw(n),
                          reward_scale=cfg.reward_scale)
        self.loader.start_step(step)
        default = self.loader.proposal_size(step, ctx.carried_groups, groups_left)
        n = self.mode.admission(step, self._admitted, default, max(0, groups_left - self._open_groups(s)))
        return ctx, self.loader.take(n)

    def _admit(self, groups: list[GroupSpec], s: StepState) -> list[GroupSpec]:
        """The groups the mode lets in now, in order (async: its admission gate; groups the policy drew past it
        are not generated), counted as admitted."""
        left = max(0, self.config.total_groups - self.groups_trained - self._open_groups(s))
        allowed = groups[:self.mode.admission(s.step, self._admitted, len(groups), left)]
        self._admitted += len(allowed)
        return allowed

    def _open_groups(self, s: StepState) -> int:
        """Groups submitted and not yet settled (trained, or dropped): the ones still to come of what was admitted."""
        return len(s.members)

    def _launch(self, s: StepState) -> list[Request]:
        """The step's requests in flight; the submission (carried and fresh, kept ones run already) in queue order."""
        s.rollout.groups_submitted = len(s.members)
        for requests in (s.kept_in, s.carried_in, s.fresh):
            s.in_flight.update(zip(rids_of(requests).tolist(), requests))
        s.rollout.requests_in_flight = len(s.in_flight)
        if self._drops_stale:  # (it may end any of them)
            self._admitted -= drop_stale(s, self.engine, self.mode)
            return order([r for r in s.carried_in + s.fresh if not r.done], self.engine, self.policy, self._asks)
        return order([r for r in s.carried_in if not r.done] + s.fresh, self.engine, self.policy, self._asks)

    def _train(self, s: StepState) -> StepEnd:
        """After the rollout: the completed groups go to the policy's selection and on to the trainer; the
        others wait for their carried members."""
        engine, step = self.engine, s.step
        rollout_end, busy = engine.now(), engine.utilization()
        s.set_last_version(self.mode.version)
        done_groups = []
        if s.batch is not None:  # the batch route: every group ended, its members are rows of the step's columns
            s.batch.last_version[:] = self.mode.version
            done_groups = s.groups_done
        done_now = []
        for gid, members in s.members.items():
            if s.open_members[gid]:  # its members not ended (carried or kept): 0 where every member ended
                self._waiting_groups[gid] = members
            elif gid not in s.dropped_groups:
                done_now.append(members)
        limit = self.mode.groups_to_train()
        if limit is not None and len(done_now) > limit:  # the last to complete wait, whole, in the waiting groups
            done_now = defer_last_completed(done_now, limit, self._waiting_groups)
        if s.batch is None:  # the step's responses gathered into columns once, its done groups over them
            done_groups = close_step(s, done_now, self.mode.version, self._held)
            self._held = held_rows(s, self._waiting_groups, self._held)
            if len(self._carried) == len(s.carried_out):  # (none kept generating): the next step's carried_in
                self._carried_rows = s.closed.take(s.closed_carried)
        trained, left_out = self.loader.leave_out(self.policy.select(done_groups, step), done_groups)
        if s.batch is None:  # a policy's own groups of the step's responses read from its columns too
            trained = with_rows(s, trained)
        # Partial groups a policy trains now with bootstrapped values (segment's value bridging): the trainer sees
        # them, the books do not (they are not trained groups: they train, whole, once their members end).
        bridged = self.policy.bridge([Group(m[0].prompt_id, m[0].step, list(m)) for m in self._waiting_groups.values()], step) \
            if self._bridges else []
        batch = list(trained) + bridged if bridged else trained
        # A trainer that can run beside the rollout (real_backend's GRPOTrainer.start) does so where the mode trains
        # beside it: a job whose metrics come when it ends (lssim.loop.contracts.TrainJob); otherwise train() prices or blocks.
        job = self.trainer.start(batch, step) if self.mode.trains_beside and batch else None
        train_metrics = {} if job is not None else self.trainer.train(batch, step) if batch else {}
        self.groups_trained += len(trained) + left_out
        last = step + 1 >= self.config.steps or self._enough_trained()  # nothing rolls out beside its training
        timing = self.mode.train(train_metrics, step, batch, s.started, rollout_end, job=job, last=last)
        trained_members = gather(trained, lazy=True)  # (the step's row reads eight of its columns)
        end = StepEnd(rollout_end=rollout_end, step_end=timing.end, busy_at_rollout_end=busy, done_groups=done_groups,
                      trained=trained, trained_members=trained_members, trained_rids=np.sort(trained_members[0].rid),
                      train_metrics=train_metrics, timing=timing, previous_end=self._last_end)
        self._last_end = max(self._last_end, timing.end)
        return end

    def _record(self, s: StepState, end: StepEnd) -> tuple[dict, StepBooks]:
        """The step's rows: settle earlier members of the groups completed now, add this step's responses
        (those of groups still open are settled later), and the step's own row."""
        books = s.books(end, self.engine.counterfactual)
        self._responses.settle(end, s.step)
        self._responses.add(books, s.step, s.started, end.trained_rids, open_groups=self._waiting_groups)
        row = step_row(s, books, end, self.lower_bound, self.engine.n_instances)
        row.update(mode_fields(s, books, end, self.mode.config, self.engine.n_instances))
        self._step_rows.append(row)
        return row, books

    # -- the rollout phase -------------------------------------------------------------------------
    def _rollout(self, s: StepState) -> None:
        engine, policy, asks, state, in_flight = self.engine, self.policy, self._asks, s.rollout, s.in_flight
        mode_ends = type(self.mode).rollout_done is not ModeHooks.rollout_done
        streams = type(self.mode).group_done is not ModeHooks.group_done
        while True:
            events = engine.next_events()
            if not events:
                more = policy.top_up(state) if asks["top_up"] else []
                if not more:
                    return
                self._submit_more(more, s)
                continue
            for ev in events:
                r = ev.request
                if ev.kind == WAKE:  # the mode's timer: weights arriving mid-rollout
                    self._weights_arrived(s)
                    continue
                if r.rid not in in_flight:
                    continue  # a stale event for a request the controller already ended
                if ev.kind == FINISHED:
                    end_response(r, s)
                    if streams and not s.open_members[r.group_id]:  # its group is whole: hybrid trains it now
                        members = s.members[r.group_id]
                        self.mode.group_done(Group(members[0].prompt_id, members[0].step, members), s.step, self.trainer)
                    if asks["on_finish"]:
                        policy.on_finish(r, state)
                elif asks["on_progress"]:
                    action = policy.on_progress(r, state)
                    if action is not None:
                        self._act(r, action, s)
            state.now = events[-1].time
            if mode_ends and in_flight and self.mode.rollout_done(state):
                return
            if asks["end_rollout"] and in_flight and policy.end_rollout(state):
                more = policy.top_up(state) if asks["top_up"] else []
                if not more:
                    return
                self._submit_more(more, s)

    def _weights_arrived(self, s: StepState) -> None:
        """New weights reached the engine mid-rollout (async): generation pauses for the sync, every response in
        flight is re-prefilled under the new weights and continues (AReaL's interruptible rollout), and the
        admission gate may let more groups in."""
        arrived = self.mode.on_wake()
        if arrived is None:
            return
        running = list(s.in_flight.values())
        self.engine.abort_many(running)
        arrived.push(self.engine)  # the simulator's clock moves by the sync; a real engine loads the weights
        for r in running:
            note_resume(r, self.mode.version)
        self._submit(running)
        left = self.config.total_groups - self.groups_trained - len(s.members)
        n = self.mode.admission(s.step, self._admitted, 0, max(0, left))  # room the new weights opened
        more = self.loader.take(n) if n else []
        if more:
            self._submit_more(more, s)

    def _act(self, r: Request, action, s: StepState) -> None:
        self.engine.abort(r)
        if action.kind == "requeue":  # resume in this step: new priority, maybe another instance
            if action.priority is not None:
                r.priority = action.priority
            r.instance = action.instance
            self._submit([r])
            return
        if action.kind == "stop":
            r.finish_reason, r.stop_reason = POLICY_STOP, action.reason
            if action.reward is not None:
                r.reward = action.reward
            elif action.score:  # an early exit keeps what the response wrote so far, as the world scores it
                r.reward = self.engine.score_partial(r)
            end_response(r, s)
            if self._asks["on_finish"]:  # every policy hears of every response that ends during the rollout
                self.policy.on_finish(r, s.rollout)
        else:  # carry: pause now, resume next step
            carry_out(r, s, action.reason)

    def _settle_unfinished(self, s: StepState) -> None:
        """The rollout ended with requests still running: each is carried or dropped, never lost."""
        settle_rows(s, self.engine, self.policy, self._asks, self.mode.keeps_generating)  # a cut's running rows
        if s.in_flight and isinstance(s.carried_out, CarriedRows):  # (more may join them: as objects)
            s.carried_out = list(s.carried_out)
        if self.mode.keeps_generating:  # nothing stops: the unfinished run on into the next step
            running = list(s.in_flight.values())
            self.engine.refresh(running)
            for r in running:
                del s.in_flight[r.rid]
                s.rollout.requests_in_flight -= 1
                s.carried_out.append(r)
                self._kept[r.rid] = r
        unfinished = list(s.in_flight.values())
        self.engine.abort_many(unfinished)  # (an aborted response's fields are final: each is judged after all)
        for r in unfinished:
            if self._asks["on_unfinished"] and self.policy.on_unfinished(r) == CARRY:
                del s.in_flight[r.rid]
                s.rollout.requests_in_flight -= 1
                s.carried_out.append(r)
            else:
                r.finish_reason, r.stop_reason = ABORT, r.stop_reason or "rollout ended"
                end_response(r, s)
        self._carried = s.carried_out if isinstance(s.carried_out, CarriedRows) and not self._kept else \
            [r for r in s.carried_out if r.rid not in self._kept]

    # -- the data loader ---------------------------------------------------------------------------
    def draw(self, n: int) -> Sequence[GroupSpec]:
        """StepContext.draw: the loader's next `n` groups (a checkpoint's restored context draws here too)."""
        return self.loader.take(int(n))

    # -- requests ----------------------------------------------------------------------------------
    def _make_requests(self, plan: list[GroupSpec], s: StepState) -> RequestColumns:
        """The plan's requests as columns (lssim.loop.plan_columns.plan_requests), with the run's next ids and seeds."""
        cols, left_out = plan_requests(plan, step=s.step, first_rid=self._next_rid, first_group=self._next_group,
                                       version=self.mode.version, rng=self.rng, prompt_lens=self.prompts.prompt_lens,
                                       samples_planned=s.samples_planned, batch_samples=self.loader.batch_samples)
        self.loader.left_out.update(left_out)  # a recorded group says these were not trained (GroupSpec.member_trained)
        self._next_rid += len(cols)
        self._next_group += len(plan)
        return cols

    def _top_up_batch(self, s: StepState) -> RequestColumns | None:
        """The batch route's top-up once a submission has drained, as _rollout asks it then: the policy's groups the
        mode admits, as columns (asked again while it offers groups the mode turns away); None once it offers none."""
        while True:
            more = self.policy.top_up(s.rollout)
            if not more:
                return None
            more = self._admit(more, s)
            if more:
                s.rollout.extra_rounds += 1
                return self._make_requests(more, s)

    def _submit(self, requests: list[Request]) -> None:
        self.engine.submit(order(requests, self.engine, self.policy, self._asks))

    def _submit_more(self, more: list[GroupSpec], s: StepState) -> None:
        more = self._admit(more, s)
        if not more:
            return
        fresh = register(self._make_requests(more, s), s)
        s.topped_up.extend(fresh)
        s.rollout.groups_submitted += len(more)
        s.rollout.extra_rounds += 1
        s.in_flight.update((r.rid, r) for r in fresh)
        s.rollout.requests_in_flight += len(fresh)
        self._submit(fresh)
