"""The simulator's batch route: a whole rollout priced as arrays, for runs where nobody reacts to single events.

When the policy acts only through step-level hooks (plan, priority, place, select, end_step) and the execution
mode never ends a rollout early or interrupts it, the controller submits a step's requests once and then only
drains events until none are left (lssim.loop.controller). Nothing between the submission and the last finish can
change what an instance does, so each instance's evolution is a function of its own queue: this module runs it
in three passes instead of an event heap in Python.

1. `schedule_records` (numba): per instance, the vLLM scheduling of lssim.sim.world.SimEngine with integers only --
   admission in (priority, arrival) order while the KV cache holds the next token, the next boundary at a
   finish or at a cache overflow, preemption by recompute of the lowest-priority latest-admitted sequence.
   None of it depends on time, so every span (n running, their summed context, k iterations) is known first.
   Two facts keep it a loop over arrays: the waiting requests' keys are always above the running ones' (the
   head of the queue is admitted, the last admitted is preempted), so the running set is a stack in key order
   and the queue a cursor; finishes pop in (iteration, admission seq) order, as from the event engine's heap
   (one int key each; a record's admissions sorted into a run when the last run is used up, a heap for the rest).
2. pricing: every span, prefill and departure priced at once (`price_decode` is the roofline's closed form
   over arrays, operation for operation the scalar one; other cost models are called once per span).
3. `instance_clocks` (numba): the instance clocks accumulated in the event engine's order of additions (so per-step
   rollout seconds and finish times are the event engine's to the last bit), and `merge_boundaries` orders the boundaries
   of all instances as its heap pops them ((time, push order)), which is the order the controller ends the
   responses in.

tests/test_fastpath.py checks the route against the event engine on generated workloads (lengths, budgets,
instances, KV capacities small enough to preempt): per-step rollout seconds, per-response finish times,
the responses trained, the frames. The event engine (lssim.sim.world) stays the reference and serves every run
with per-event hooks.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from lssim.loop.columns import stable_argsort
from lssim.sim.checkpoints import Checkpoints
from lssim.sim.event_kernels import schedule_stops
from lssim.sim.fastsim_kernels import (MAX_IT, OUT_OF_ROOM, SEQ_MASK, ended_rows, instance_clocks, merge_boundaries,
                                      records_room, schedule_records, touched_rank)

def price_decode(cost, n: np.ndarray, ctx: np.ndarray, k: np.ndarray) -> np.ndarray:
    """cost.decode_time(n[i], ctx[i], k[i]) for every i, equal to the scalar call to the last bit (CostModel.decode_times:
    the model's own array form, the roofline's, or the contract's default over the scalar call)."""
    return cost.decode_times(n, ctx, k)


def _price_departure(cost, leaving_after: np.ndarray, leaving_before: np.ndarray) -> np.ndarray:
    """What the departures at each boundary add: departure_time(after) - departure_time(before)."""
    return cost.departure_times(leaving_after) - cost.departure_times(leaving_before)


def run_batch(engine, requests, queue: np.ndarray | None = None, progress=None) -> np.ndarray:
    """`run_batch_boundaries`' rows only (SimEngine.run_batch)."""
    return run_batch_boundaries(engine, requests, queue, progress)[0]


def run_batch_boundaries(engine, requests, queue: np.ndarray | None = None, progress=None) -> tuple:
    """(rows, boundary, clock): `run_batch`'s rows, and for each the boundary that ended it (one number per boundary,
    increasing in the order the event engine's heap pops them) and the engine's clock once it popped that boundary
    (its heap key: the instance's clock before the span plus what it owed plus the span, which may differ in the last
    bit from the finish time, the clock after them). Run `requests` (lssim.loop.columns.RequestColumns) on an idle
    SimEngine until every instance has ended them all: the columns are filled as the event engine fills its Request
    objects, and the rows come back in the order its heap would end them. The engine's clock, utilization and counters
    move as they would have. `queue`: the rows in the order they were submitted (a priority hook's order), where that
    is not row order: the rows stay where they are (a copy of every column in queue order would cost more than the
    run). `progress`: the policy's stops (Policy.progress_stops, asked with the submission's
    lssim.sim.checkpoints.Checkpoints), run as the event engine runs the aborts they are (lssim.sim.event_kernels)."""
    plan = schedule(engine, requests, queue, progress)
    count_sources(engine, plan.answers[5])
    commit(engine, plan)
    return fill(engine, requests, plan)


@dataclass(slots=True)
class Schedule:
    """A submission's whole schedule on an idle engine, worked out and not yet committed to it: the Workload's
    answers, the stops, each row's instance, the records of lssim.sim.fastsim_kernels.schedule_records and their
    prices, the clocks, and the boundaries in the order the event engine's heap pops them."""

    now: float
    answers: tuple  # (length, finish reason, reward, exact, trace row, source code) per row
    stops: object
    inst: np.ndarray
    order: np.ndarray
    start_gen: np.ndarray  # tokens each row had when submitted
    gen: np.ndarray  # tokens each row has once its schedule ends
    records: tuple  # schedule_records' arrays, kind .. first_rec
    preemptions: int
    priced: tuple  # (span, prefill, first decode, departure) per record
    clocks: tuple  # instance_clocks' answers
    popped: np.ndarray


def schedule(engine, requests, queue: np.ndarray | None = None, progress=None) -> Schedule:
    """`requests`' whole schedule on the idle engine, which it leaves as it is (see run_batch_boundaries)."""
    instances, cfg = engine.instances, engine.config
    if any(inst.n or inst.pending for inst in instances):
        raise RuntimeError("batch rollout: the engine must be idle when a batch is submitted")
    n_inst, capacity, now = engine.n_instances, cfg.kv_capacity_tokens, engine.clock
    _check_fits(requests, capacity)
    answers = _answers(engine, requests)
    length, trace_rows = answers[0], answers[4]
    stops = None
    if progress is not None and engine._interval:
        stops = progress(Checkpoints(length, requests.generated, engine._interval, requests.max_tokens, trace_rows,
                                     engine.workload.signals, engine.signals, requests))
    inst, order, touched = _dispatch(requests, n_inst, queue)
    inst_start = np.searchsorted(inst[order], np.arange(n_inst + 1))
    gen = requests.generated.copy()
    *records, preemptions = _records(order, inst_start, requests.prompt_len, gen, length, capacity, cfg.max_num_seqs,
                                     n_inst, None if stops is None else (stops.at, engine._interval))
    kind, rinst, rn, rctx, rk, rleft, rbefore, rnafter, rpf, ran, ractx = records[:11]
    cost = engine.cost
    span = price_decode(cost, rn, rctx, rk)
    first_decode = price_decode(cost, ran, ractx, np.where(rpf > 0, 1, 0))
    prefill, departure = cost.prefill_times(rpf), _price_departure(cost, rbefore + rleft, rbefore)
    t0 = np.array([max(x.t, now) for x in instances])
    busy0 = np.array([x.busy for x in instances])
    seqs0 = np.array([x.seq_seconds for x in instances])
    clocks = instance_clocks(kind, rinst, rn, rk, rleft, rnafter, rpf, span, prefill, first_decode, departure, t0, busy0,
                             seqs0)
    popped = merge_boundaries(kind, rinst, clocks[0], touched, n_inst)
    return Schedule(now, answers, stops, inst, order, requests.generated.copy(), gen, tuple(records), int(preemptions),
                    (span, prefill, first_decode, departure), clocks, popped)


def commit(engine, plan: Schedule) -> None:
    """The engine as the schedule leaves it once every row ended: clocks, utilization and counters (not the sources
    of its answers: count_sources)."""
    event_t, _, _, t, busy, seqs, owed = plan.clocks
    _note_speculation(engine, plan.records[2], plan.records[4])
    for i, x in enumerate(engine.instances):
        x.t, x.busy, x.seq_seconds, x.owed = float(t[i]), float(busy[i]), float(seqs[i]), float(owed[i])
        x.version += 1
    engine.preemptions += plan.preemptions
    if len(plan.popped):
        engine.clock = max(plan.now, float(event_t[plan.popped].max()))


def fill(engine, requests, plan: Schedule) -> tuple:
    """The columns filled as the event engine fills its requests once every row ended; (rows in its order of finishes,
    the boundary that ended each, the clock then) as run_batch_boundaries gives them."""
    length, reason, reward, exact = plan.answers[:4]
    rfin0, rfinc, fin, fin_rec, first_rec = plan.records[11:16]
    event_t, after, first_token = plan.clocks[:3]
    ended, ended_at = ended_rows(plan.popped, rfin0, rfinc, fin, after)
    boundary_rank = np.empty(len(event_t), np.int64)
    boundary_rank[plan.popped] = np.arange(len(plan.popped))
    requests.ran_on[:] = plan.inst
    requests.finish_time[ended] = ended_at
    requests.first_token_time[ended] = first_token[first_rec[ended]]
    requests.submit_time[:] = plan.now
    requests.generated[:] = plan.gen
    planned_reward = requests.reward.copy()
    requests.finish_reason[:], requests.reward[:], requests.exact[:] = reason, reward, exact
    requests.natural_len[:], requests.natural_reward[:] = length, reward  # what they would have been unstopped
    if plan.stops is not None:
        _note_stops(engine, requests, plan.stops, planned_reward, length, reward)
    ending = fin_rec[ended]
    return ended, boundary_rank[ending], event_t[ending]


def _note_stops(engine, requests, stops, planned_reward: np.ndarray, length: np.ndarray, reward: np.ndarray) -> None:
    """The stopped rows as the controller leaves a stopped Request (Controller._act): finish reason policy_stop, the
    stop's reason, the reward it gave (else the world's score of what was written, else the one it had), no finish time."""
    from lssim.loop.core import POLICY_STOP

    stopped = stops.at >= 0
    if not stopped.any():
        return
    scored = np.where(requests.generated >= length, reward, engine.workload.reward_scale.low)  # SimEngine.score_partial
    given = np.where(np.isnan(stops.reward), np.where(stops.score, scored, planned_reward), stops.reward)
    requests.reward[stopped] = given[stopped]
    requests.finish_reason[stopped] = POLICY_STOP
    requests.stop_reason[stopped] = stops.reason[stopped]
    requests.finish_time[stopped] = np.nan


def _check_fits(requests, capacity: int) -> None:
    """Every request's prompt and budget fit one instance's KV cache (ValueError naming the first that does not)."""
    prompt, budget = requests.prompt_len, requests.max_tokens
    too_big = np.flatnonzero(prompt + budget > capacity)
    if len(too_big):
        j = int(too_big[0])
        raise ValueError(f"request {int(requests.rid[j])} (prompt {int(requests.prompt_id[j])}) needs "
                         f"{int(prompt[j] + budget[j])} KV tokens; an instance holds {capacity} (raise kv_capacity_tokens "
                         f"or lower max_tokens)")


def _dispatch(requests, n_inst: int, queue: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Least-loaded dispatch from an idle cluster (the j-th unplaced request goes to instance j mod N): each row's
    instance, the rows in the order each instance admits them (by instance, priority, submission), and the order
    the instances were first given work (touched_rank)."""
    m = len(requests)
    pinned = requests.instance
    free = pinned < 0
    inst = np.where(free, 0, pinned % n_inst)
    if queue is None:
        inst[free] = np.arange(int(free.sum())) % n_inst
        return inst, np.lexsort((np.arange(m), requests.priority, inst)), touched_rank(inst, n_inst)
    free_queued = queue[free[queue]]
    inst[free_queued] = np.arange(len(free_queued)) % n_inst
    touched = touched_rank(inst[queue], n_inst)
    queued = requests.priority[queue]
    if len(queued) < 2 or (queued[1:] >= queued[:-1]).all():  # queued in priority order (as the controller does):
        order = queue[stable_argsort(inst[queue])]  # stable by instance: the lexsort below, ~5x quicker
    else:
        submitted = np.empty(m, np.int64)
        submitted[queue] = np.arange(m)  # each row's place in the submission
        order = np.lexsort((submitted, requests.priority, inst))
    return inst, order, touched


def _records(order, inst_start, prompt, gen, length, capacity: int, max_num_seqs: int, n_inst: int, stops=None) -> tuple:
    """structure's records of the rollout (`gen` filled in place), its room grown until they fit; RuntimeError where
    an instance cannot go on. `stops`: (tokens each request is stopped at, -1 never; the checkpoint interval)."""
    room = records_room(len(prompt), n_inst) + (0 if stops is None else checkpoint_room(length, gen, stops[1]))
    start = gen.copy()
    while True:
        gen[:] = start
        if stops is None:
            *records, error = schedule_records(order, inst_start, prompt, gen, length, capacity, max_num_seqs, room)
        else:
            *records, error = schedule_stops(order, inst_start, prompt, gen, length, capacity, max_num_seqs, room, *stops)
        if error != OUT_OF_ROOM:
            break
        room *= 4
    if error >= 0:
        raise RuntimeError(f"instance {error} is idle with waiting requests it cannot admit")
    if error < -1:
        raise RuntimeError(f"batch rollout: instance {-2 - error} needs more than {SEQ_MASK + 1:,} admissions or "
                           f"{MAX_IT:,} iterations in one step, beyond what the batch route's heap keys hold")
    return tuple(records)


def checkpoint_room(length: np.ndarray, gen: np.ndarray, interval: int) -> int:
    """Records and pushes `schedule_stops` makes room for beside `records_room`'s: one of each per checkpoint."""
    return 2 * int(np.maximum(0, length - gen - 1).sum() // interval)


def _answers(engine, requests) -> tuple:
    """Each request's (length, finish reason, reward, exact, trace row, source code) from the Workload, asked once over
    arrays (lssim.traces.workload.lookup_many)."""
    from lssim.traces.workload import EXACT, SOURCES, lookup_coded

    step, sample = engine.workload.request_keys(requests)  # its own step's, or its loader batch's (Request.batch)
    length, reason, reward, source, rows = lookup_coded(engine.workload, step, requests.prompt_id, sample, requests.max_tokens)
    return (np.asarray(length, np.int64), reason, np.asarray(reward, float), source == SOURCES.tolist().index(EXACT),
            np.asarray(rows, np.int64), source)


def count_sources(engine, source: np.ndarray) -> None:
    """The engine's source counts move as SimEngine.submit moves them for requests it answers for the first time."""
    from lssim.traces.workload import SOURCES

    for name, c in zip(SOURCES.tolist(), np.bincount(source, minlength=len(SOURCES)).tolist()):
        if c:
            engine.sources[name] += c


def _note_speculation(engine, rn: np.ndarray, rk: np.ndarray) -> None:
    """SimEngine._run's count of tokens generated while speculation was on, over every span."""
    if not engine._spec_batch:
        return
    on = (rk > 0) & (rn > 0) & (rn <= engine._spec_batch)
    for n in np.unique(rn[on]).tolist():
        if engine.cost.factor(n) < 1.0:
            sel = on & (rn == n)
            engine.speculated_tokens += int((rn[sel] * rk[sel]).sum())
