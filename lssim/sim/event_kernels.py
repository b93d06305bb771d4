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
from numba import njit

from lssim.sim.fastsim_kernels import (_FIRE, _SEQ_BITS, _START, MAX_IT, OUT_OF_ROOM, SEQ_MASK, _heap_push, _no_schedule,
                                      _peek, _pop)

STOP_RECORD = 2  # a record kind beside _START and _FIRE: a stop's departure and the admission after it


@njit(cache=True)
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


@njit(cache=True)
def _settle_fresh(fresh, n_fresh, run, rlo, rhi, heap, hsize):
    """An admission's keys: the new sorted run when the last one is used up, else onto the heap. Returns (rlo, rhi, hsize)."""
    if rlo == rhi and n_fresh > 1:
        run[:n_fresh] = np.sort(fresh[:n_fresh])
        return 0, n_fresh, hsize
    for j in range(n_fresh):
        hsize = _heap_push(heap, hsize, fresh[j])
    return rlo, rhi, hsize


@njit(cache=True)
def schedule_stops(order, inst_start, prompt, gen, length, capacity, max_seqs, cap, stop_at, interval):
    """`schedule_records` (same arguments and returns) where request r is stopped at its checkpoint of `stop_at[r]`
    tokens (-1: never; a multiple of `interval` below its natural `length`), as the module docstring says. A stop
    is in `fin` where the event engine ends it (among its boundary's finishes) and has its own STOP_RECORD after."""
    n_inst = len(inst_start) - 1
    n_req = len(prompt)
    kind = np.empty(cap, np.int64)
    rinst = np.empty(cap, np.int64)
    rn = np.zeros(cap, np.int64)
    rctx = np.zeros(cap, np.int64)
    rk = np.empty(cap, np.int64)
    rleft = np.empty(cap, np.int64)
    rbefore = np.empty(cap, np.int64)
    rnafter = np.empty(cap, np.int64)
    rpf = np.empty(cap, np.int64)
    ran = np.empty(cap, np.int64)
    ractx = np.empty(cap, np.int64)
    rfin0 = np.empty(cap, np.int64)
    rfinc = np.empty(cap, np.int64)
    fin = np.empty(n_req, np.int64)
    fin_rec = np.full(n_req, -1, np.int64)
    first_rec = np.full(n_req, -1, np.int64)
    admit_it = np.zeros(n_req, np.int64)
    gen_at_admit = np.zeros(n_req, np.int64)
    epoch = np.zeros(n_req, np.int64)
    done = np.zeros(n_req, np.bool_)
    on = np.zeros(n_req, np.bool_)  # running (admitted, not finished, stopped or preempted since)
    heap = np.empty(cap, np.int64)
    run = np.empty(2 * n_req + 2, np.int64)
    fresh = np.empty(2 * n_req + 2, np.int64)
    pushed_req = np.empty(cap, np.int64)
    pushed_ep = np.empty(cap, np.int64)
    pushed_check = np.zeros(cap, np.bool_)
    stack = np.empty(n_req + 1, np.int64)
    stops = np.empty(n_req + 1, np.int64)  # the stops at the boundary being handled, in the order they popped
    n_rec = 0
    n_fin = 0
    preemptions = 0
    for i in range(n_inst):
        lo, hi = inst_start[i], inst_start[i + 1]
        if lo == hi:
            continue
        head = lo
        it = 0
        n = 0
        ctx = 0
        hsize = 0
        rlo = rhi = 0
        ssize = 0
        seq = 0
        left_at = -1
        left = 0
        k = -1
        n_before = 0
        ctx_before = 0
        first = True
        while True:
            if n_rec + 1 >= cap:
                return _no_schedule(fin_rec, first_rec, OUT_OF_ROOM)
            rec = n_rec
            n_rec += 1
            rinst[rec] = i
            rfin0[rec] = n_fin
            rleft[rec] = 0
            rbefore[rec] = 0
            n_stops = 0
            if first:
                kind[rec] = _START
                rk[rec] = -1
                rnafter[rec] = 0
                first = False
            else:
                kind[rec] = _FIRE
                rn[rec] = n_before
                rctx[rec] = ctx_before
                rk[rec] = k
                n0 = n
                while True:  # the finishes and checkpoints at this boundary, in (iteration, push) order
                    key = _peek(run, rlo, rhi, heap, hsize)
                    if key < 0 or key >> _SEQ_BITS > it:
                        break
                    s = key & SEQ_MASK
                    r = pushed_req[s]
                    rlo, hsize = _pop(run, rlo, rhi, heap, hsize)
                    if pushed_ep[s] != epoch[r]:
                        continue
                    g = gen_at_admit[r] + (it - admit_it[r])
                    if pushed_check[s]:
                        if g == stop_at[r]:
                            stops[n_stops] = r
                            n_stops += 1
                            fin[n_fin] = r
                            fin_rec[r] = rec
                            n_fin += 1
                        elif g + interval < length[r]:  # the next checkpoint, pushed as this one fires
                            if seq > SEQ_MASK:
                                return _no_schedule(fin_rec, first_rec, -2 - i)
                            if seq == cap:
                                return _no_schedule(fin_rec, first_rec, OUT_OF_ROOM)
                            pushed_req[seq] = r
                            pushed_ep[seq] = epoch[r]
                            pushed_check[seq] = True
                            hsize = _heap_push(heap, hsize, (it + interval) << _SEQ_BITS | seq)
                            seq += 1
                        continue
                    gen[r] = g
                    done[r] = True
                    on[r] = False
                    epoch[r] += 1
                    n -= 1
                    ctx -= prompt[r] + g
                    fin[n_fin] = r
                    fin_rec[r] = rec
                    n_fin += 1
                leaving = n0 - n
                if leaving > 0 and n > 0:
                    before = left if left_at == it else 0
                    left_at = it
                    left = before + leaving
                    rbefore[rec] = before
                rleft[rec] = leaving
                rnafter[rec] = n
                while n > 0 and capacity - ctx < n:  # preemption by recompute, the last admitted first
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
                    preemptions += 1
            rfinc[rec] = n_fin - rfin0[rec]
            if n_rec + n_stops + 1 >= cap:  # room for the stops' records
                return _no_schedule(fin_rec, first_rec, OUT_OF_ROOM)
            for j in range(n_stops + 1):
                if j > 0:  # the j-th stop: SimEngine.abort, a record of its own
                    r = stops[j - 1]
                    rec = n_rec
                    n_rec += 1
                    kind[rec] = STOP_RECORD
                    rinst[rec] = i
                    rk[rec] = 0
                    rfin0[rec] = n_fin
                    rfinc[rec] = 0
                    rleft[rec] = 0
                    rbefore[rec] = 0
                    g = stop_at[r]
                    if on[r]:
                        n -= 1
                        ctx -= prompt[r] + g
                        if n > 0:
                            before = left if left_at == it else 0
                            left_at = it
                            left = before + 1
                            rbefore[rec] = before
                        rleft[rec] = 1
                    rnafter[rec] = n
                    gen[r] = g
                    done[r] = True
                    on[r] = False
                    epoch[r] += 1
                head, n, ctx, ssize, seq, n_fresh, prefill, error = _admit(
                    order, prompt, gen, length, stop_at, interval, capacity, max_seqs, cap, hi, head, n, ctx, ssize, seq,
                    it, rec, done, on, admit_it, gen_at_admit, first_rec, stack, epoch, pushed_req, pushed_ep,
                    pushed_check, fresh)
                if error == 1:
                    return _no_schedule(fin_rec, first_rec, -2 - i)
                if error != 0:
                    return _no_schedule(fin_rec, first_rec, error)
                rlo, rhi, hsize = _settle_fresh(fresh, n_fresh, run, rlo, rhi, heap, hsize)
                rpf[rec] = prefill
                ran[rec] = n
                ractx[rec] = ctx
            if n == 0:
                if head < hi:
                    return (kind[:n_rec], rinst[:n_rec], rn[:n_rec], rctx[:n_rec], rk[:n_rec], rleft[:n_rec], rbefore[:n_rec],
                            rnafter[:n_rec], rpf[:n_rec], ran[:n_rec], ractx[:n_rec], rfin0[:n_rec], rfinc[:n_rec],
                            fin[:n_fin], fin_rec, first_rec, preemptions, i)
                break
            while True:  # the next boundary: a finish, a stopped response's checkpoint, or the cache full
                key = _peek(run, rlo, rhi, heap, hsize)
                s = key & SEQ_MASK
                if pushed_ep[s] == epoch[pushed_req[s]]:
                    break
                rlo, hsize = _pop(run, rlo, rhi, heap, hsize)
            target = min(key >> _SEQ_BITS, it + (capacity - ctx) // n)
            k = target - it
            n_before = n
            ctx_before = ctx
            ctx += n * k
            it = target
    return (kind[:n_rec], rinst[:n_rec], rn[:n_rec], rctx[:n_rec], rk[:n_rec], rleft[:n_rec], rbefore[:n_rec],
            rnafter[:n_rec], rpf[:n_rec], ran[:n_rec], ractx[:n_rec], rfin0[:n_rec], rfinc[:n_rec],
            fin[:n_fin], fin_rec, first_rec, preemptions, -1)
