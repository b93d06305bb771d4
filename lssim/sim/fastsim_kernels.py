"""The batch route's kernels (numba): every instance's schedule over integers without stops (`schedule_records`; with
stops: lssim.sim.event_kernels, whose heap and key helpers it shares), the instance clocks (`instance_clocks`) and the
order of all instances' boundaries (`merge_boundaries`). lssim.sim.fastsim runs them over a step's requests and says how
the three passes fit together.

schedule_records keeps its own loop: event_kernels._schedule with no checkpoints schedules the same records, but 1.2x
slower (measured on segment's steps of some 2,600 requests, 2026-11-28: its arrays reach the loop's helpers in tuples;
2.5-4x before they were passed as views with no owner), and this is the replay's hottest kernel. Its own heap helpers
take views with no owner too (1.2x on april's steps, 2026-11-28).
"""

from __future__ import annotations

import numpy as np

from lssim.kernels import F64S, F64S_IN, I64, I64S, I64S_IN, kernel, unowned
from lssim.sim.event_kernels import (_FIRE, _SEQ_BITS, _START, MAX_IT, OUT_OF_ROOM, SEQ_MASK, _peek, _pop, _settle_fresh,
                                     records_room)

# the scheduler's constants, re-exported for lssim.sim.fastsim and lssim.sim.cut_route
__all__ = ["MAX_IT", "OUT_OF_ROOM", "SEQ_MASK", "_START", "records_room", "schedule_records", "instance_clocks",
           "touched_rank", "ended_rows", "merge_boundaries"]


@kernel(I64S, I64S, I64)
def _no_schedule(fin_rec, first_rec, error):
    """`schedule_records`'s return when it gives up with `error` (no records)."""
    e = np.zeros(0, np.int64)
    return e, e, e, e, e, e, e, e, e, e, e, e, e, e, fin_rec, first_rec, 0, error


@kernel(I64S, I64S, I64S)
def _held(run, heap, fresh):
    """Nothing: schedule_records calls it where it returns, so that the arrays its helpers read as views with no
    owner live until then (numba frees an array after its last use)."""
    return 0


@kernel(I64S_IN, I64S_IN, I64S_IN, I64S, I64S_IN, I64, I64, I64)
def schedule_records(order, inst_start, prompt, gen, length, capacity, max_seqs, cap):
    """Every instance's schedule, integers only (module docstring, pass 1).

    `order`: request indices, instance by instance (`inst_start` offsets), each instance's in (priority, arrival)
    order. `gen` is updated in place (tokens generated; a finished request's is its length). Returns the records
    (kind, instance, n, ctx, k of the span before the boundary, departures there and the departures already at
    that boundary, n after them, the prefill admitted after it and the n and ctx then, the first and count of its
    finishes in `fin`), `fin` (request indices in the order the boundaries end them), each request's finishing
    record and first admitting record, the preemptions, and an error: -1 none; i >= 0 instance i is idle with
    requests it cannot admit; -2 - i instance i outgrew the heap keys; OUT_OF_ROOM more than `cap` records or
    admissions (`gen` is then partly updated: the caller runs it again on a fresh copy, with more room)."""
    n_inst = len(inst_start) - 1
    n_req = len(prompt)
    kind = np.empty(cap, np.int64)
    rinst = np.empty(cap, np.int64)
    rn = np.empty(cap, np.int64)
    rctx = np.empty(cap, np.int64)
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
    # Pending finishes, each a key iteration << _SEQ_BITS | seq (the seq's request and epoch in pushed_*): a sorted run,
    # consumed from the front, and a heap, popped by the smaller of their fronts. A record's admissions (`fresh`) become
    # the new run when the last one is used up (usually all of an instance's requests at its start: no heap work at
    # all); otherwise they go on the heap.
    heap = np.empty(cap, np.int64)
    run = np.empty(n_req + 1, np.int64)
    fresh = np.empty(n_req + 1, np.int64)
    pushed_req = np.empty(cap, np.int64)
    pushed_ep = np.empty(cap, np.int64)
    stack = np.empty(n_req + 1, np.int64)  # running requests' positions in `order`, admission (= key) order
    # the heap helpers take views with no owner (lssim.kernels.unowned): no reference counted per call; `_held`
    # keeps the arrays to each return
    run_v, heap_v, fresh_v = unowned(run), unowned(heap), unowned(fresh)
    n_rec = 0
    n_fin = 0
    preemptions = 0
    for i in range(n_inst):
        lo, hi = inst_start[i], inst_start[i + 1]
        if lo == hi:
            continue
        head = lo  # the first waiting position (every running one is below it)
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
            if n_rec + 1 >= cap:  # out of room: the caller calls again with more (no array grows in this loop: it
                _held(run, heap, fresh)  # is several times faster when none is reassigned in it)
                return _no_schedule(fin_rec, first_rec, OUT_OF_ROOM)
            rec = n_rec
            n_rec += 1
            rinst[rec] = i
            rfin0[rec] = n_fin
            rleft[rec] = 0
            rbefore[rec] = 0
            if first:
                kind[rec] = _START
                rn[rec] = 0
                rctx[rec] = 0
                rk[rec] = -1
                rnafter[rec] = 0
                first = False
            else:
                kind[rec] = _FIRE
                rn[rec] = n_before
                rctx[rec] = ctx_before
                rk[rec] = k
                # the finishes at this boundary, in (iteration, seq) order
                n0 = n
                while True:
                    key = _peek(run_v, rlo, rhi, heap_v, hsize)
                    if key < 0 or key >> _SEQ_BITS > it:
                        break
                    r = pushed_req[key & SEQ_MASK]
                    ep = pushed_ep[key & SEQ_MASK]
                    rlo, hsize = _pop(run_v, rlo, rhi, heap_v, hsize)
                    if ep != epoch[r]:
                        continue
                    g = gen_at_admit[r] + (it - admit_it[r])
                    gen[r] = g
                    done[r] = True
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
                rnafter[rec] = n  # after the departures, before any preemption (SimEngine._depart sees this n)
                # preemption by recompute: the last admitted (largest key) goes back to the head of the queue
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
                    head = pos
                    preemptions += 1
            rfinc[rec] = n_fin - rfin0[rec]
            # admission, in key order, while the cache holds the admitted and the next iteration's tokens
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
                if first_rec[r] < 0:
                    first_rec[r] = rec
                while ssize > 0 and done[order[stack[ssize - 1]]]:  # finished ones on top are gone
                    ssize -= 1
                stack[ssize] = head - 1
                ssize += 1
                finish_it = it + max(0, length[r] - gen[r])
                if seq > SEQ_MASK or finish_it >= MAX_IT:
                    _held(run, heap, fresh)
                    return _no_schedule(fin_rec, first_rec, -2 - i)
                if seq == cap:
                    _held(run, heap, fresh)
                    return _no_schedule(fin_rec, first_rec, OUT_OF_ROOM)
                pushed_req[seq] = r
                pushed_ep[seq] = epoch[r]
                fresh[n_fresh] = finish_it << _SEQ_BITS | seq
                n_fresh += 1
                seq += 1
            rlo, rhi, hsize = _settle_fresh(fresh_v, n_fresh, run_v, rlo, rhi, heap_v, hsize)
            rpf[rec] = prefill
            ran[rec] = n
            ractx[rec] = ctx
            if n == 0:
                if head < hi:
                    _held(run, heap, fresh)
                    return (kind[:n_rec], rinst[:n_rec], rn[:n_rec], rctx[:n_rec], rk[:n_rec], rleft[:n_rec], rbefore[:n_rec],
                            rnafter[:n_rec], rpf[:n_rec], ran[:n_rec], ractx[:n_rec], rfin0[:n_rec], rfinc[:n_rec],
                            fin[:n_fin], fin_rec, first_rec, preemptions, i)
                break
            # the next boundary: a finish, or the cache unable to hold the next iteration's tokens
            while True:
                key = _peek(run_v, rlo, rhi, heap_v, hsize)
                if pushed_ep[key & SEQ_MASK] == epoch[pushed_req[key & SEQ_MASK]]:
                    break
                rlo, hsize = _pop(run_v, rlo, rhi, heap_v, hsize)
            target = min(key >> _SEQ_BITS, it + (capacity - ctx) // n)
            k = target - it
            n_before = n
            ctx_before = ctx
            ctx += n * k
            it = target
    _held(run, heap, fresh)
    return (kind[:n_rec], rinst[:n_rec], rn[:n_rec], rctx[:n_rec], rk[:n_rec], rleft[:n_rec], rbefore[:n_rec],
            rnafter[:n_rec], rpf[:n_rec], ran[:n_rec], ractx[:n_rec], rfin0[:n_rec], rfinc[:n_rec],
            fin[:n_fin], fin_rec, first_rec, preemptions, -1)


@kernel(*(I64S_IN,) * 7, *(F64S_IN,) * 7)
def instance_clocks(kind, rinst, rn, rk, rleft, rnafter, rpf, span, prefill, first_decode, departure, t0, busy0, seqs0):
    """The instance clocks, added up in the event engine's order (module docstring, pass 3). Returns each
    record's event time (the heap's key) and clock after its span, the first-token time of what it admitted,
    and each instance's final clock, busy seconds, sequence-seconds and owed departure seconds."""
    n_rec = len(kind)
    event_t = np.empty(n_rec)
    after = np.empty(n_rec)
    first_token = np.empty(n_rec)
    t = t0.copy()
    busy = busy0.copy()
    seqs = seqs0.copy()
    owed = np.zeros(len(t0))
    for rec in range(n_rec):
        i = rinst[rec]
        if kind[rec] == _FIRE:
            event_t[rec] = t[i] + owed[i] + span[rec]
            if rk[rec] > 0:
                dt = span[rec] + owed[i]
                owed[i] = 0.0
                t[i] += dt
                busy[i] += dt
                seqs[i] += rn[rec] * dt
        else:
            event_t[rec] = np.nan
        if rleft[rec] > 0:  # a boundary's departures, or a stop's (lssim.sim.event_kernels)
            if rnafter[rec] == 0:
                owed[i] = 0.0
            else:
                owed[i] += departure[rec]
        after[rec] = t[i]
        if rpf[rec] > 0:
            t[i] += prefill[rec]
            busy[i] += prefill[rec]
            first_token[rec] = t[i] + first_decode[rec]
        else:
            first_token[rec] = np.nan
    return event_t, after, first_token, t, busy, seqs, owed


@kernel(I64S_IN, I64)
def touched_rank(inst, n_inst):
    """Each instance's place in the order requests first reached it (n_inst: none did)."""
    rank = np.full(n_inst, n_inst, np.int64)
    seen = 0
    for i in inst:
        if rank[i] == n_inst:
            rank[i] = seen
            seen += 1
    return rank


@kernel(I64S_IN, I64S_IN, I64S_IN, I64S_IN, F64S_IN)
def ended_rows(popped, rfin0, rfinc, fin, after):
    """The requests the popped records end, in that order, and the clock each ends at."""
    total = 0
    for rec in popped:
        total += rfinc[rec]
    ended = np.empty(total, np.int64)
    at = np.empty(total)
    k = 0
    for rec in popped:
        for j in range(rfin0[rec], rfin0[rec] + rfinc[rec]):
            ended[k] = fin[j]
            at[k] = after[rec]
            k += 1
    return ended, at


@kernel(I64S_IN, I64S_IN, I64)
def _fire_chains(kind, rinst, n_inst):
    """Each instance's FIRE records as a chain (records are grouped by instance, in order): `first`, each instance's
    first (-1: none), and `link`, each record's next of its instance (-1: its last)."""
    first = np.full(n_inst, -1, np.int64)
    last = np.full(n_inst, -1, np.int64)
    link = np.full(len(kind), -1, np.int64)
    for rec in range(len(kind)):
        if kind[rec] != _FIRE:
            continue
        i = rinst[rec]
        if last[i] < 0:
            first[i] = rec
        else:
            link[last[i]] = rec
        last[i] = rec
    return first, link


@kernel(F64S, I64S, I64, I64)
def _pops_before(heap_t, heap_s, a, b):
    """Does heap entry `a` pop before `b`: the earlier time, then the earlier push."""
    return heap_t[a] < heap_t[b] or (heap_t[a] == heap_t[b] and heap_s[a] < heap_s[b])


@kernel(F64S, I64S, I64S, I64, I64)
def _swap(heap_t, heap_s, heap_i, a, b):
    heap_t[a], heap_t[b] = heap_t[b], heap_t[a]
    heap_s[a], heap_s[b] = heap_s[b], heap_s[a]
    heap_i[a], heap_i[b] = heap_i[b], heap_i[a]


@kernel(F64S, I64S, I64S, I64)
def _sift_up(heap_t, heap_s, heap_i, c):
    while c > 0:
        p = (c - 1) // 2
        if _pops_before(heap_t, heap_s, p, c):
            break
        _swap(heap_t, heap_s, heap_i, p, c)
        c = p


@kernel(F64S, I64S, I64S, I64)
def _sift_down_top(heap_t, heap_s, heap_i, size):
    c = 0
    while True:
        l, r, m = 2 * c + 1, 2 * c + 2, c
        if l < size and _pops_before(heap_t, heap_s, l, m):
            m = l
        if r < size and _pops_before(heap_t, heap_s, r, m):
            m = r
        if m == c:
            break
        _swap(heap_t, heap_s, heap_i, m, c)
        c = m


@kernel(I64S_IN, I64S_IN, F64S_IN, I64S_IN, I64)
def merge_boundaries(kind, rinst, event_t, touched_rank, n_inst):
    """The FIRE records of all instances in the order the event engine's heap pops them: by (time, push order),
    an instance's next event pushed when its last one pops (its first ones in the order instances were touched)."""
    nxt, link = _fire_chains(kind, rinst, n_inst)  # nxt: each instance's next FIRE record
    heap_t = np.empty(n_inst)
    heap_s = np.empty(n_inst, np.int64)
    heap_i = np.empty(n_inst, np.int64)
    size = 0
    for i in range(n_inst):
        if nxt[i] >= 0:
            heap_t[size], heap_s[size], heap_i[size] = event_t[nxt[i]], touched_rank[i], i
            _sift_up(heap_t, heap_s, heap_i, size)  # inserted one by one: enough for a handful of instances
            size += 1
    out = np.empty(len(kind), np.int64)
    n_out = 0
    while size > 0:
        i = heap_i[0]
        rec = nxt[i]
        out[n_out] = rec
        n_out += 1
        nxt[i] = link[rec]
        if nxt[i] >= 0:  # replace the top with this instance's next event, pushed now
            heap_t[0], heap_s[0] = event_t[nxt[i]], n_inst + n_out
        else:
            size -= 1
            heap_t[0], heap_s[0], heap_i[0] = heap_t[size], heap_s[size], heap_i[size]
        _sift_down_top(heap_t, heap_s, heap_i, size)
    return out[:n_out]
