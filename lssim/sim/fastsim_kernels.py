"""The batch route's kernels (numba): every instance's schedule over integers (`schedule_records`, whose loop is
lssim.sim.event_kernels'), the instance clocks (`instance_clocks`) and the order of all instances' boundaries
(`merge_boundaries`). lssim.sim.fastsim runs them over a step's requests and says how the three passes fit together."""

from __future__ import annotations

import numpy as np

from lssim.kernels import F64S_IN, I64, I64S, I64S_IN, kernel
from lssim.sim.event_kernels import _FIRE, _START, MAX_IT, OUT_OF_ROOM, SEQ_MASK, _schedule, records_room

# the scheduler's constants, re-exported for lssim.sim.fastsim and lssim.sim.cut_route
__all__ = ["MAX_IT", "OUT_OF_ROOM", "SEQ_MASK", "_START", "records_room", "schedule_records", "instance_clocks",
           "touched_rank", "ended_rows", "merge_boundaries"]


@kernel(I64S_IN, I64S_IN, I64S_IN, I64S, I64S_IN, I64, I64, I64)
def schedule_records(order, inst_start, prompt, gen, length, capacity, max_seqs, cap):
    """Every instance's schedule, integers only (lssim.sim.fastsim's pass 1; lssim.sim.event_kernels' loop).

    `order`: request indices, instance by instance (`inst_start` offsets), each instance's in (priority, arrival)
    order. `gen` is updated in place (tokens generated; a finished request's is its length). Returns the records
    (kind, instance, n, ctx, k of the span before the boundary, departures there and the departures already at
    that boundary, n after them, the prefill admitted after it and the n and ctx then, the first and count of its
    finishes in `fin`), `fin` (request indices in the order the boundaries end them), each request's finishing
    record and first admitting record, the preemptions, and an error: -1 none; i >= 0 instance i is idle with
    requests it cannot admit; -2 - i instance i outgrew the heap keys; OUT_OF_ROOM more than `cap` records or
    admissions (`gen` is then partly updated: the caller runs it again on a fresh copy, with more room)."""
    # no checkpoints (interval 0): the stops' column is never read, `length` stands in for it
    return _schedule((order, prompt, gen, length, length), inst_start, capacity, max_seqs, cap, 0)


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


@kernel(I64S_IN, I64S_IN, F64S_IN, I64S_IN, I64)
def merge_boundaries(kind, rinst, event_t, touched_rank, n_inst):
    """The FIRE records of all instances in the order the event engine's heap pops them: by (time, push order),
    an instance's next event pushed when its last one pops (its first ones in the order instances were touched)."""
    n_rec = len(kind)
    nxt = np.full(n_inst, -1, np.int64)  # each instance's next FIRE record
    # records are grouped by instance, in order; a cursor per instance walks its own
    last = np.full(n_inst, -1, np.int64)
    link = np.full(n_rec, -1, np.int64)
    for rec in range(n_rec):
        if kind[rec] != _FIRE:
            continue
        i = rinst[rec]
        if last[i] < 0:
            nxt[i] = rec
        else:
            link[last[i]] = rec
        last[i] = rec
    heap_t = np.empty(n_inst)
    heap_s = np.empty(n_inst, np.int64)
    heap_i = np.empty(n_inst, np.int64)
    size = 0
    out = np.empty(n_rec, np.int64)
    n_out = 0
    for i in range(n_inst):
        if nxt[i] >= 0:
            heap_t[size], heap_s[size], heap_i[size] = event_t[nxt[i]], touched_rank[i], i
            size += 1
    # heapify by insertion order is enough for a handful of instances; sift each up
    for j in range(size):
        c = j
        while c > 0:
            p = (c - 1) // 2
            if heap_t[p] < heap_t[c] or (heap_t[p] == heap_t[c] and heap_s[p] < heap_s[c]):
                break
            heap_t[p], heap_t[c] = heap_t[c], heap_t[p]
            heap_s[p], heap_s[c] = heap_s[c], heap_s[p]
            heap_i[p], heap_i[c] = heap_i[c], heap_i[p]
            c = p
    pops = 0
    while size > 0:
        i = heap_i[0]
        rec = nxt[i]
        out[n_out] = rec
        n_out += 1
        nxt[i] = link[rec]
        pops += 1
        if nxt[i] >= 0:  # replace the top with this instance's next event, pushed now
            heap_t[0], heap_s[0] = event_t[nxt[i]], n_inst + pops
        else:
            size -= 1
            heap_t[0], heap_s[0], heap_i[0] = heap_t[size], heap_s[size], heap_i[size]
        c = 0
        while True:
            l, r, m = 2 * c + 1, 2 * c + 2, c
            if l < size and (heap_t[l] < heap_t[m] or (heap_t[l] == heap_t[m] and heap_s[l] < heap_s[m])):
                m = l
            if r < size and (heap_t[r] < heap_t[m] or (heap_t[r] == heap_t[m] and heap_s[r] < heap_s[m])):
                m = r
            if m == c:
                break
            heap_t[m], heap_t[c] = heap_t[c], heap_t[m]
            heap_s[m], heap_s[c] = heap_s[c], heap_s[m]
            heap_i[m], heap_i[c] = heap_i[c], heap_i[m]
            c = m
    return out[:n_out]
