"""The simulated world: a cluster of continuously-batching engine instances, a clock (the trainer: lssim.sim.trainer).

Each instance schedules the way vLLM does: up to `max_num_seqs` running sequences, admission while the
KV cache has room for the prompt, preemption by recompute (the lowest-priority, latest-admitted
sequence) when the cache cannot hold the next token, prefill charged to the iteration that admits.
Time is never stepped token by token: between changes of batch composition every running sequence
gains one token per iteration, so the instance jumps straight to the next finish, checkpoint or cache
overflow, and the cost model prices the whole span in closed form.
"""

from __future__ import annotations

import heapq
import itertools
from typing import Sequence

import numpy as np

from lssim.loop.core import FINISHED, PROGRESS, WAKE, Event, InstanceLoad, Request
from lssim.loop.contracts import Engine
from lssim.loop.signals import DEFAULT as DEFAULT_SIGNALS
from lssim.loop.signals import WINDOW_KEY, SignalSpec
from lssim.sim.answers import Answers
from lssim.sim.instances import EngineConfig, Instance, MissingSignals
from lssim.traces.workload import EXACT, Workload


class SimEngine(Engine):
    """N simulated instances behind a least-loaded dispatcher, answering responses from a Workload."""

    def __init__(self, workload: Workload, cost, config: EngineConfig | None = None, signals: SignalSpec = DEFAULT_SIGNALS,
                 *, batch_route: bool = True, allow_missing_signals: bool = False):
        self.workload, self.cost = workload, cost
        self.allow_missing_signals = allow_missing_signals  # set_signals: go on without them, saying so
        # False: every rollout on the event route, whatever the controller allows. A cost model that prices resumes
        # (cost.resume_time) runs there too: the batch, cut and carry routes take carried responses in without it.
        self._resumes_priced = cost.resume_time(1) > 0.0
        self.batch_route = batch_route and not self._resumes_priced
        self.base_cost = cost  # the cost model without execution features (set_speculation wraps it)
        self._spec_batch = 0  # speculation applies at most this many running sequences (0: never)
        self.speculated_tokens = 0  # tokens generated while speculation (or layer skip) was on
        self.signals = signals  # the window of the early-exit signals put in Request.signals at progress events
        self._reads_signals = False  # set_signals: a policy declared it reads them (nobody else does: not measured)
        self.config = config or EngineConfig()
        self.n_instances = self.config.n_instances
        self.clock = 0.0
        self.instances = [Instance(i, 0.0) for i in range(self.n_instances)]
        self._events: list = []  # heap of (time, seq, instance index, instance version, event iteration)
        self._timers: list = []  # heap of (time, seq): wake_at's timers (lssim.loop.core.WAKE)
        self._seq = itertools.count()  # tie-breaker and arrival order; belongs to this engine, not the process
        self._epoch: dict[int, int] = {}  # rid -> epoch; bumped on admit/abort/preempt to retire stale heap entries
        self._target = Answers()  # rid -> (length, finish_reason, reward, trace row): a dict, arrays where remembered
        self._where: dict[int, Instance] = {}
        self._interval: int | None = None
        self.preemptions = 0
        self.sources = {"exact": 0, "truncated": 0, "resampled": 0, "global": 0}
        self._batch = False  # set_batch_rollout: rollouts come whole through run_batch (lssim.sim.fastsim)
        self._cut = False  # set_cut_rollout: submissions come whole through run_cut (lssim.sim.cut_route)
        self._requeue = False  # set_requeue_rollout: rollouts come whole through run_batch (lssim.sim.requeue_route)
        self._held_cut = None  # hold_cut: the instances at a cut, as arrays, until the next command reads them

    def hold_cut(self, held) -> None:
        """The cut route's instances at its cut (lssim.sim.cut_aborts.HeldCut): held as arrays, for abort_many to abort
        what is in flight on them where the roofline alone prices the engine and no checkpoint runs, else built now."""
        from lssim.cost.roofline import RooflineCostModel

        self._held_cut = held
        if type(self.cost) is not RooflineCostModel or self._interval:
            self._settle_cut()

    def _settle_cut(self) -> None:
        """A held cut's instances and heaps built (every command but abort_many of what is in flight reads them)."""
        if self._held_cut is not None:
            held, self._held_cut = self._held_cut, None
            held.materialize(self)

    # -- Engine protocol ---------------------------------------------------------------------------
    def now(self) -> float:
        return self.clock

    def advance(self, seconds: float) -> None:
        """Let `seconds` of virtual time pass (a blocking train phase, a paused weight sync); instances catch up
        lazily (whatever runs on them keeps running)."""
        self.clock += seconds

    def wake_at(self, time: float) -> None:
        heapq.heappush(self._timers, (time, next(self._seq)))

    def refresh(self, requests: Sequence[Request]) -> None:
        """Bring the running requests' `generated` up to the clock (their instances to the last iteration boundary
        before it), so a step that ends with them still generating counts the tokens they made in it."""
        self._settle_cut()
        for r in requests:
            inst = self._where.get(r.rid)
            if inst is None:
                continue
            self._catch_up(inst, self.clock)
            member = inst.members.get(r.rid)
            if member is not None:
                r.generated = member[3] + (inst.it - member[2])

    def set_progress_interval(self, tokens: int | None) -> None:
        self._interval = tokens

    def set_batch_rollout(self, on: bool) -> bool:
        """The controller's promise that each rollout is one submission run to its end with no reaction
        (lssim.loop.contracts.Engine.set_batch_rollout): rollouts then come whole through run_batch (lssim.sim.fastsim), priced
        as arrays with the event route's results to the last bit. False when built with batch_route=False."""
        # Stops at progress checkpoints (set_progress_interval first) are aborts: the batch route runs them where an
        # abort costs the caller nothing, so that no instance catches up to a clock other instances moved.
        stops_free = self._interval is None or self.base_cost.abort_time(1) == 0.0
        self._batch = bool(on) and self.batch_route and stops_free
        return self._batch

    def run_batch(self, requests, queue=None, progress=None) -> np.ndarray:
        """A whole rollout of `requests` (lssim.loop.columns.RequestColumns) on the idle engine, `progress` the policy's
        stops at its checkpoints (Policy.progress_stops; see lssim.sim.fastsim), or, after set_requeue_rollout(True),
        its requeues (Policy.progress_requeues; see lssim.sim.requeue_route)."""
        self._settle_cut()
        if self._requeue:
            from lssim.sim.requeue_route import run_requeued

            return run_requeued(self, requests, queue, progress)
        if not self._batch:
            raise RuntimeError("run_batch before set_batch_rollout(True)")
        from lssim.sim.fastsim import run_batch

        return run_batch(self, requests, queue, progress)

    def set_requeue_rollout(self, on: bool) -> bool:
        """The controller's promise that each rollout is one submission whose only reactions are requeues at progress
        checkpoints by seer's rules (Policy.progress_requeues): rollouts then come whole through run_batch, run in one
        kernel (lssim.sim.requeue_route). Only where the roofline alone prices the engine (the kernel prices with it),
        and not on the Python route (the kernel's source run as Python costs ~12x the event engine's); False when built
        with batch_route=False."""
        from lssim.cost.roofline import RooflineCostModel
        from lssim.kernels import on_python_route

        self._requeue = bool(on) and self.batch_route and type(self.cost) is RooflineCostModel and not on_python_route()
        return self._requeue

    def set_cut_rollout(self, on: bool) -> bool:
        """The controller's promise that a rollout reacts only where its end_rollout rule ends it, or by carries at
        progress checkpoints: submissions then come whole through run_cut (lssim.sim.cut_route, lssim.sim.carry_route).
        False when built with batch_route=False."""
        self._cut = bool(on) and self.batch_route
        return self._cut

    def run_cut(self, requests, columns, cut_at=None, carry_at=None):
        """A submission scheduled whole and cut where `cut_at` (Policy.end_rollout_at) says (lssim.sim.cut_route), or
        run to its end with the carries `carry_at` (Policy.progress_carries) says (lssim.sim.carry_route)."""
        self._settle_cut()
        if not self._cut:
            raise RuntimeError("run_cut before set_cut_rollout(True)")
        if (cut_at is None) == (carry_at is None):
            raise ValueError("run_cut: give either cut_at (an end_rollout rule) or carry_at (carries), not both, "
                             "not neither")
        if carry_at is not None:
            from lssim.sim.carry_route import run_carried

            return run_carried(self, requests, columns, carry_at)
        from lssim.sim.cut_route import run_cut

        return run_cut(self, requests, columns, cut_at)

    def set_speculation(self, speculation) -> None:
        """Speculative decoding (or layer skip) while an instance runs at most `max_batch` sequences: the cost
        model is wrapped (lssim.cost.SpeculativeCost); None switches it off. Set before the first submit."""
        from lssim.cost import SpeculativeCost

        self.cost = SpeculativeCost(self.base_cost, speculation) if speculation is not None else self.base_cost
        self._spec_batch = speculation.max_batch if speculation is not None else 0

    def score_partial(self, r: Request) -> float:
        """Modelled: a response's answer is at its end (as in the reference task: '= answer', then EOS), so what it
        wrote before its natural length scores the trace's lowest reward, and from there on its own."""
        length, _, reward, _ = self._target[r.rid]
        return reward if r.generated >= length else self.workload.reward_scale.low

    def set_signals(self, names: frozenset[str]) -> frozenset[str]:
        """The trace's signals (lssim.traces.signal_trace): a policy reading one the trace lacks is refused, naming
        what is missing and how to measure it, unless this engine was told to go on (allow_missing_signals)."""
        self._reads_signals = bool(names)
        if not names:
            return frozenset()
        missing = self.workload.signals.missing(names)
        if missing and not self.allow_missing_signals:
            raise MissingSignals.of(missing, self.workload.signals.source_name)
        return missing

    def loads(self) -> list[InstanceLoad]:
        self._settle_cut()
        return [InstanceLoad(inst.n, inst.pending - inst.n, 0) for inst in self.instances]

    def submit(self, requests: Sequence[Request]) -> None:
        self._settle_cut()
        if self._resumes_priced:  # the front end takes them back before the engine sees them (instances run on)
            self.clock += self.cost.resume_time(sum(1 for r in requests if r.generated > 0))
        now, capacity, touched = self.clock, self.config.kv_capacity_tokens, {}
        instances, target, epochs, where, seq, lookup = self.instances, self._target, self._epoch, self._where, self._seq, self.workload.lookup
        by_load = [(inst.pending, inst.idx) for inst in instances]  # least-loaded dispatch, kept current in the loop
        heapq.heapify(by_load)
        nan = float("nan")
        for r in requests:
            if r.prompt_len + r.max_tokens > capacity:
                raise ValueError(f"request {r.rid} (prompt {r.prompt_id}) needs {r.prompt_len + r.max_tokens} KV tokens; "
                                 f"an instance holds {capacity} (raise kv_capacity_tokens or lower max_tokens)")
            if r.rid not in target:
                step, sample = self.workload.request_key(r)  # its own step's, or its loader batch's
                answer = lookup(step, r.prompt_id, sample, r.max_tokens)
                target[r.rid] = (answer.length, answer.finish_reason, answer.reward, answer.row)
                self.sources[answer.source] += 1
                r.exact = answer.source == EXACT
            if r.instance is None:
                pending, idx = by_load[0]
                heapq.heapreplace(by_load, (pending + 1, idx))
                inst = instances[idx]
            else:
                inst = instances[r.instance % self.n_instances]
            r.ran_on = inst.idx
            if inst.idx not in touched:
                self._catch_up(inst, now)
                touched[inst.idx] = inst
            r.submit_time = now
            r.first_token_time = nan
            epoch = epochs.get(r.rid, 0) + 1
            epochs[r.rid] = epoch
            heapq.heappush(inst.waiting, (r.priority, next(seq), epoch, r))
            inst.pending += 1
            where[r.rid] = inst
        for inst in touched.values():
            self._admit(inst)
            self._schedule(inst)

    def abort(self, r: Request) -> None:
        self._settle_cut()
        inst = self._where.pop(r.rid, None)
        if inst is not None:
            # The caller is blocked while the serving API aborts it (cost.abort_time; the instances run on meanwhile).
            self.clock += self.cost.abort_time(1)
            self._abort_on(inst, [(r, self.clock)])
            self._schedule(inst)

    def abort_many(self, requests: Sequence[Request]) -> None:
        """Each of `requests` aborted in turn, to the last bit as `abort` one by one, in one pass per instance: the
        instances share only the clock (each abort blocks the caller for cost.abort_time), so each instance's aborts
        run in their order at the clock each came at, with every catch-up, departure and admission from the queue
        (their prefill and first tokens) as abort runs them; only each instance's next event is priced once, after its
        last abort, where abort prices it after each (a price that the next abort on the instance supersedes unread),
        in the order of those last aborts (ties between instances' events go by that order). Those in flight at a held
        cut, all of them, abort on its arrays (lssim.sim.cut_aborts)."""
        if self._held_cut is not None and self._held_cut.abort_all(self, requests):
            self._held_cut = None
            return
        self._settle_cut()
        by_instance: dict[int, tuple[Instance, list]] = {}
        where, clock, abort_time = self._where, self.clock, self.cost.abort_time
        for r in requests:
            inst = where.pop(r.rid, None)
            if inst is None:
                continue
            clock += abort_time(1)
            entry = by_instance.pop(inst.idx, None) or (inst, [])
            entry[1].append((r, clock))
            by_instance[inst.idx] = entry  # (re-inserted: the instances in the order of their last aborts)
        self.clock = clock
        for inst, aborts in by_instance.values():
            self._abort_on(inst, aborts)
        for inst, _ in by_instance.values():
            self._schedule(inst)

    def _abort_on(self, inst: Instance, aborts: list[tuple[Request, float]]) -> None:
        """`abort` of each of `aborts` (a request on `inst`, the clock when it came), in turn, up to pricing the
        instance's next event: catch up to that clock, free the request's place (a running one keeps the tokens it
        has and frees its KV), admit from the queue. The catch-up is skipped where not one iteration fits before that
        clock (iterations_within's 0 by its contract, asked for less): the batch shrank by an abort at the same clock,
        so that is the usual case here."""
        epoch, members, decode_time = self._epoch, inst.members, self.cost.decode_time
        for r, now in aborts:
            if not inst.n or decode_time(inst.n, inst.ctx, 1) <= now - inst.t - inst.owed:
                self._catch_up(inst, now)
            epoch[r.rid] += 1
            inst.pending -= 1
            member = members.pop(r.rid, None)
            if member is not None:  # running
                r.generated = member[3] + (inst.it - member[2])
                inst.n -= 1
                inst.ctx -= r.prompt_len + r.generated
                self._depart(inst, 1)
            if inst.waiting:
                self._admit(inst)

    def next_events(self) -> list[Event]:
        self._settle_cut()
        events, timers = self._events, self._timers
        while events or timers:
            if timers and (not events or timers[0][0] <= events[0][0]):  # a stale instance entry only delays this
                t, _ = heapq.heappop(timers)
                self.clock = max(self.clock, t)
                return [Event(WAKE, None, self.clock)]
            t, _, idx, version, target_it = heapq.heappop(events)
            inst = self.instances[idx]
            if version != inst.version:
                continue
            if t > self.clock:
                self.clock = t
            out = self._fire(inst, target_it)
            self._admit(inst)
            self._schedule(inst)
            if out:
                return out
        return []

    def counterfactual(self, r: Request) -> tuple[int, float]:
        """(length, reward) the response would have had had nobody stopped it: the Workload's answer at its
        budget. The controller records it beside what happened (tokens a stop saved, stops that were wrong)."""
        length, _, reward, _ = self._target[r.rid]
        return length, reward

    def utilization(self) -> tuple[float, float]:
        """(busy seconds, sequence-seconds) summed over instances so far: the controller turns them into
        each step's busy fraction and mean running batch."""
        self._settle_cut()
        busy = seqs = 0.0
        for inst in self.instances:
            self._catch_up(inst, self.clock)
            # An admission charges its whole prefill at once, so an instance can be ahead of the clock; that time
            # has not passed yet (a rollout may end, and abort the prefilling requests, before it does).
            ahead = max(0.0, inst.t - self.clock)
            busy += inst.busy - ahead
            seqs += max(0.0, inst.seq_seconds - inst.n * ahead)
        return busy, seqs

    # -- one instance ------------------------------------------------------------------------------
    def _run(self, inst: Instance, k: int) -> None:
        """Run k decode iterations with the current batch."""
        if k <= 0:
            return
        n, ctx, priced_k, priced = inst.priced
        # The span _schedule priced is usually the one run next (the event fires): the same call, not made twice.
        dt = (priced if n == inst.n and ctx == inst.ctx and priced_k == k else self.cost.decode_time(inst.n, inst.ctx, k)) + inst.owed
        inst.owed = 0.0
        inst.t += dt
        inst.busy += dt
        inst.seq_seconds += inst.n * dt
        if inst.n <= self._spec_batch and self.cost.factor(inst.n) < 1.0:
            self.speculated_tokens += inst.n * k
        inst.ctx += inst.n * k
        inst.it += k

    def _catch_up(self, inst: Instance, now: float) -> None:
        """Bring an instance to the last iteration boundary at or before `now`, short of its next event."""
        if inst.n == 0:
            inst.t = max(inst.t, now)  # idle: nothing to run until something arrives
            return
        if inst.t + inst.owed >= now:
            return
        k = self.cost.iterations_within(inst.n, inst.ctx, now - inst.t - inst.owed)
        nxt = self._next_iteration(inst)
        self._run(inst, min(k, nxt - inst.it - 1))

    def _next_iteration(self, inst: Instance) -> int:
        """The boundary of the instance's next event: a finish or checkpoint, or the cache filling up."""
        running, epoch = inst.running, self._epoch
        while running and running[0][3] != epoch.get(running[0][4].rid):
            heapq.heappop(running)
        if not inst.n:
            return inst.it
        # Each iteration adds n tokens of KV; past `room // n` iterations the cache cannot hold the next one.
        overflow = inst.it + (self.config.kv_capacity_tokens - inst.ctx) // inst.n
        return min(running[0][0], overflow)

    def _schedule(self, inst: Instance) -> None:
        inst.version += 1
        if inst.n == 0:
            if inst.waiting:
                raise RuntimeError(f"instance {inst.idx} is idle with {len(inst.waiting)} waiting requests it cannot admit")
            return
        target_it = self._next_iteration(inst)
        k = target_it - inst.it
        span = self.cost.decode_time(inst.n, inst.ctx, k)
        inst.priced = (inst.n, inst.ctx, k, span)
        t = inst.t + inst.owed + span
        heapq.heappush(self._events, (t, next(self._seq), inst.idx, inst.version, target_it))

    def _fire(self, inst: Instance, target_it: int) -> list[Event]:
        """Run to the event boundary `target_it` and report what happened there."""
        self._run(inst, target_it - inst.it)
        out, running, epoch, it, t, members, where, targets = [], inst.running, self._epoch, inst.it, inst.t, inst.members, self._where, self._target
        n, ctx, pending, heappop = inst.n, inst.ctx, inst.pending, heapq.heappop
        while running and running[0][0] <= it:
            _, _, kind, ep, r = heappop(running)
            rid = r.rid
            if ep != epoch.get(rid):
                continue
            _, _, admit_it, gen0, _ = members[rid]
            generated = r.generated = gen0 + (it - admit_it)
            if kind == FINISHED:
                _, r.finish_reason, r.reward, _ = targets[rid]
                r.finish_time = t
                del members[rid], where[rid]
                epoch[rid] = ep + 1
                n -= 1
                pending -= 1
                ctx -= r.prompt_len + generated
                out.append(Event(FINISHED, r, t))
            else:
                self._push_checkpoint(inst, r, ep)
                if self._reads_signals:
                    self._measure(r, generated)
                out.append(Event(PROGRESS, r, t))
        left = inst.n - n
        inst.n, inst.ctx, inst.pending = n, ctx, pending
        if left:
            self._depart(inst, left)
        if n and self.config.kv_capacity_tokens - ctx < n:
            self._preempt(inst)
        return out

    def _depart(self, inst: Instance, k: int) -> None:
        """k sequences left the batch at this boundary: the engine's cost of re-packing it (cost.departure_time),
        priced once per boundary, so k finishes and aborts at one boundary cost departure_time(k). Nothing to
        re-pack once the batch is empty (as lssim.cost.batch_features prices a batch's last boundary), so the
        next iteration pays it: a rollout that aborts everything still running at its end owes nothing."""
        if not inst.n:
            inst.owed = 0.0
            return
        before = inst.left if inst.left_at == inst.it else 0
        inst.left_at, inst.left = inst.it, before + k
        inst.owed += self.cost.departure_time(before + k) - self.cost.departure_time(before)

    def _preempt(self, inst: Instance) -> None:
        """Free KV by recompute, as vLLM does: the lowest-priority, latest-admitted sequences go back to waiting."""
        while inst.n and self.config.kv_capacity_tokens - inst.ctx < inst.n:
            rid = max(inst.members, key=lambda k: inst.members[k][:2])
            priority, admit_seq, admit_it, gen0, r = inst.members.pop(rid)
            r.generated = gen0 + (inst.it - admit_it)
            inst.n -= 1
            inst.ctx -= r.prompt_len + r.generated
            self._epoch[rid] += 1
            heapq.heappush(inst.waiting, (priority, admit_seq, self._epoch[rid], r))
            self.preemptions += 1

    def _admit(self, inst: Instance) -> None:
        waiting = inst.waiting
        if not waiting:
            return
        capacity, max_seqs, epoch, target, seq = self.config.kv_capacity_tokens, self.config.max_num_seqs, self._epoch, self._target, self._seq
        members, running, interval, it = inst.members, inst.running, self._interval, inst.it
        n, ctx, prefill, admitted = inst.n, inst.ctx, 0, []
        heappop, heappush = heapq.heappop, heapq.heappush
        while waiting and n < max_seqs:
            priority, arrival, ep, r = waiting[0]
            rid = r.rid
            if ep != epoch.get(rid):
                heappop(waiting)
                continue
            generated = r.generated
            need = r.prompt_len + generated
            if ctx + need + n + 1 > capacity:  # after admission, the next iteration needs n + 1 more tokens
                break
            heappop(waiting)
            n += 1
            ctx += need
            prefill += need
            members[rid] = (priority, arrival, it, generated, r)
            admitted.append(r)
            length = target[rid][0]
            heappush(running, (it + max(0, length - generated), next(seq), FINISHED, ep, r))
            if interval:
                self._push_checkpoint(inst, r, ep)
        inst.n, inst.ctx = n, ctx
        if prefill:
            dt = self.cost.prefill_time(prefill)
            inst.t += dt
            inst.busy += dt
            first_token = inst.t + self.cost.decode_time(n, ctx, 1)  # the admitting iteration's end
            for r in admitted:
                if r.first_token_time != r.first_token_time:  # NaN: not set since this submission
                    r.first_token_time = first_token

    def _measure(self, r: Request, generated: int) -> None:
        """The early-exit signals at a progress checkpoint, from the trace: measured, or modelled from its labels
        (lssim.traces.signal_trace); none where the trace has none (a policy that reads them was refused or told)."""
        window = self.workload.signals.window(self._target[r.rid][3], generated, self.signals, r.max_tokens)
        if window is not None:
            r.signals[WINDOW_KEY] = window

    def _push_checkpoint(self, inst: Instance, r: Request, ep: int) -> None:
        if not self._interval:
            return
        _, _, admit_it, gen0, _ = inst.members[r.rid]
        generated = gen0 + (inst.it - admit_it)
        nxt = (generated // self._interval + 1) * self._interval
        if nxt < self._target[r.rid][0]:
            heapq.heappush(inst.running, (admit_it + (nxt - gen0), next(self._seq), PROGRESS, ep, r))
