"""The requeue route's engine (numba): lssim.sim.world.SimEngine's instances, operation for operation, over arrays, for
a rollout run in one kernel (lssim.sim.requeue_loop) because responses move between instances mid-rollout.

The world is one tuple (`WORLD`) of arrays, columns named below: per row of the submission its request's and its
engine entry's numbers (`R`, `RF`), per instance its clocks and counters (`II`, `IF`), the running sequences of each
instance (`RS`, `R_SLOT` a row's place there), three heaps of (key, seq, slot) -- the cluster's events keyed by time,
each instance's finishes and checkpoints keyed by iteration, each instance's queue keyed by priority -- whose entries'
payloads are rows of a slot table (`SL`), and the counters (`CTR`: SimEngine's push counter `_seq` among them, so ties
break as there). Keys are exact in float64 (times are floats; iterations and priorities are ints below 2**53). The
cost model is the roofline's, priced as it schedules (lssim.cost.roofline_arrays); its departures cost nothing.
"""

from __future__ import annotations

import numpy as np

from lssim.cost.roofline_arrays import decode_time_at, iterations_within_at
from lssim.kernels import F64, F64S, F64S_2D, I64, I64S, I64S_2D, kernel, tuple_of

# rows (R): prompt, target length, priority, probe, estimate, group, epoch, engine instance (-1: none), the policy's
# instance (-1: none), admission iteration, tokens then, queue priority and arrival while running, place in RS (-1: not
# running), tokens generated, instance of its latest submission, whether its finish teaches its group's estimate
R_PROMPT, R_LENGTH, R_PRIO, R_PROBE, R_EST, R_GROUP, R_EPOCH, R_WHERE, R_SEER, R_ADMIT, R_GEN0, R_MPRIO, R_ARRIVAL, \
    R_SLOT, R_GEN, R_RAN, R_LEARN = range(17)
N_R = 17
RF_SUBMIT, RF_FIRST, RF_FINISH = range(3)  # RF: submit, first token and finish times
# instances (II, IF): SimEngine._Instance's fields, the policy's count of its requests there, the heaps' sizes,
# the rows in its running set
I_IT, I_N, I_CTX, I_VERSION, I_PENDING, I_LEFT_AT, I_LEFT, I_COUNT, I_RUN, I_WAIT, I_MEMBERS = range(11)
N_I = 11
F_T, F_BUSY, F_SEQS, F_OWED = range(4)
# config (CFG) and counters (CTR)
G_KV, G_SEQS, G_INTERVAL, G_REBALANCE, G_EVERY, G_HEAP, G_ROOM = range(7)
C_SEQ, C_SLOTS, C_PREEMPT, C_ENDED, C_EVENTS, C_ERROR = range(6)
FINISH, CHECKPOINT = 0, 1  # a running heap entry's kind
OUT_OF_ROOM = -1  # CTR[C_ERROR]: a heap or the slot table is full (run again with more room); i + 1: instance i stuck

WORLD = tuple_of(I64S_2D, F64S_2D, I64S_2D, F64S_2D, I64S, I64S_2D, F64S, I64S, I64S, F64S, I64S, I64S, F64S, I64S, I64S,
                 I64S, I64S, F64S, I64S, F64S, I64S_2D, I64S)
# R, RF, II, IF, RS, SL, event heap (time, seq, slot), running heaps, waiting heaps, group estimates (GK), CFG, COST,
# CTR, CLOCK, BUF (a boundary's events: row, kind; then the rows an admission admitted), ENDED (rows in ending order)


@kernel(F64S, I64S, I64S, I64, I64, F64, I64, I64)
def heap_push(k1, k2, pay, base, size, a, b, p):
    """Push (a, b) with payload p on the binary min-heap at k1[base:], k2, pay of `size` entries; the new size."""
    i = size
    while i > 0:
        q = (i - 1) // 2
        if k1[base + q] < a or (k1[base + q] == a and k2[base + q] < b):
            break
        k1[base + i], k2[base + i], pay[base + i] = k1[base + q], k2[base + q], pay[base + q]
        i = q
    k1[base + i], k2[base + i], pay[base + i] = a, b, p
    return size + 1


@kernel(F64S, I64S, I64S, I64, I64)
def heap_pop(k1, k2, pay, base, size):
    """Remove the top of the heap at k1[base:] (read it before); the new size."""
    size -= 1
    a, b, p = k1[base + size], k2[base + size], pay[base + size]
    i = 0
    while True:
        c = 2 * i + 1
        if c >= size:
            break
        if c + 1 < size and (k1[base + c + 1] < k1[base + c] or
                             (k1[base + c + 1] == k1[base + c] and k2[base + c + 1] < k2[base + c])):
            c += 1
        if a < k1[base + c] or (a == k1[base + c] and b <= k2[base + c]):
            break
        k1[base + i], k2[base + i], pay[base + i] = k1[base + c], k2[base + c], pay[base + c]
        i = c
    k1[base + i], k2[base + i], pay[base + i] = a, b, p
    return size


@kernel(WORLD)
def take_seq(w):
    """SimEngine's next(self._seq): the push counter that breaks ties in every heap."""
    ctr = w[18]
    seq = ctr[C_SEQ]
    ctr[C_SEQ] = seq + 1
    return seq


@kernel(WORLD, I64, I64, I64)
def new_slot(w, a, b, c):
    """A slot table row (a, b, c) for a heap entry's payload; -1 where the table is full."""
    sl, ctr = w[5], w[18]
    slot = ctr[C_SLOTS]
    if slot >= sl.shape[1]:
        ctr[C_ERROR] = OUT_OF_ROOM
        return -1
    sl[0, slot], sl[1, slot], sl[2, slot] = a, b, c
    ctr[C_SLOTS] = slot + 1
    return slot


@kernel(WORLD, I64, I64, I64, I64, I64)
def push_running(w, i, at_it, kind, epoch, row):
    """SimEngine pushes a finish or checkpoint of `row` at iteration `at_it` onto instance i's running heap."""
    ii, cfg, ctr = w[2], w[16], w[18]
    seq = take_seq(w)
    slot = new_slot(w, kind, epoch, row)
    if slot < 0 or ii[I_RUN, i] >= cfg[G_HEAP]:
        ctr[C_ERROR] = OUT_OF_ROOM
        return
    ii[I_RUN, i] = heap_push(w[9], w[10], w[11], i * cfg[G_HEAP], ii[I_RUN, i], float(at_it), seq, slot)


@kernel(WORLD, I64, I64, I64, I64, I64)
def push_waiting(w, i, priority, arrival, epoch, row):
    """SimEngine queues `row` on instance i at (priority, arrival) with its epoch."""
    ii, cfg, ctr = w[2], w[16], w[18]
    slot = new_slot(w, row, epoch, 0)
    if slot < 0 or ii[I_WAIT, i] >= cfg[G_HEAP]:
        ctr[C_ERROR] = OUT_OF_ROOM
        return
    ii[I_WAIT, i] = heap_push(w[12], w[13], w[14], i * cfg[G_HEAP], ii[I_WAIT, i], float(priority), arrival, slot)


@kernel(WORLD, I64, I64)
def decode_time(w, i, k):
    """cost.decode_time of k iterations of instance i's batch as it stands."""
    ii, cost = w[2], w[17]
    return decode_time_at(ii[I_N, i], ii[I_CTX, i], k, cost[0], cost[1], cost[2], cost[3], cost[4])


@kernel(WORLD, I64, I64)
def run_iterations(w, i, k):
    """SimEngine._run: k decode iterations of instance i's batch."""
    if k <= 0:
        return
    ii, f = w[2], w[3]
    n = ii[I_N, i]
    dt = decode_time(w, i, k) + f[F_OWED, i]
    f[F_OWED, i] = 0.0
    f[F_T, i] += dt
    f[F_BUSY, i] += dt
    f[F_SEQS, i] += n * dt
    ii[I_CTX, i] += n * k
    ii[I_IT, i] += k


@kernel(WORLD, I64)
def next_iteration(w, i):
    """SimEngine._next_iteration: the boundary of instance i's next finish or checkpoint, or its cache filling up."""
    r, ii, sl, cfg = w[0], w[2], w[5], w[16]
    base, pay = i * cfg[G_HEAP], w[11]
    while ii[I_RUN, i] > 0 and sl[1, pay[base]] != r[R_EPOCH, sl[2, pay[base]]]:  # stale: the row moved on
        ii[I_RUN, i] = heap_pop(w[9], w[10], pay, base, ii[I_RUN, i])
    n = ii[I_N, i]
    if not n:
        return ii[I_IT, i]
    overflow = ii[I_IT, i] + (cfg[G_KV] - ii[I_CTX, i]) // n
    return min(np.int64(w[9][base]), overflow)


@kernel(WORLD, I64, F64)
def catch_up(w, i, now):
    """SimEngine._catch_up: instance i to the last iteration boundary at or before `now`, short of its next event."""
    ii, f, cost = w[2], w[3], w[17]
    if ii[I_N, i] == 0:
        f[F_T, i] = max(f[F_T, i], now)
        return
    if f[F_T, i] + f[F_OWED, i] >= now:
        return
    k = iterations_within_at(ii[I_N, i], ii[I_CTX, i], now - f[F_T, i] - f[F_OWED, i], cost)
    nxt = next_iteration(w, i)
    run_iterations(w, i, min(k, nxt - ii[I_IT, i] - 1))


@kernel(WORLD, I64)
def schedule(w, i):
    """SimEngine._schedule: instance i's next event onto the cluster's heap (its older ones go stale)."""
    ii, f, ctr = w[2], w[3], w[18]
    ii[I_VERSION, i] += 1
    if ii[I_N, i] == 0:
        if ii[I_WAIT, i]:
            ctr[C_ERROR] = i + 1
        return
    target = next_iteration(w, i)
    t = f[F_T, i] + f[F_OWED, i] + decode_time(w, i, target - ii[I_IT, i])
    seq = take_seq(w)
    slot = new_slot(w, i, ii[I_VERSION, i], target)
    if slot < 0 or ctr[C_EVENTS] >= len(w[6]):
        ctr[C_ERROR] = OUT_OF_ROOM
        return
    ctr[C_EVENTS] = heap_push(w[6], w[7], w[8], 0, ctr[C_EVENTS], t, seq, slot)


@kernel(WORLD, I64, I64)
def depart(w, i, k):
    """SimEngine._depart: k sequences left instance i's batch at this boundary (the roofline prices no re-pack)."""
    ii, f = w[2], w[3]
    if not ii[I_N, i]:
        f[F_OWED, i] = 0.0
        return
    before = ii[I_LEFT, i] if ii[I_LEFT_AT, i] == ii[I_IT, i] else 0
    ii[I_LEFT_AT, i], ii[I_LEFT, i] = ii[I_IT, i], before + k
    f[F_OWED, i] += 0.0 - 0.0  # departure_time(before + k) - departure_time(before): 0 in the roofline


@kernel(WORLD, I64, I64)
def join_batch(w, i, row):
    """`row` joins instance i's running set (`RS`)."""
    r, ii, rs, cfg = w[0], w[2], w[4], w[16]
    at = ii[I_MEMBERS, i]
    rs[i * cfg[G_SEQS] + at] = row
    r[R_SLOT, row] = at
    ii[I_MEMBERS, i] = at + 1


@kernel(WORLD, I64, I64)
def leave_batch(w, i, row):
    """`row` leaves instance i's running set (the last one takes its place); its tokens now (R_GEN), returned. The
    caller moves n, ctx and pending, as the engine does."""
    r, ii, rs, cfg = w[0], w[2], w[4], w[16]
    base, at = i * cfg[G_SEQS], r[R_SLOT, row]
    last = rs[base + ii[I_MEMBERS, i] - 1]
    rs[base + at] = last
    r[R_SLOT, last] = at
    r[R_SLOT, row] = -1
    ii[I_MEMBERS, i] -= 1
    generated = r[R_GEN0, row] + (ii[I_IT, i] - r[R_ADMIT, row])
    r[R_GEN, row] = generated
    return generated


@kernel(WORLD, I64, I64, I64)
def push_checkpoint(w, i, row, epoch):
    """SimEngine._push_checkpoint: `row`'s next progress checkpoint on instance i, if below its length."""
    r, ii, cfg = w[0], w[2], w[16]
    interval = cfg[G_INTERVAL]
    if not interval:
        return
    generated = r[R_GEN0, row] + (ii[I_IT, i] - r[R_ADMIT, row])
    nxt = (generated // interval + 1) * interval
    if nxt < r[R_LENGTH, row]:
        push_running(w, i, r[R_ADMIT, row] + (nxt - r[R_GEN0, row]), CHECKPOINT, epoch, row)


@kernel(WORLD, I64, I64)
def fire(w, i, target):
    """SimEngine._fire: instance i runs to the boundary `target`; its finishes and checkpoints there, in heap order,
    into BUF (row, kind); departures and preemption as the engine runs them. Returns how many."""
    r, rf, ii, f, sl, cfg, buf = w[0], w[1], w[2], w[3], w[5], w[16], w[20]
    run_iterations(w, i, target - ii[I_IT, i])
    it, t, base, pay = ii[I_IT, i], f[F_T, i], i * cfg[G_HEAP], w[11]
    n, ctx, pending, count = ii[I_N, i], ii[I_CTX, i], ii[I_PENDING, i], 0
    while ii[I_RUN, i] > 0 and w[9][base] <= it:
        slot = pay[base]
        ii[I_RUN, i] = heap_pop(w[9], w[10], pay, base, ii[I_RUN, i])
        kind, epoch, row = sl[0, slot], sl[1, slot], sl[2, slot]
        if epoch != r[R_EPOCH, row]:
            continue
        if kind == FINISH:
            generated = leave_batch(w, i, row)
            rf[RF_FINISH, row] = t
            r[R_WHERE, row] = -1
            r[R_EPOCH, row] = epoch + 1
            n -= 1
            pending -= 1
            ctx -= r[R_PROMPT, row] + generated
        else:
            r[R_GEN, row] = r[R_GEN0, row] + (it - r[R_ADMIT, row])
            push_checkpoint(w, i, row, epoch)
        buf[0, count], buf[1, count] = row, kind
        count += 1
    left = ii[I_N, i] - n
    ii[I_N, i], ii[I_CTX, i], ii[I_PENDING, i] = n, ctx, pending
    if left:
        depart(w, i, left)
    if n and cfg[G_KV] - ctx < n:
        preempt(w, i)
    return count


@kernel(WORLD, I64)
def preempt(w, i):
    """SimEngine._preempt: free KV by recompute, the lowest-priority latest-admitted sequences back to the queue."""
    r, ii, rs, cfg, ctr = w[0], w[2], w[4], w[16], w[18]
    base = i * cfg[G_SEQS]
    while ii[I_N, i] and cfg[G_KV] - ii[I_CTX, i] < ii[I_N, i]:
        victim = rs[base]
        for at in range(1, ii[I_MEMBERS, i]):
            row = rs[base + at]
            if r[R_MPRIO, row] > r[R_MPRIO, victim] or (r[R_MPRIO, row] == r[R_MPRIO, victim] and
                                                        r[R_ARRIVAL, row] > r[R_ARRIVAL, victim]):
                victim = row
        generated = leave_batch(w, i, victim)
        ii[I_N, i] -= 1
        ii[I_CTX, i] -= r[R_PROMPT, victim] + generated
        r[R_EPOCH, victim] += 1
        push_waiting(w, i, r[R_MPRIO, victim], r[R_ARRIVAL, victim], r[R_EPOCH, victim], victim)
        ctr[C_PREEMPT] += 1


@kernel(WORLD, I64)
def admit(w, i):
    """SimEngine._admit: instance i admits from its queue in (priority, arrival) order while the cache holds the
    admitted and the next iteration's tokens; their prefill and first tokens."""
    r, rf, ii, f, sl, cfg, cost, buf = w[0], w[1], w[2], w[3], w[5], w[16], w[17], w[20]
    base, pay = i * cfg[G_HEAP], w[14]
    n, ctx, prefill, admitted = ii[I_N, i], ii[I_CTX, i], 0, 0
    while ii[I_WAIT, i] > 0 and n < cfg[G_SEQS]:
        slot = pay[base]
        row, epoch = sl[0, slot], sl[1, slot]
        if epoch != r[R_EPOCH, row]:
            ii[I_WAIT, i] = heap_pop(w[12], w[13], pay, base, ii[I_WAIT, i])
            continue
        generated = r[R_GEN, row]
        need = r[R_PROMPT, row] + generated
        if ctx + need + n + 1 > cfg[G_KV]:
            break
        r[R_MPRIO, row], r[R_ARRIVAL, row] = np.int64(w[12][base]), w[13][base]
        ii[I_WAIT, i] = heap_pop(w[12], w[13], pay, base, ii[I_WAIT, i])
        n += 1
        ctx += need
        prefill += need
        r[R_ADMIT, row], r[R_GEN0, row] = ii[I_IT, i], generated
        join_batch(w, i, row)
        buf[2, admitted] = row
        admitted += 1
        push_running(w, i, ii[I_IT, i] + max(0, r[R_LENGTH, row] - generated), FINISH, epoch, row)
        push_checkpoint(w, i, row, epoch)
    ii[I_N, i], ii[I_CTX, i] = n, ctx
    if prefill:
        dt = cost[5] * prefill + cost[6]
        f[F_T, i] += dt
        f[F_BUSY, i] += dt
        first_token = f[F_T, i] + decode_time(w, i, 1)
        for j in range(admitted):
            if rf[RF_FIRST, buf[2, j]] != rf[RF_FIRST, buf[2, j]]:  # NaN: not set since this submission
                rf[RF_FIRST, buf[2, j]] = first_token


@kernel(WORLD, I64, I64, F64)
def abort_on(w, i, row, now):
    """SimEngine._abort_on of one request (`row`, on instance i, at clock `now`), then its _schedule."""
    r, ii, f = w[0], w[2], w[3]
    if not ii[I_N, i] or decode_time(w, i, 1) <= now - f[F_T, i] - f[F_OWED, i]:
        catch_up(w, i, now)
    r[R_EPOCH, row] += 1
    ii[I_PENDING, i] -= 1
    if r[R_SLOT, row] >= 0:  # running
        generated = leave_batch(w, i, row)
        ii[I_N, i] -= 1
        ii[I_CTX, i] -= r[R_PROMPT, row] + generated
        depart(w, i, 1)
    if ii[I_WAIT, i]:
        admit(w, i)
    schedule(w, i)
