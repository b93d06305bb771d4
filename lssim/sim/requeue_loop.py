"""The requeue route's event loop (numba): one rollout of a policy that requeues responses at its progress checkpoints
by seer's rules (lssim.sim.requeue_rules, Policy.progress_requeues), run as SimEngine.next_events and the controller's
rollout run it, in one kernel (`run_requeues`) over lssim.sim.requeue_kernels' world.

The controller's side, in its order: each popped boundary fires, admits and schedules (SimEngine.next_events); then
each of its events in turn: a finish ends its response (its row appended to ENDED) and on_finish runs (the policy's
count of its requests on that instance drops; a finish by itself or its budget raises its group's estimate to its
tokens if longer); a checkpoint asks on_progress, which requeues where `moves` says (Controller._act): the engine
aborts the response (SimEngine.abort: catch-up, departure, admissions, schedule), `rank` gives its new priority (the
group's estimate now), placement picks the instance with the fewest of the policy's requests (ties: the fewest
requests in the engine), and SimEngine.submit queues it there at the clock.
"""

from __future__ import annotations

import numpy as np

from lssim.kernels import BOOL, F64, I64, I64S_IN, kernel
from lssim.sim.requeue_kernels import (C_ENDED, C_ERROR, C_EVENTS, FINISH, G_EVERY, G_REBALANCE, I_COUNT, I_PENDING,
                                       I_VERSION, R_EPOCH, R_EST, R_GEN, R_GROUP, R_LEARN, R_PRIO, R_PROBE, R_RAN, R_SEER,
                                       R_WHERE, RF_FIRST, RF_SUBMIT, WORLD, abort_on, admit, catch_up, fire, heap_pop,
                                       push_waiting, schedule, take_seq)
from lssim.sim.requeue_rules import moves_at, rank_at


@kernel(WORLD, I64)
def on_finish(w, row):
    """The books of a response that finished (end_response's order) and the policy's on_finish."""
    r, gk, ctr, ended = w[0], w[15], w[18], w[21]
    ended[ctr[C_ENDED]] = row
    ctr[C_ENDED] += 1
    leave_policy(w, row)
    if r[R_LEARN, row]:
        g = r[R_GROUP, row]
        gk[g] = max(gk[g] if gk[g] >= 0 else 0, r[R_GEN, row])


@kernel(WORLD, I64)
def leave_policy(w, row):
    """The policy's `_leave`: the row no longer counts on the instance it placed it on."""
    r, ii = w[0], w[2]
    i = r[R_SEER, row]
    if i >= 0:
        ii[I_COUNT, i] -= 1
        r[R_SEER, row] = -1


@kernel(WORLD, I64)
def on_progress(w, row):
    """The policy's on_progress at a checkpoint of `row`: requeued where its instance holds `rebalance` more of the
    policy's requests than the least-loaded one (or at every chunk)."""
    r, ii, cfg = w[0], w[2], w[16]
    i = r[R_SEER, row]
    if i < 0:  # placed by another policy: it keeps its place
        return
    least = ii[I_COUNT, 0]
    for j in range(1, ii.shape[1]):
        least = min(least, ii[I_COUNT, j])
    if moves_at(ii[I_COUNT, i], least, cfg[G_REBALANCE], cfg[G_EVERY] != 0):
        requeue(w, row)


@kernel(WORLD, I64)
def requeue(w, row):
    """Controller._act of a requeue: the engine aborts `row`, `order` asks its priority and place, the engine submits
    it there at the clock."""
    r, gk, clock = w[0], w[15], w[19]
    i = r[R_WHERE, row]
    r[R_WHERE, row] = -1
    now = clock[0]  # + cost.abort_time(1): 0 on this route
    abort_on(w, i, row, now)
    g = r[R_GROUP, row]
    estimate = 0 if r[R_PROBE, row] else (gk[g] if gk[g] >= 0 else r[R_EST, row])
    r[R_PRIO, row] = rank_at(r[R_PROBE, row], r[R_GEN, row], estimate)
    target = place(w, row)
    submit(w, row, target, now, True)


@kernel(WORLD, I64)
def place(w, row):
    """The policy's place: the instance with the fewest of its requests, ties to the one with the fewest requests in
    the engine (running and waiting), then the first."""
    ii = w[2]
    leave_policy(w, row)
    best = 0
    for j in range(1, ii.shape[1]):
        if ii[I_COUNT, j] < ii[I_COUNT, best] or (ii[I_COUNT, j] == ii[I_COUNT, best] and
                                                  ii[I_PENDING, j] < ii[I_PENDING, best]):
            best = j
    ii[I_COUNT, best] += 1
    w[0][R_SEER, row] = best
    return best


@kernel(WORLD, I64, I64, F64, BOOL)
def submit(w, row, i, now, alone):
    """SimEngine.submit of `row` onto instance i at the clock `now` (caught up first); `alone`: a submission of this
    row only (admitted and scheduled at once; a whole submission does that per instance once every row is queued)."""
    r, rf, ii = w[0], w[1], w[2]
    r[R_RAN, row] = i
    if alone:
        catch_up(w, i, now)
    rf[RF_SUBMIT, row] = now
    rf[RF_FIRST, row] = np.nan
    r[R_EPOCH, row] += 1
    push_waiting(w, i, r[R_PRIO, row], take_seq(w), r[R_EPOCH, row], row)
    ii[I_PENDING, i] += 1
    r[R_WHERE, row] = i
    if alone:
        admit(w, i)
        schedule(w, i)


@kernel(WORLD, I64S_IN, I64S_IN, F64)
def submit_all(w, queue, placed, now):
    """SimEngine.submit of the whole submission (`queue`: its rows in the order queued, `placed`: each row's instance):
    each instance caught up when first touched, every row queued, then each touched instance admits and schedules, in
    the order first touched."""
    n_inst = w[2].shape[1]
    touched = np.full(n_inst, -1, np.int64)
    order = np.empty(n_inst, np.int64)
    n_touched = 0
    for row in queue:
        i = placed[row]
        if touched[i] < 0:
            catch_up(w, i, now)
            touched[i] = n_touched
            order[n_touched] = i
            n_touched += 1
        submit(w, row, i, now, False)
    for j in range(n_touched):
        admit(w, order[j])
        schedule(w, order[j])


@kernel(WORLD, I64S_IN, I64S_IN, F64)
def run_requeues(w, queue, placed, now):
    """The rollout: the submission queued, then boundaries popped until none is left (SimEngine.next_events and the
    controller's events, module docstring). Returns CTR[C_ERROR] (0: done)."""
    ii, sl, ctr, clock, buf = w[2], w[5], w[18], w[19], w[20]
    clock[0] = now
    submit_all(w, queue, placed, now)
    while ctr[C_EVENTS] > 0 and ctr[C_ERROR] == 0:
        t, slot = w[6][0], w[8][0]
        ctr[C_EVENTS] = heap_pop(w[6], w[7], w[8], 0, ctr[C_EVENTS])
        i, version, target = sl[0, slot], sl[1, slot], sl[2, slot]
        if version != ii[I_VERSION, i]:
            continue
        if t > clock[0]:
            clock[0] = t
        count = fire(w, i, target)
        admit(w, i)
        schedule(w, i)
        for e in range(count):
            if buf[1, e] == FINISH:
                on_finish(w, buf[0, e])
            else:
                on_progress(w, buf[0, e])
    return ctr[C_ERROR]
