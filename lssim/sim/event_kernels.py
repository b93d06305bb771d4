"""The batch route's schedule with stops (numba): `schedule_records` (lssim.sim.fastsim_kernels) for a submission in
which a policy stops some responses at progress checkpoints (Policy.progress_stops), in the event engine's order.

The event engine (lssim.sim.world.SimEngine) reaches a checkpoint every `interval` tokens strictly inside a response;
at a stop the controller aborts the response after the instance's boundary was handled. So a boundary with stops runs:
the finishes and checkpoints there in heap order ((iteration, push order): the order the responses end in), the
finishes' departures, preemption, an admission; then each stop in that order: its departure (none if it was just
preempted), another admission (SimEngine.abort). Each stop is a record of its own (`STOP_RECORD`: no span, its
departure and its admission), which instance_clocks prices as the engine does. Every response's checkpoints are
boundaries, as they are for the event engine: a checkpoint changes nothing there, but it splits the span (its time is
then the sum of the pieces, as the event engine adds them, so clocks stay equal to the last bit and so does the order
of ties between instances) and is an event of the engine's heap (merge_boundaries). Checkpoints are pushed when the
event engine pushes them (after the response's finish at an admission, and as the checkpoint before fires), so ties
at one iteration pop in its order.
"""

from __future__ import annotations

import numpy as np

from lssim.kernels import BOOLS, BOOLS_IN, I64, I64S, I64S_IN, kernel, tuple_of
from lssim.sim.fastsim_kernels import (_FIRE, _SEQ_BITS, _START, MAX_IT, OUT_OF_ROOM, SEQ_MASK, _heap_push, _peek, _pop,
                                      _settle_fresh)

# The tuples schedule_stops hands its helpers (lssim.kernels): each push's request, epoch and whether a checkpoint; each
# request's state as _pop_boundary and _preempt take it; the records' 13 columns.
PUSHED = tuple_of(I64S, I64S, BOOLS)
REQUESTS = tuple_of(I64S, I64S, I64S, BOOLS, BOOLS)
RECORDS = tuple_of(*(I64S,) * 13)

STOP_RECORD = 2  # a record kind beside _START and _FIRE: a stop's departure and the admission after it


@kernel(I64S_IN, I64S_IN, I64S_IN, I64S_IN, I64S_IN, *(I64,) * 12, BOOLS_IN, BOOLS, I64S, I64S, I64S, I64S, I64S_IN, I64S, I64S, BOOLS, I64S)
def _admit(order, prompt, gen, length, stop_at, interval, capacity, max_seqs, cap, hi, head, n, ctx, ssize, seq, it, rec,
           done, on, admit_it, gen_at_admit, first_rec, stack, epoch, pushed_req, pushed_ep, pushed_check, fresh):
    """Admission in key order while the cache holds the admitted and the next iteration's tokens (SimEngine._admit):
    finish keys (and each response's next checkpoint) into `fresh`. Returns (head, n, ctx, ssize, seq, n_fresh,
    prefill, error: 0, OUT_OF_ROOM, or 1 for heap keys outgrown)."""
    prefill = 0
    n_fresh = 0
    while head < hi and n < max_seqs:
        r = order[head]
        if done[r]:
            head += 1
            continue
        need = prompt[r] + gen[r]
        if ctx + need + n + 1 > capacity:
            break
        head += 1
        n += 1
        ctx += need
        prefill += need
        admit_it[r] = it
        gen_at_admit[r] = gen[r]
        on[r] = True
        if first_rec[r] < 0:
            first_rec[r] = rec
        while ssize > 0 and done[order[stack[ssize - 1]]]:  # finished ones on top are gone
            ssize -= 1
        stack[ssize] = head - 1
        ssize += 1
        for check in range(2):
            if check == 0:
                at = it + max(0, length[r] - gen[r])
            else:
                nxt = (gen[r] // interval + 1) * interval
                if nxt >= length[r]:
                    break
                at = it + (nxt - gen[r])
            if seq > SEQ_MASK or at >= MAX_IT:
                return head, n, ctx, ssize, seq, n_fresh, prefill, 1
            if seq == cap:
                return head, n, ctx, ssize, seq, n_fresh, prefill, OUT_OF_ROOM
            pushed_req[seq] = r
            pushed_ep[seq] = epoch[r]
            pushed_check[seq] = check == 1
            fresh[n_fresh] = at << _SEQ_BITS | seq
            n_fresh += 1
            seq += 1
    return head, n, ctx, ssize, seq, n_fresh, prefill, 0


@kernel(*(I64,) * 5, I64S, I64, I64, I64S, I64, PUSHED, REQUESTS, I64S, I64S_IN, I64S_IN, I64S_IN, I64S, I64S, I64, I64S, I64, I64)
def _pop_boundary(it, interval, cap, seq, rec, run, rlo, rhi, heap, hsize, pushed, req, gen, prompt, length, stop_at, fin,
                  fin_rec, n_fin, stops, n, ctx):
    """The finishes and checkpoints at boundary `it`, in (iteration, push) order (SimEngine._fire): a finish leaves the
    batch, a checkpoint at its response's stop joins `stops` (the response leaves after the boundary's admission), any
    other pushes the next. Both kinds go to `fin` in that order. Returns (rlo, hsize, seq, n, ctx, n_fin, n_stops,
    error: 0, OUT_OF_ROOM, or 1 for heap keys outgrown)."""
    pushed_req, pushed_ep, pushed_check = pushed
    admit_it, gen_at_admit, epoch, done, on = req
    n_stops = 0
    while True:
        key = _peek(run, rlo, rhi, heap, hsize)
        if key < 0 or key >> _SEQ_BITS > it:
            break
        s = key & SEQ_MASK
        r = pushed_req[s]
        rlo, hsize = _pop(run, rlo, rhi, heap, hsize)
        if pushed_ep[s] != epoch[r]:
            continue
        g = gen_at_admit[r] + (it - admit_it[r])
        if pushed_check[s] and g != stop_at[r]:
            if g + interval < length[r]:  # the next checkpoint, pushed as this one fires
                if seq > SEQ_MASK:
                    return rlo, hsize, seq, n, ctx, n_fin, n_stops, 1
                if seq == cap:
                    return rlo, hsize, seq, n, ctx, n_fin, n_stops, OUT_OF_ROOM
                pushed_req[seq], pushed_ep[seq], pushed_check[seq] = r, epoch[r], True
                hsize = _heap_push(heap, hsize, (it + interval) << _SEQ_BITS | seq)
                seq += 1
            continue
        if pushed_check[s]:
            stops[n_stops] = r
            n_stops += 1
        else:
            gen[r] = g
            done[r] = True
            on[r] = False
            epoch[r] += 1
            n -= 1
            ctx -= prompt[r] + g
        fin[n_fin] = r
        fin_rec[r] = rec
        n_fin += 1
    return rlo, hsize, seq, n, ctx, n_fin, n_stops, 0


@kernel(I64S_IN, I64S_IN, I64, REQUESTS, I64S, I64S_IN, *(I64,) * 5)
def _preempt(order, stack, ssize, req, gen, prompt, capacity, it, n, ctx, head):
    """Preemption by recompute while the cache cannot hold the next iteration: the last admitted first, back to the
    head of the queue. Returns (ssize, n, ctx, head, preempted)."""
    admit_it, gen_at_admit, epoch, done, on = req
    preempted = 0
    while n > 0 and capacity - ctx < n:
        pos = stack[ssize - 1]
        ssize -= 1
        r = order[pos]
        if done[r]:
            continue
        g = gen_at_admit[r] + (it - admit_it[r])
        gen[r] = g
        n -= 1
        ctx -= prompt[r] + g
        epoch[r] += 1
        on[r] = False
        head = pos
        preempted += 1
    return ssize, n, ctx, head, preempted


@kernel(RECORDS, *(I64,) * 6)
def _depart(recs, rec, leaving, n, it, left_at, left):
    """`leaving` sequences left at boundary `it`, `n` remain (SimEngine._depart's bookkeeping, in the record). Returns
    the new (left_at, left)."""
    rleft, rbefore, rnafter = recs[5], recs[6], recs[7]
    rleft[rec], rbefore[rec], rnafter[rec] = leaving, 0, n
    if leaving > 0 and n > 0:
        before = left if left_at == it else 0
        rbefore[rec] = before
        return it, before + leaving
    return left_at, left


@kernel(RECORDS, *(I64,) * 7)
def _open_record(recs, rec, kind, i, n_fin, n, ctx, k):
    """Record `rec` of instance i: its kind, the span before it (n sequences, ctx tokens, k iterations), no finish yet."""
    recs[0][rec], recs[1][rec], recs[2][rec], recs[3][rec], recs[4][rec] = kind, i, n, ctx, k
    recs[5][rec], recs[6][rec], recs[7][rec] = 0, 0, n
    recs[11][rec], recs[12][rec] = n_fin, 0


@kernel(RECORDS, I64, I64S, I64, I64S, I64S, I64, I64)
def _result(recs, n_rec, fin, n_fin, fin_rec, first_rec, preemptions, error):
    """schedule_records' return over the first n_rec records."""
    return (recs[0][:n_rec], recs[1][:n_rec], recs[2][:n_rec], recs[3][:n_rec], recs[4][:n_rec], recs[5][:n_rec],
            recs[6][:n_rec], recs[7][:n_rec], recs[8][:n_rec], recs[9][:n_rec], recs[10][:n_rec], recs[11][:n_rec],
            recs[12][:n_rec], fin[:n_fin], fin_rec, first_rec, preemptions, error)


@kernel(I64S_IN, I64S_IN, I64S_IN, I64S, I64S_IN, I64, I64, I64, I64S_IN, I64)
def schedule_stops(order, inst_start, prompt, gen, length, capacity, max_seqs, cap, stop_at, interval):
    """`schedule_records` (same arguments and returns) where request r is stopped at its checkpoint of `stop_at[r]`
    tokens (-1: never; a multiple of `interval` below its natural `length`), as the module docstring says. A stop
    is in `fin` where the event engine ends it (among its boundary's finishes) and has its own STOP_RECORD after."""
    n_req = len(prompt)
    recs = (np.empty(cap, np.int64), np.empty(cap, np.int64), np.zeros(cap, np.int64), np.zeros(cap, np.int64),
            np.empty(cap, np.int64), np.empty(cap, np.int64), np.empty(cap, np.int64), np.empty(cap, np.int64),
            np.empty(cap, np.int64), np.empty(cap, np.int64), np.empty(cap, np.int64), np.empty(cap, np.int64),
            np.empty(cap, np.int64))  # schedule_records' records: kind, inst, n, ctx, k, left, before, n after, prefill,
    # n and ctx after it, first finish and finishes
    fin, fin_rec, first_rec = np.empty(n_req, np.int64), np.full(n_req, -1, np.int64), np.full(n_req, -1, np.int64)
    # per request: admission iteration, tokens then, epoch, done, running (admitted, not ended or preempted since)
    req = (np.zeros(n_req, np.int64), np.zeros(n_req, np.int64), np.zeros(n_req, np.int64), np.zeros(n_req, np.bool_),
           np.zeros(n_req, np.bool_))
    pushed = (np.empty(cap, np.int64), np.empty(cap, np.int64), np.zeros(cap, np.bool_))  # request, epoch, checkpoint?
    heap, run, fresh = np.empty(cap, np.int64), np.empty(2 * n_req + 2, np.int64), np.empty(2 * n_req + 2, np.int64)
    stack, stops = np.empty(n_req + 1, np.int64), np.empty(n_req + 1, np.int64)
    n_rec = n_fin = preemptions = 0
    for i in range(len(inst_start) - 1):
        lo, hi = inst_start[i], inst_start[i + 1]
        head, it, n, ctx, hsize, rlo, rhi, ssize, seq, left_at, left = lo, 0, 0, 0, 0, 0, 0, 0, 0, -1, 0
        k = n_before = ctx_before = -1
        while lo < hi:
            if n_rec + 1 >= cap:
                return _result(recs, 0, fin, 0, fin_rec, first_rec, 0, OUT_OF_ROOM)
            rec = n_rec
            n_rec += 1
            n_stops = 0
            if k < 0:  # the instance's first admission
                _open_record(recs, rec, _START, i, n_fin, 0, 0, -1)
            else:
                _open_record(recs, rec, _FIRE, i, n_fin, n_before, ctx_before, k)
                n0 = n
                rlo, hsize, seq, n, ctx, n_fin, n_stops, error = _pop_boundary(
                    it, interval, cap, seq, rec, run, rlo, rhi, heap, hsize, pushed, req, gen, prompt, length, stop_at,
                    fin, fin_rec, n_fin, stops, n, ctx)
                if error != 0:
                    return _result(recs, 0, fin, 0, fin_rec, first_rec, 0, -2 - i if error == 1 else error)
                left_at, left = _depart(recs, rec, n0 - n, n, it, left_at, left)
                ssize, n, ctx, head, preempted = _preempt(order, stack, ssize, req, gen, prompt, capacity, it, n, ctx, head)
                preemptions += preempted
            recs[12][rec] = n_fin - recs[11][rec]
            if n_rec + n_stops + 1 >= cap:  # room for the stops' records
                return _result(recs, 0, fin, 0, fin_rec, first_rec, 0, OUT_OF_ROOM)
            for j in range(n_stops + 1):
                if j > 0:  # the j-th stop: SimEngine.abort, a record of its own
                    r = stops[j - 1]
                    rec = n_rec
                    n_rec += 1
                    _open_record(recs, rec, STOP_RECORD, i, n_fin, 0, 0, 0)
                    leaving = 1 if req[4][r] else 0  # running still (not preempted at this boundary): it leaves
                    n -= leaving
                    ctx -= leaving * (prompt[r] + stop_at[r])
                    left_at, left = _depart(recs, rec, leaving, n, it, left_at, left)
                    gen[r] = stop_at[r]
                    req[3][r], req[4][r] = True, False
                    req[2][r] += 1
                head, n, ctx, ssize, seq, n_fresh, prefill, error = _admit(
                    order, prompt, gen, length, stop_at, interval, capacity, max_seqs, cap, hi, head, n, ctx, ssize, seq,
                    it, rec, req[3], req[4], req[0], req[1], first_rec, stack, req[2], pushed[0], pushed[1], pushed[2], fresh)
                if error != 0:
                    return _result(recs, 0, fin, 0, fin_rec, first_rec, 0, -2 - i if error == 1 else error)
                rlo, rhi, hsize = _settle_fresh(fresh, n_fresh, run, rlo, rhi, heap, hsize)
                recs[8][rec], recs[9][rec], recs[10][rec] = prefill, n, ctx
            if n == 0:
                if head < hi:
                    return _result(recs, n_rec, fin, n_fin, fin_rec, first_rec, preemptions, i)
                break
            while True:  # the next boundary: a finish, a checkpoint, or the cache full
                key = _peek(run, rlo, rhi, heap, hsize)
                s = key & SEQ_MASK
                if pushed[1][s] == req[2][pushed[0][s]]:
                    break
                rlo, hsize = _pop(run, rlo, rhi, heap, hsize)
            target = min(key >> _SEQ_BITS, it + (capacity - ctx) // n)
            k, n_before, ctx_before = target - it, n, ctx
            ctx += n * k
            it = target
    return _result(recs, n_rec, fin, n_fin, fin_rec, first_rec, preemptions, -1)
