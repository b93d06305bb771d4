"""The requeue route's engine (numba): lssim.sim.world.SimEngine's instances, operation for operation, over arrays, for
a rollout run in one kernel (lssim.sim.requeue_loop) because responses move between instances mid-rollout.

The world is two arrays, `wi` (int64) and `wf` (float64), each a header of scalars and offsets (H_*, G_*, C_*) and the
blocks those offsets point at: per row of the submission its request's and its engine entry's numbers (R_* in `wi`,
RF_* in `wf`, N_R and N_RF a row), per instance its counters and clocks (I_*, F_*), the running sequences of each
instance, three heaps of (key in `wf`, seq and slot in `wi`) -- the cluster's events keyed by time, each instance's
finishes and checkpoints keyed by iteration, each instance's queue keyed by priority -- whose entries' payloads are
rows of a slot table, and the counters (SimEngine's push counter `_seq` among them, so ties break as there). Two
arrays, not a tuple of many, because a compiled call counts references to every array it is handed (atomics that
cost more than the work). Keys are exact in float64 (iterations and priorities are ints below 2**53). The cost model is
the roofline's, priced as it schedules (lssim.cost.roofline_arrays); its departures cost nothing.
"""

from __future__ import annotations

import numpy as np

from lssim.cost.roofline_arrays import decode_time_at, iterations_within_at
from lssim.kernels import F64, F64S, I64, I64S, kernel

# wi's header: its blocks' offsets, wf's (HF_*), config, counters
H_R, H_I, H_RS, H_SL, H_EV, H_RUN, H_WAIT, H_GROUPS, H_BUF, H_ENDED, HF_RF, HF_I, HF_EV, HF_RUN, HF_WAIT, N_INST, G_KV, \
    G_SEQS, G_INTERVAL, G_REBALANCE, G_EVERY, G_HEAP, G_ROOM, C_SEQ, C_SLOTS, C_PREEMPT, C_ENDED, C_EVENTS, \
    C_ERROR = range(29)
N_HEADER = 29
# wf's header: the roofline's coefficients (RooflineCostModel.kernel_coefficients: mem_a .. ov, pf_a, pf_w), the clock
W_COST, W_CLOCK = 0, 7
N_HEADER_F = 8
# a row: prompt, target length, priority, probe, estimate, group, epoch, engine instance (-1: none), the policy's
# instance (-1: none), admission iteration, tokens then, queue priority and arrival while running, place in its
# instance's running set (-1: not running), tokens generated, instance of its latest submission, whether its finish
# teaches its group's estimate
R_PROMPT, R_LENGTH, R_PRIO, R_PROBE, R_EST, R_GROUP, R_EPOCH, R_WHERE, R_SEER, R_ADMIT, R_GEN0, R_MPRIO, R_ARRIVAL, \
    R_SLOT, R_GEN, R_RAN, R_LEARN = range(17)
N_R = 17
RF_SUBMIT, RF_FIRST, RF_FINISH = range(3)  # a row's submit, first token and finish times
N_RF = 3
# an instance: SimEngine._Instance's fields, the policy's count of its requests there, its heaps' sizes, its running set
I_IT, I_N, I_CTX, I_VERSION, I_PENDING, I_LEFT_AT, I_LEFT, I_COUNT, I_RUN, I_WAIT, I_MEMBERS = range(11)
N_I = 11
F_T, F_BUSY, F_SEQS, F_OWED = range(4)
N_F = 4
FINISH, CHECKPOINT = 0, 1  # a running heap entry's kind
OUT_OF_ROOM = -1  # C_ERROR: a heap or the slot table is full (run again with more room); i + 1: instance i is stuck


@kernel(F64S, I64S, I64, I64, I64, F64, I64, I64)
def heap_push(wf, wi, key_at, entry_at, size, a, b, p):
    """Push (a, b) with payload p on the binary min-heap of `size` entries whose keys are wf[key_at:] and whose
    (seq, payload) pairs are wi[entry_at:]; the new size."""
    i = size
    while i > 0:
        q = (i - 1) // 2
        if wf[key_at + q] < a or (wf[key_at + q] == a and wi[entry_at + 2 * q] < b):
            break
        wf[key_at + i] = wf[key_at + q]
        wi[entry_at + 2 * i], wi[entry_at + 2 * i + 1] = wi[entry_at + 2 * q], wi[entry_at + 2 * q + 1]
        i = q
    wf[key_at + i] = a
    wi[entry_at + 2 * i], wi[entry_at + 2 * i + 1] = b, p
    return size + 1


@kernel(F64S, I64S, I64, I64, I64)
def heap_pop(wf, wi, key_at, entry_at, size):
    """Remove the top of the heap at wf[key_at:], wi[entry_at:] (read it before); the new size."""
    size -= 1
    a, b, p = wf[key_at + size], wi[entry_at + 2 * size], wi[entry_at + 2 * size + 1]
    i = 0
    while True:
        c = 2 * i + 1
        if c >= size:
            break
        if c + 1 < size and (wf[key_at + c + 1] < wf[key_at + c] or (
                wf[key_at + c + 1] == wf[key_at + c] and wi[entry_at + 2 * c + 2] < wi[entry_at + 2 * c])):
            c += 1
        if a < wf[key_at + c] or (a == wf[key_at + c] and b <= wi[entry_at + 2 * c]):
            break
        wf[key_at + i] = wf[key_at + c]
        wi[entry_at + 2 * i], wi[entry_at + 2 * i + 1] = wi[entry_at + 2 * c], wi[entry_at + 2 * c + 1]
        i = c
    wf[key_at + i] = a
    wi[entry_at + 2 * i], wi[entry_at + 2 * i + 1] = b, p
    return size


@kernel(I64S, I64, I64, I64)
def new_slot(wi, a, b, c):
    """A slot table row (a, b, c) for a heap entry's payload; -1 where the table is full."""
    slot = wi[C_SLOTS]
    if slot >= wi[G_ROOM]:
        wi[C_ERROR] = OUT_OF_ROOM
        return -1
    at = wi[H_SL] + 3 * slot
    wi[at], wi[at + 1], wi[at + 2] = a, b, c
    wi[C_SLOTS] = slot + 1
    return slot


@kernel(F64S, I64S, I64, I64, F64, I64, I64)
def push_on(wf, wi, heap, i, key, seq, slot):
    """Push (key, seq, slot) on instance i's running heap (heap H_RUN) or queue (H_WAIT), if it has room."""
    size_at = wi[H_I] + i * N_I + (I_RUN if heap == H_RUN else I_WAIT)
    if slot < 0 or wi[size_at] >= wi[G_HEAP]:
        wi[C_ERROR] = OUT_OF_ROOM
        return
    base = i * wi[G_HEAP]
    wi[size_at] = heap_push(wf, wi, wi[HF_RUN if heap == H_RUN else HF_WAIT] + base, wi[heap] + 2 * base, wi[size_at],
                            key, seq, slot)


@kernel(F64S, I64S, I64, I64)
def pop_from(wf, wi, heap, i):
    """Remove the top of instance i's running heap (H_RUN) or queue (H_WAIT)."""
    size_at = wi[H_I] + i * N_I + (I_RUN if heap == H_RUN else I_WAIT)
    base = i * wi[G_HEAP]
    wi[size_at] = heap_pop(wf, wi, wi[HF_RUN if heap == H_RUN else HF_WAIT] + base, wi[heap] + 2 * base, wi[size_at])


@kernel(F64S, I64S, I64, I64, I64, I64, I64)
def push_running(wf, wi, i, at_it, kind, epoch, row):
    """SimEngine pushes a finish or checkpoint of `row` at iteration `at_it` onto instance i's running heap."""
    seq = wi[C_SEQ]
    wi[C_SEQ] = seq + 1
    push_on(wf, wi, H_RUN, i, float(at_it), seq, new_slot(wi, kind, epoch, row))


@kernel(F64S, I64S, I64, I64, I64, I64, I64)
def push_waiting(wf, wi, i, priority, arrival, epoch, row):
    """SimEngine queues `row` on instance i at (priority, arrival) with its epoch."""
    push_on(wf, wi, H_WAIT, i, float(priority), arrival, new_slot(wi, row, epoch, 0))


@kernel(F64S, I64S, I64, I64)
def decode_time(wf, wi, i, k):
    """cost.decode_time of k iterations of instance i's batch as it stands."""
    at, c = wi[H_I] + i * N_I, W_COST
    return decode_time_at(wi[at + I_N], wi[at + I_CTX], k, wf[c], wf[c + 1], wf[c + 2], wf[c + 3], wf[c + 4])


@kernel(F64S, I64S, I64, I64)
def run_iterations(wf, wi, i, k):
    """SimEngine._run: k decode iterations of instance i's batch."""
    if k <= 0:
        return
    at, ft = wi[H_I] + i * N_I, wi[HF_I] + i * N_F
    n = wi[at + I_N]
    dt = decode_time(wf, wi, i, k) + wf[ft + F_OWED]
    wf[ft + F_OWED] = 0.0
    wf[ft + F_T] += dt
    wf[ft + F_BUSY] += dt
    wf[ft + F_SEQS] += n * dt
    wi[at + I_CTX] += n * k
    wi[at + I_IT] += k


@kernel(F64S, I64S, I64)
def next_iteration(wf, wi, i):
    """SimEngine._next_iteration: the boundary of instance i's next finish or checkpoint, or its cache filling up."""
    at, key_at, entry_at = wi[H_I] + i * N_I, wi[HF_RUN] + i * wi[G_HEAP], wi[H_RUN] + 2 * i * wi[G_HEAP]
    while wi[at + I_RUN] > 0:  # stale tops (their row moved on) dropped
        slot = wi[H_SL] + 3 * wi[entry_at + 1]
        if wi[slot + 1] == wi[wi[H_R] + wi[slot + 2] * N_R + R_EPOCH]:
            break
        pop_from(wf, wi, H_RUN, i)
    n = wi[at + I_N]
    if not n:
        return wi[at + I_IT]
    overflow = wi[at + I_IT] + (wi[G_KV] - wi[at + I_CTX]) // n
    return min(np.int64(wf[key_at]), overflow)


@kernel(F64S, I64S, I64, F64)
def catch_up(wf, wi, i, now):
    """SimEngine._catch_up: instance i to the last iteration boundary at or before `now`, short of its next event."""
    at, ft = wi[H_I] + i * N_I, wi[HF_I] + i * N_F
    if wi[at + I_N] == 0:
        wf[ft + F_T] = max(wf[ft + F_T], now)
        return
    if wf[ft + F_T] + wf[ft + F_OWED] >= now:
        return
    k = iterations_within_at(wi[at + I_N], wi[at + I_CTX], now - wf[ft + F_T] - wf[ft + F_OWED],
                             wf[W_COST], wf[W_COST + 1], wf[W_COST + 2], wf[W_COST + 3], wf[W_COST + 4])
    nxt = next_iteration(wf, wi, i)
    run_iterations(wf, wi, i, min(k, nxt - wi[at + I_IT] - 1))


@kernel(F64S, I64S, I64)
def schedule(wf, wi, i):
    """SimEngine._schedule: instance i's next event onto the cluster's heap (its older ones go stale)."""
    at, ft = wi[H_I] + i * N_I, wi[HF_I] + i * N_F
    wi[at + I_VERSION] += 1
    if wi[at + I_N] == 0:
        if wi[at + I_WAIT]:
            wi[C_ERROR] = i + 1
        return
    target = next_iteration(wf, wi, i)
    t = wf[ft + F_T] + wf[ft + F_OWED] + decode_time(wf, wi, i, target - wi[at + I_IT])
    seq = wi[C_SEQ]
    wi[C_SEQ] = seq + 1
    slot = new_slot(wi, i, wi[at + I_VERSION], target)
    if slot < 0 or wi[C_EVENTS] >= wi[G_ROOM]:
        wi[C_ERROR] = OUT_OF_ROOM
        return
    wi[C_EVENTS] = heap_push(wf, wi, wi[HF_EV], wi[H_EV], wi[C_EVENTS], t, seq, slot)


@kernel(F64S, I64S, I64, I64)
def depart(wf, wi, i, k):
    """SimEngine._depart: k sequences left instance i's batch at this boundary (the roofline prices no re-pack)."""
    at, ft = wi[H_I] + i * N_I, wi[HF_I] + i * N_F
    if not wi[at + I_N]:
        wf[ft + F_OWED] = 0.0
        return
    before = wi[at + I_LEFT] if wi[at + I_LEFT_AT] == wi[at + I_IT] else 0
    wi[at + I_LEFT_AT], wi[at + I_LEFT] = wi[at + I_IT], before + k
    wf[ft + F_OWED] += 0.0 - 0.0  # departure_time(before + k) - departure_time(before): 0 in the roofline


@kernel(I64S, I64, I64)
def join_batch(wi, i, row):
    """`row` joins instance i's running set."""
    at, rb = wi[H_I] + i * N_I, wi[H_R] + row * N_R
    place = wi[at + I_MEMBERS]
    wi[wi[H_RS] + i * wi[G_SEQS] + place] = row
    wi[rb + R_SLOT] = place
    wi[at + I_MEMBERS] = place + 1


@kernel(I64S, I64, I64)
def leave_batch(wi, i, row):
    """`row` leaves instance i's running set (the last one takes its place); its tokens now (R_GEN), returned. The
    caller moves n, ctx and pending, as the engine does."""
    at, rb, rs = wi[H_I] + i * N_I, wi[H_R] + row * N_R, wi[H_RS] + i * wi[G_SEQS]
    place = wi[rb + R_SLOT]
    last = wi[rs + wi[at + I_MEMBERS] - 1]
    wi[rs + place] = last
    wi[wi[H_R] + last * N_R + R_SLOT] = place
    wi[rb + R_SLOT] = -1
    wi[at + I_MEMBERS] -= 1
    generated = wi[rb + R_GEN0] + (wi[at + I_IT] - wi[rb + R_ADMIT])
    wi[rb + R_GEN] = generated
    return generated


@kernel(F64S, I64S, I64, I64, I64)
def push_checkpoint(wf, wi, i, row, epoch):
    """SimEngine._push_checkpoint: `row`'s next progress checkpoint on instance i, if below its length."""
    interval, rb = wi[G_INTERVAL], wi[H_R] + row * N_R
    if not interval:
        return
    generated = wi[rb + R_GEN0] + (wi[wi[H_I] + i * N_I + I_IT] - wi[rb + R_ADMIT])
    nxt = (generated // interval + 1) * interval
    if nxt < wi[rb + R_LENGTH]:
        push_running(wf, wi, i, wi[rb + R_ADMIT] + (nxt - wi[rb + R_GEN0]), CHECKPOINT, epoch, row)


@kernel(F64S, I64S, I64, I64)
def fire(wf, wi, i, target):
    """SimEngine._fire: instance i runs to the boundary `target`; its finishes and checkpoints there, in heap order,
    into the boundary's buffer (row, kind); departures and preemption as the engine runs them. Returns how many."""
    at = wi[H_I] + i * N_I
    run_iterations(wf, wi, i, target - wi[at + I_IT])
    it, t, key_at, entry_at = wi[at + I_IT], wf[wi[HF_I] + i * N_F + F_T], wi[HF_RUN] + i * wi[G_HEAP], \
        wi[H_RUN] + 2 * i * wi[G_HEAP]
    n, ctx, pending, count, buf = wi[at + I_N], wi[at + I_CTX], wi[at + I_PENDING], 0, wi[H_BUF]
    while wi[at + I_RUN] > 0 and wf[key_at] <= it:
        slot = wi[H_SL] + 3 * wi[entry_at + 1]
        pop_from(wf, wi, H_RUN, i)
        kind, epoch, row = wi[slot], wi[slot + 1], wi[slot + 2]
        rb = wi[H_R] + row * N_R
        if epoch != wi[rb + R_EPOCH]:
            continue
        if kind == FINISH:
            generated = leave_batch(wi, i, row)
            wf[wi[HF_RF] + row * N_RF + RF_FINISH] = t
            wi[rb + R_WHERE], wi[rb + R_EPOCH] = -1, epoch + 1
            n -= 1
            pending -= 1
            ctx -= wi[rb + R_PROMPT] + generated
        else:
            wi[rb + R_GEN] = wi[rb + R_GEN0] + (it - wi[rb + R_ADMIT])
            push_checkpoint(wf, wi, i, row, epoch)
        wi[buf + 2 * count], wi[buf + 2 * count + 1] = row, kind
        count += 1
    left = wi[at + I_N] - n
    wi[at + I_N], wi[at + I_CTX], wi[at + I_PENDING] = n, ctx, pending
    if left:
        depart(wf, wi, i, left)
    if n and wi[G_KV] - ctx < n:
        preempt(wf, wi, i)
    return count


@kernel(F64S, I64S, I64)
def preempt(wf, wi, i):
    """SimEngine._preempt: free KV by recompute, the lowest-priority latest-admitted sequences back to the queue."""
    at, rs, r = wi[H_I] + i * N_I, wi[H_RS] + i * wi[G_SEQS], wi[H_R]
    while wi[at + I_N] and wi[G_KV] - wi[at + I_CTX] < wi[at + I_N]:
        victim = wi[rs]
        for place in range(1, wi[at + I_MEMBERS]):
            row = wi[rs + place]
            a, b = r + row * N_R, r + victim * N_R
            if wi[a + R_MPRIO] > wi[b + R_MPRIO] or (wi[a + R_MPRIO] == wi[b + R_MPRIO] and
                                                     wi[a + R_ARRIVAL] > wi[b + R_ARRIVAL]):
                victim = row
        vb = r + victim * N_R
        generated = leave_batch(wi, i, victim)
        wi[at + I_N] -= 1
        wi[at + I_CTX] -= wi[vb + R_PROMPT] + generated
        wi[vb + R_EPOCH] += 1
        push_waiting(wf, wi, i, wi[vb + R_MPRIO], wi[vb + R_ARRIVAL], wi[vb + R_EPOCH], victim)
        wi[C_PREEMPT] += 1


@kernel(F64S, I64S, I64)
def admit(wf, wi, i):
    """SimEngine._admit: instance i admits from its queue in (priority, arrival) order while the cache holds the
    admitted and the next iteration's tokens; their prefill and first tokens."""
    at, ft, key_at, entry_at = wi[H_I] + i * N_I, wi[HF_I] + i * N_F, wi[HF_WAIT] + i * wi[G_HEAP], \
        wi[H_WAIT] + 2 * i * wi[G_HEAP]
    n, ctx, prefill, admitted, adm = wi[at + I_N], wi[at + I_CTX], 0, 0, wi[H_BUF] + 2 * wi[G_SEQS]
    while wi[at + I_WAIT] > 0 and n < wi[G_SEQS]:
        slot = wi[H_SL] + 3 * wi[entry_at + 1]
        row, epoch = wi[slot], wi[slot + 1]
        rb = wi[H_R] + row * N_R
        if epoch != wi[rb + R_EPOCH]:
            pop_from(wf, wi, H_WAIT, i)
            continue
        generated = wi[rb + R_GEN]
        need = wi[rb + R_PROMPT] + generated
        if ctx + need + n + 1 > wi[G_KV]:
            break
        wi[rb + R_MPRIO], wi[rb + R_ARRIVAL] = np.int64(wf[key_at]), wi[entry_at]
        pop_from(wf, wi, H_WAIT, i)
        n += 1
        ctx += need
        prefill += need
        wi[rb + R_ADMIT], wi[rb + R_GEN0] = wi[at + I_IT], generated
        join_batch(wi, i, row)
        wi[adm + admitted] = row
        admitted += 1
        push_running(wf, wi, i, wi[at + I_IT] + max(0, wi[rb + R_LENGTH] - generated), FINISH, epoch, row)
        push_checkpoint(wf, wi, i, row, epoch)
    wi[at + I_N], wi[at + I_CTX] = n, ctx
    if prefill:
        dt = wf[W_COST + 5] * prefill + wf[W_COST + 6]
        wf[ft + F_T] += dt
        wf[ft + F_BUSY] += dt
        first_token = wf[ft + F_T] + decode_time(wf, wi, i, 1)
        for j in range(admitted):
            first_at = wi[HF_RF] + wi[adm + j] * N_RF + RF_FIRST
            if wf[first_at] != wf[first_at]:  # NaN: not set since this submission
                wf[first_at] = first_token


@kernel(F64S, I64S, I64, I64, F64)
def abort_on(wf, wi, i, row, now):
    """SimEngine._abort_on of one request (`row`, on instance i, at clock `now`), then its _schedule."""
    at, ft, rb = wi[H_I] + i * N_I, wi[HF_I] + i * N_F, wi[H_R] + row * N_R
    if not wi[at + I_N] or decode_time(wf, wi, i, 1) <= now - wf[ft + F_T] - wf[ft + F_OWED]:
        catch_up(wf, wi, i, now)
    wi[rb + R_EPOCH] += 1
    wi[at + I_PENDING] -= 1
    if wi[rb + R_SLOT] >= 0:  # running
        generated = leave_batch(wi, i, row)
        wi[at + I_N] -= 1
        wi[at + I_CTX] -= wi[rb + R_PROMPT] + generated
        depart(wf, wi, i, 1)
    if wi[at + I_WAIT]:
        admit(wf, wi, i)
    schedule(wf, wi, i)
