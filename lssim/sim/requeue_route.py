"""The requeue route: a rollout whose only reactions to single events are requeues at progress checkpoints by seer's
rules (Policy.progress_requeues, lssim.sim.requeue_rules), run whole in one numba kernel (lssim.sim.requeue_loop) and
booked as the batch route books a rollout (lssim.loop.rollout_books.rollout_batch).

A requeue moves a running response to another instance at its checkpoint's time, and where it is admitted there
depends on both instances' clocks, so the instances cannot be scheduled one by one in integers and priced afterwards
as the batch route's kernels do: the kernel runs the event engine's multi-instance loop (lssim.sim.world.SimEngine,
operation for operation) with the controller's handling of each event and the policy's rules inside it, pricing each
span with the roofline as it goes. What it hands back is what the event route leaves: the columns filled as the
event engine fills its Request objects (the latest submission's instance, submit and first-token times), the rows in
the order they ended, the engine's clocks and counters.

Taken where the engine prices with the roofline alone (RooflineCostModel: its aborts cost the caller nothing, its
departures nothing); any other cost model, or speculation, keeps the event route (SimEngine.set_requeue_rollout).
"""

from __future__ import annotations

import itertools

import numpy as np

from lssim.loop.core import LENGTH, STOP
from lssim.sim.fastsim import _answers, _check_fits, count_sources
from lssim.sim.requeue_kernels import (C_ENDED, C_PREEMPT, C_SEQ, F_BUSY, F_OWED, F_SEQS, F_T, I_CTX, I_IT, I_LEFT,
                                       I_LEFT_AT, I_N, I_PENDING, I_VERSION, N_I, N_R, OUT_OF_ROOM, R_EST, R_GEN, R_GROUP,
                                       R_LEARN, R_LENGTH, R_PRIO, R_PROBE, R_PROMPT, R_RAN, R_SEER, R_SLOT, R_WHERE,
                                       RF_FINISH, RF_FIRST, RF_SUBMIT, I_COUNT)
from lssim.sim.requeue_loop import run_requeues


def run_requeued(engine, requests, queue: np.ndarray | None, rules_of) -> np.ndarray:
    """Run `requests` (lssim.loop.columns.RequestColumns, every row placed by the policy; `queue`: the rows in the
    order queued, None: row order) on the idle engine until every one ended, requeued at its checkpoints as
    `rules_of(requests)` (Policy.progress_requeues: lssim.sim.requeue_rules.RequeueRules) says. Returns the rows in
    the order the event route ends them; the columns are filled and the engine moved as it would have."""
    if any(inst.n or inst.pending for inst in engine.instances):
        raise RuntimeError("requeue rollout: the engine must be idle when a submission comes")
    if engine._spec_batch:
        raise RuntimeError("requeue rollout: the engine speculates, which its kernel does not price")
    _check_fits(requests, engine.config.kv_capacity_tokens)
    placed = requests.instance
    if len(placed) and placed.min() < 0:
        raise ValueError("requeue rollout: every request must be placed by the policy (Policy.placements), "
                         f"row {int(np.argmin(placed))} is not")
    answers = _answers(engine, requests)
    rules = rules_of(requests)
    queue = np.arange(len(requests)) if queue is None else queue
    placed = placed % engine.n_instances
    room = _room(answers[0], requests.generated, engine._interval or 0, engine.n_instances)
    while True:
        world = _world(engine, requests, rules, answers, placed, room)
        error = run_requeues(world, queue, placed, float(engine.clock))
        if error != OUT_OF_ROOM:
            break
        room *= 4
    if error:
        raise RuntimeError(f"instance {error - 1} is idle with waiting requests it cannot admit")
    count_sources(engine, answers[5])
    _commit(engine, world)
    _fill(requests, world, answers)
    return world[21][:world[18][C_ENDED]].copy()


def _room(length: np.ndarray, generated: np.ndarray, interval: int, n_inst: int) -> int:
    """Heap entries the kernel makes room for at first: a few per request and per checkpoint (requeues and preemption
    add more; the kernel says when it runs out, and runs again with four times the room)."""
    checkpoints = int(np.maximum(0, length - generated - 1).sum() // interval) if interval else 0
    return 8 * (len(length) + checkpoints) + 64 * n_inst


def _world(engine, requests, rules, answers, placed: np.ndarray, room: int) -> tuple:
    """lssim.sim.requeue_kernels.WORLD for this submission on the engine as it stands."""
    m, n_inst, cfg = len(requests), engine.n_instances, engine.config
    length, reason = answers[0], answers[1]
    groups, group = np.unique(requests.group_id, return_inverse=True)
    r = np.zeros((N_R, m), np.int64)
    r[R_PROMPT], r[R_LENGTH], r[R_PRIO] = requests.prompt_len, length, requests.priority
    r[R_PROBE], r[R_EST], r[R_GROUP] = rules.probe, rules.estimate, group
    r[R_LEARN] = (reason == STOP) | (reason == LENGTH)  # on_finish learns from a response that ended by itself
    r[R_GEN], r[R_SEER] = requests.generated, placed
    r[[R_WHERE, R_SLOT, R_RAN]] = -1  # nowhere yet
    known = np.full(len(groups), -1, np.int64)
    known[group[rules.known]] = rules.estimate[rules.known]
    ii = np.zeros((N_I, n_inst), np.int64)
    f = np.zeros((4, n_inst))
    for i, x in enumerate(engine.instances):
        ii[[I_IT, I_N, I_CTX, I_VERSION, I_PENDING, I_LEFT_AT, I_LEFT], i] = x.it, x.n, x.ctx, x.version, x.pending, \
            x.left_at, x.left
        f[[F_T, F_BUSY, F_SEQS, F_OWED], i] = x.t, x.busy, x.seq_seconds, x.owed
    ii[I_COUNT] = rules.counts
    heap = 2 * room // n_inst + 1024
    config = np.array([cfg.kv_capacity_tokens, cfg.max_num_seqs, engine._interval or 0, rules.rebalance,
                       int(rules.every_chunk), heap, room], np.int64)
    return (r, np.full((3, m), np.nan), ii, f, np.zeros(n_inst * cfg.max_num_seqs, np.int64), np.zeros((3, room), np.int64),
            np.zeros(room), np.zeros(room, np.int64), np.zeros(room, np.int64),
            np.zeros(n_inst * heap), np.zeros(n_inst * heap, np.int64), np.zeros(n_inst * heap, np.int64),
            np.zeros(n_inst * heap), np.zeros(n_inst * heap, np.int64), np.zeros(n_inst * heap, np.int64),
            known, config, engine.cost.kernel_coefficients(), np.zeros(6, np.int64), np.zeros(1),
            np.zeros((3, cfg.max_num_seqs), np.int64), np.zeros(m, np.int64))


def _commit(engine, world: tuple) -> None:
    """The engine as the rollout leaves it: each instance's clocks and counters (every entry of its Python heaps
    stale), the clock, preemptions, and its push counter moved on by the pushes made."""
    ii, f, ctr, clock = world[2], world[3], world[18], world[19]
    for i, x in enumerate(engine.instances):
        x.it, x.n, x.ctx, x.pending = int(ii[I_IT, i]), int(ii[I_N, i]), int(ii[I_CTX, i]), int(ii[I_PENDING, i])
        x.left_at, x.left, x.version = int(ii[I_LEFT_AT, i]), int(ii[I_LEFT, i]), int(ii[I_VERSION, i]) + 1
        x.t, x.busy, x.seq_seconds, x.owed = float(f[F_T, i]), float(f[F_BUSY, i]), float(f[F_SEQS, i]), float(f[F_OWED, i])
        x.priced = (0, 0, 0, 0.0)
    engine.clock = float(clock[0])
    engine.preemptions += int(ctr[C_PREEMPT])
    engine._seq = itertools.count(next(engine._seq) + int(ctr[C_SEQ]))


def _fill(requests, world: tuple, answers: tuple) -> None:
    """The columns as the event engine leaves its Request objects once every row ended."""
    r, rf = world[0], world[1]
    length, reason, reward, exact = answers[:4]
    requests.ran_on[:] = requests.instance[:] = r[R_RAN]
    requests.priority[:] = r[R_PRIO]
    requests.submit_time[:], requests.first_token_time[:], requests.finish_time[:] = rf[RF_SUBMIT], rf[RF_FIRST], \
        rf[RF_FINISH]
    requests.generated[:] = r[R_GEN]
    requests.finish_reason[:], requests.reward[:], requests.exact[:] = reason, reward, exact
    requests.natural_len[:], requests.natural_reward[:] = length, reward
