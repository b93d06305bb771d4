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

from lssim.kernels import BOOL, F64, F64S, I64, I64S, I64S_IN, kernel
from lssim.sim.requeue_kernels import (C_ENDED, C_ERROR, C_EVENTS, C_SEQ, FINISH, G_EVERY, G_REBALANCE, H_BUF, H_ENDED,
                                       H_EV, H_GROUPS, H_I, H_R, H_SL, HF_EV, HF_RF, I_COUNT, I_PENDING, I_VERSION,
                                       N_I, N_INST, N_R, N_RF, R_EPOCH, R_EST, R_GEN, R_GROUP, R_LEARN, R_PRIO, R_PROBE,
                                       R_RAN, R_SEER, R_WHERE, RF_FIRST, RF_SUBMIT, W_CLOCK, abort_on, admit, catch_up,
                                       fire, heap_pop, push_waiting, schedule)
from lssim.sim.requeue_rules import moves_at, rank_at


@kernel(I64S, I64)
def on_finish(wi, row):
    """The books of a response that finished (end_response's order) and the policy's on_finish."""
    rb = wi[H_R] + row * N_R
    wi[wi[H_ENDED] + wi[C_ENDED]] = row
    wi[C_ENDED] += 1
    leave_policy(wi, row)
    if wi[rb + R_LEARN]:
        g = wi[H_GROUPS] + wi[rb + R_GROUP]
        wi[g] = max(wi[g] if wi[g] >= 0 else 0, wi[rb + R_GEN])


@kernel(I64S, I64)
def leave_policy(wi, row):
    """The policy's `_leave`: the row no longer counts on the instance it placed it on."""
    rb = wi[H_R] + row * N_R
    i = wi[rb + R_SEER]
    if i >= 0:
        wi[wi[H_I] + i * N_I + I_COUNT] -= 1
        wi[rb + R_SEER] = -1


@kernel(F64S, I64S, I64)
def on_progress(wf, wi, row):
    """The policy's on_progress at a checkpoint of `row`: requeued where its instance holds `rebalance` more of the
    policy's requests than the least-loaded one (or at every chunk)."""
    i, counts = wi[wi[H_R] + row * N_R + R_SEER], wi[H_I] + I_COUNT
    if i < 0:  # placed by another policy: it keeps its place
        return
    least = wi[counts]
    for j in range(1, wi[N_INST]):
        least = min(least, wi[counts + j * N_I])
    if moves_at(wi[counts + i * N_I], least, wi[G_REBALANCE], wi[G_EVERY] != 0):
        requeue(wf, wi, row)


@kernel(F64S, I64S, I64)
def requeue(wf, wi, row):
    """Controller._act of a requeue: the engine aborts `row`, `order` asks its priority and place, the engine submits
    it there at the clock."""
    rb = wi[H_R] + row * N_R
    i = wi[rb + R_WHERE]
    wi[rb + R_WHERE] = -1
    now = wf[W_CLOCK]  # + cost.abort_time(1): 0 on this route
    abort_on(wf, wi, i, row, now)
    known = wi[wi[H_GROUPS] + wi[rb + R_GROUP]]
    estimate = 0 if wi[rb + R_PROBE] else (known if known >= 0 else wi[rb + R_EST])
    wi[rb + R_PRIO] = rank_at(wi[rb + R_PROBE], wi[rb + R_GEN], estimate)
    submit(wf, wi, row, place(wi, row), now, True)


@kernel(I64S, I64)
def place(wi, row):
    """The policy's place: the instance with the fewest of its requests, ties to the one with the fewest requests in
    the engine (running and waiting), then the first."""
    leave_policy(wi, row)
    best, at = 0, wi[H_I]
    for j in range(1, wi[N_INST]):
        a, b = at + j * N_I, at + best * N_I
        if wi[a + I_COUNT] < wi[b + I_COUNT] or (wi[a + I_COUNT] == wi[b + I_COUNT] and
                                                 wi[a + I_PENDING] < wi[b + I_PENDING]):
            best = j
    wi[at + best * N_I + I_COUNT] += 1
    wi[wi[H_R] + row * N_R + R_SEER] = best
    return best


@kernel(F64S, I64S, I64, I64, F64, BOOL)
def submit(wf, wi, row, i, now, alone):
    """SimEngine.submit of `row` onto instance i at the clock `now` (caught up first); `alone`: a submission of this
    row only (admitted and scheduled at once; a whole submission does that per instance once every row is queued)."""
    rb, fb = wi[H_R] + row * N_R, wi[HF_RF] + row * N_RF
    wi[rb + R_RAN] = i
    if alone:
        catch_up(wf, wi, i, now)
    wf[fb + RF_SUBMIT], wf[fb + RF_FIRST] = now, np.nan
    wi[rb + R_EPOCH] += 1
    seq = wi[C_SEQ]
    wi[C_SEQ] = seq + 1
    push_waiting(wf, wi, i, wi[rb + R_PRIO], seq, wi[rb + R_EPOCH], row)
    wi[wi[H_I] + i * N_I + I_PENDING] += 1
    wi[rb + R_WHERE] = i
    if alone:
        admit(wf, wi, i)
        schedule(wf, wi, i)


@kernel(F64S, I64S, I64S_IN, I64S_IN, F64)
def submit_all(wf, wi, queue, placed, now):
    """SimEngine.submit of the whole submission (`queue`: its rows in the order queued, `placed`: each row's instance):
    each instance caught up when first touched, every row queued, then each touched instance admits and schedules, in
    the order first touched."""
    touched = np.full(wi[N_INST], -1, np.int64)
    order = np.empty(wi[N_INST], np.int64)
    n_touched = 0
    for row in queue:
        i = placed[row]
        if touched[i] < 0:
            catch_up(wf, wi, i, now)
            touched[i] = n_touched
            order[n_touched] = i
            n_touched += 1
        submit(wf, wi, row, i, now, False)
    for j in range(n_touched):
        admit(wf, wi, order[j])
        schedule(wf, wi, order[j])


@kernel(F64S, I64S, I64S_IN, I64S_IN, F64)
def run_requeues(wf, wi, queue, placed, now):
    """The rollout: the submission queued, then boundaries popped until none is left (SimEngine.next_events and the
    controller's events, module docstring). Returns the error counter (0: done)."""
    wf[W_CLOCK] = now
    submit_all(wf, wi, queue, placed, now)
    key_at, entry_at, buf = wi[HF_EV], wi[H_EV], wi[H_BUF]
    while wi[C_EVENTS] > 0 and wi[C_ERROR] == 0:
        t, slot = wf[key_at], wi[H_SL] + 3 * wi[entry_at + 1]
        wi[C_EVENTS] = heap_pop(wf, wi, key_at, entry_at, wi[C_EVENTS])
        i, version, target = wi[slot], wi[slot + 1], wi[slot + 2]
        if version != wi[wi[H_I] + i * N_I + I_VERSION]:
            continue
        if t > wf[W_CLOCK]:
            wf[W_CLOCK] = t
        count = fire(wf, wi, i, target)
        admit(wf, wi, i)
        schedule(wf, wi, i)
        for e in range(count):
            if wi[buf + 2 * e + 1] == FINISH:
                on_finish(wi, wi[buf + 2 * e])
            else:
                on_progress(wf, wi, wi[buf + 2 * e])
    return wi[C_ERROR]
