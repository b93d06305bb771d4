"""The batch route's scheduler with stops (numba): per instance, the vLLM scheduling of lssim.sim.world.SimEngine over
integers (lssim.sim.fastsim, pass 1) where a policy stops responses at progress checkpoints (Policy.progress_stops):
`schedule_stops`, and the heap and key helpers lssim.sim.fastsim_kernels.schedule_records shares (which keeps a loop
of its own without stops: run as `_schedule` with no checkpoints it is 1.2x slower, and it is the replay's hottest).

The helpers take the loop's arrays in tuples. numba counts a reference for every array a call passes (an atomic add and
subtract each), which was most of this kernel's time: the arrays reach the helpers as views with no owner
(lssim.kernels.unowned; `_schedule` holds the owners to its return), and a helper with nothing to do is not called.

Stops. The event engine reaches a checkpoint every `interval` tokens strictly inside a response; at a stop the
controller aborts the response after the instance's boundary was handled. So a boundary with stops runs: the finishes
and stops there in heap order ((iteration, push order): the order the responses end in), the finishes' departures,
preemption, an admission; then each stop in that order: its departure (none if it was just preempted), another
admission (SimEngine.abort). Each stop is a record of its own (`STOP_RECORD`: no span, its departure and its
admission), which instance_clocks prices as the engine does.

Checkpoints. Every checkpoint is a boundary of the event engine: it changes nothing there, but it splits the span (its
time is the sum of the pieces, as the event engine adds them, so clocks stay equal to the last bit and so does the
order of ties between instances) and is an event of its heap (merge_boundaries). So every checkpoint's iteration is a
record here too, but only a stop is a key of the heap: a running response's checkpoints are the iterations congruent
to its phase (admission iteration - tokens then, mod `interval`) below its finish, so the next checkpoint of any is the
next iteration whose phase some running response has (`_next_check`, over a bit set of the phases counted in). A stop's
key is pushed when the event engine pushes it -- as the checkpoint before it fires (`pending`, keyed by that iteration
and the response's admission), or at the admission when it is the first -- so that ties at one iteration pop in the
event engine's order.
"""

from __future__ import annotations

import numpy as np

from lssim.kernels import BOOLS, I64, I64S, I64S_IN, kernel, tuple_of, unowned

_START, _FIRE = 0, 1  # record kinds: an instance's first admission, or an event boundary (span, finishes, admission)
STOP_RECORD = 2  # a stop's departure and the admission after it

_SEQ_BITS = 26  # a heap key: iteration << _SEQ_BITS | push seq (one int orders as (iteration, seq))
SEQ_MASK = (1 << _SEQ_BITS) - 1
MAX_IT = 1 << (62 - _SEQ_BITS)
OUT_OF_ROOM = -(1 << 40)  # the scheduler's error: more records or pushes than its arrays hold

# The tuples the scheduler hands its helpers: the records' 13 columns; per request its admission iteration, tokens then,
# epoch, done and running (admitted, not ended or preempted since); each push's request, epoch and whether a stop;
# the work arrays (heap, sorted run, an admission's fresh keys, pending stop pushes, the running stack, a boundary's
# stops); the checkpoint phases (count of running responses per phase, and the bit set of those counted in).
RECORDS = tuple_of(*(I64S,) * 13)
REQUESTS = tuple_of(I64S, I64S, I64S, BOOLS, BOOLS)
PUSHED = tuple_of(I64S, I64S, BOOLS)
WORK = tuple_of(*(I64S,) * 6)
PHASES = tuple_of(I64S, I64S)
ENDS = tuple_of(I64S, I64S, I64S)  # fin, fin_rec, first_rec
INPUTS = tuple_of(I64S_IN, I64S_IN, I64S, I64S_IN, I64S_IN)  # order, prompt, gen, length, stop_at
SCRATCH = tuple_of(REQUESTS, PUSHED, WORK, PHASES)


def records_room(n_requests: int, n_instances: int) -> int:
    """Records and pushes the scheduler makes room for at first: enough unless requests are preempted many times."""
    return 2 * n_requests + 2 * n_instances + 16


@kernel(I64S, I64, I64)
def _heap_push(heap, size, key):
    """A binary min-heap of int64 keys (`heap` has room); returns the new size."""
    i = size
    while i > 0:
        p = (i - 1) // 2
        if heap[p] <= key:
            break
        heap[i] = heap[p]
        i = p
    heap[i] = key
    return size + 1


@kernel(I64S, I64)
def _heap_pop(heap, size):
    """Remove the top; returns the new size (the top must be read before)."""
    size -= 1
    key = heap[size]
    i = 0
    while True:
        c = 2 * i + 1
        if c >= size:
            break
        if c + 1 < size and heap[c + 1] < heap[c]:
            c += 1
        if key <= heap[c]:
            break
        heap[i] = heap[c]
        i = c
    heap[i] = key
    return size


@kernel(I64S, I64, I64, I64S, I64)
def _peek(run, rlo, rhi, heap, hsize):
    """The smallest pending key of the sorted run run[rlo:rhi] and the heap; -1 if none is pending."""
    if rlo < rhi:
        return heap[0] if hsize > 0 and heap[0] < run[rlo] else run[rlo]
    return heap[0] if hsize > 0 else -1


@kernel(I64S, I64, I64, I64S, I64)
def _pop(run, rlo, rhi, heap, hsize):
    """Remove the smallest pending key (`_peek`'s); returns the new (rlo, hsize)."""
    if rlo < rhi and (hsize == 0 or run[rlo] < heap[0]):
        return rlo + 1, hsize
    return rlo, _heap_pop(heap, hsize)


@kernel(I64S, I64, I64S, I64, I64, I64S, I64)
def _settle_fresh(fresh, n_fresh, run, rlo, rhi, heap, hsize):
    """An admission's keys: the new sorted run when the last one is used up (usually all of an instance's requests at
    its start: no heap work at all), else onto the heap. Returns (rlo, rhi, hsize)."""
    if rlo == rhi and n_fresh > 1:
        # sorted in place, copied by a loop: `run[:m] = np.sort(...)` would have numba compile an allocating sort and
        # the slice assignment's shape-mismatch message (docs/performance.md, Cold start)
        fresh[:n_fresh].sort()
        for j in range(n_fresh):
            run[j] = fresh[j]
        return 0, n_fresh, hsize
    for j in range(n_fresh):
        hsize = _heap_push(heap, hsize, fresh[j])
    return rlo, rhi, hsize


@kernel(PHASES, I64, I64, I64, I64, I64)
def _count_phase(phases, interval, admit_it, gen0, length, delta):
    """Count a running response's checkpoint phase in (delta 1) or out (-1), if it has a checkpoint below its length."""
    if interval == 0 or (gen0 // interval + 1) * interval >= length:
        return
    p = (admit_it - gen0) % interval
    count, bits = phases
    count[p] += delta
    if count[p] == 0:
        bits[p >> 6] &= ~(np.int64(1) << (p & 63))
    elif count[p] == 1 and delta > 0:
        bits[p >> 6] |= np.int64(1) << (p & 63)


@kernel(I64S, I64, I64, I64)
def _next_check(bits, interval, it, limit):
    """The first iteration after `it` and before `limit` whose phase is counted in; `limit` if none."""
    j = it + 1
    r = j % interval
    while j < limit:
        w = bits[r >> 6] >> (r & 63)  # int64: an arithmetic shift, whose sign bits stand for the word's top bit
        if w != 0:
            while (w & 1) == 0:
                w >>= 1
                j += 1
            return min(j, limit)
        step = min(64 - (r & 63), interval - r)
        j += step
        r = 0 if r + step == interval else r + step
    return limit


@kernel(RECORDS, I64, I64, I64, I64, I64, I64, I64)
def _open_record(recs, rec, kind, i, n_fin, n, ctx, k):
    """Record `rec` of instance i: its kind, the span before it (n sequences, ctx tokens, k iterations), no finish yet."""
    recs[0][rec], recs[1][rec], recs[2][rec], recs[3][rec], recs[4][rec] = kind, i, n, ctx, k
    recs[5][rec], recs[6][rec], recs[7][rec] = 0, 0, n
    recs[11][rec], recs[12][rec] = n_fin, 0


@kernel(RECORDS, *(I64,) * 6)
def _depart(recs, rec, leaving, n, it, left_at, left):
    """`leaving` sequences left at boundary `it`, `n` remain (SimEngine._depart's bookkeeping, in the record). Returns
    the new (left_at, left)."""
    recs[5][rec], recs[6][rec], recs[7][rec] = leaving, 0, n
    if leaving > 0 and n > 0:
        before = left if left_at == it else 0
        recs[6][rec] = before
        return it, before + leaving
    return left_at, left


@kernel(RECORDS, I64, ENDS, I64, I64, I64, SCRATCH)
def _result(recs, n_rec, ends, n_fin, preemptions, error, scratch):
    """The scheduler's return over the first n_rec records (module docstring of lssim.sim.fastsim_kernels). `scratch`:
    its other arrays, taken here so that they live while the views of them are read (_schedule)."""
    fin, fin_rec, first_rec = ends
    return (recs[0][:n_rec], recs[1][:n_rec], recs[2][:n_rec], recs[3][:n_rec], recs[4][:n_rec], recs[5][:n_rec],
            recs[6][:n_rec], recs[7][:n_rec], recs[8][:n_rec], recs[9][:n_rec], recs[10][:n_rec], recs[11][:n_rec],
            recs[12][:n_rec], fin[:n_fin], fin_rec, first_rec, preemptions, error)


@kernel(INPUTS, I64, I64, I64, I64, I64, I64, I64, I64, I64, I64, I64, I64, REQUESTS, ENDS, PUSHED, WORK, PHASES, I64)
def _admit(inputs, interval, capacity, max_seqs, cap, hi, head, n, ctx, ssize, seq, it, rec, req, ends, pushed, work,
           phases, n_pending):
    """Admission in key order while the cache holds the admitted and the next iteration's tokens (SimEngine._admit),
    by record `rec`: each admitted one's finish key into `fresh` (and its stop's, where the stop is its first
    checkpoint), a later stop into `pending`. Returns (head, n, ctx, ssize, seq, n_fresh, prefill, n_pending, error:
    0, OUT_OF_ROOM, or 1 for heap keys outgrown)."""
    order, prompt, gen, length, stop_at = inputs
    admit_it, gen_at_admit, epoch, done, on = req
    pushed_req, pushed_ep, pushed_stop = pushed
    fresh, pending, stack = work[2], work[3], work[4]
    prefill = n_fresh = 0
    while head < hi and n < max_seqs:
        r = order[head]
        if done[r]:
            head += 1
            continue
        g = gen[r]
        need = prompt[r] + g
        if ctx + need + n + 1 > capacity:
            break
        head += 1
        n += 1
        ctx += need
        prefill += need
        admit_it[r], gen_at_admit[r], on[r] = it, g, True
        if ends[2][r] < 0:
            ends[2][r] = rec
        while ssize > 0 and done[order[stack[ssize - 1]]]:  # finished ones on top are gone
            ssize -= 1
        stack[ssize] = head - 1
        ssize += 1
        stop = interval > 0 and stop_at[r] > g
        first_stop = stop and stop_at[r] == (g // interval + 1) * interval
        for s in range(2 if first_stop else 1):
            at = it + (stop_at[r] - g if s == 1 else max(0, length[r] - g))
            if seq > SEQ_MASK or at >= MAX_IT:
                return head, n, ctx, ssize, seq, n_fresh, prefill, n_pending, 1
            if seq == cap:
                return head, n, ctx, ssize, seq, n_fresh, prefill, n_pending, OUT_OF_ROOM
            pushed_req[seq], pushed_ep[seq], pushed_stop[seq] = r, epoch[r], s == 1
            fresh[n_fresh] = at << _SEQ_BITS | seq
            n_fresh += 1
            seq += 1
        if stop and not first_stop:  # pushed when the checkpoint before it fires (its finish key's seq: admission order)
            n_pending = _heap_push(pending, n_pending, (it + stop_at[r] - g - interval) << _SEQ_BITS | (seq - 1))
        _count_phase(phases, interval, it, g, length[r], 1)
    return head, n, ctx, ssize, seq, n_fresh, prefill, n_pending, 0


@kernel(I64, I64S, I64, PUSHED, REQUESTS, I64S_IN, I64S, I64, I64, I64)
def _push_stops(it, pending, n_pending, pushed, req, stop_at, heap, hsize, seq, cap):
    """The stops whose response's checkpoint before them is at `it`, pushed as the event engine pushes each checkpoint
    when the one before fires (in the order those fire: their responses' admissions). Returns (n_pending, hsize, seq,
    error: 0, OUT_OF_ROOM, or 1 for heap keys outgrown)."""
    pushed_req, pushed_ep, pushed_stop = pushed
    admit_it, gen_at_admit, epoch = req[0], req[1], req[2]
    while n_pending > 0 and pending[0] >> _SEQ_BITS <= it:
        s = pending[0] & SEQ_MASK
        n_pending = _heap_pop(pending, n_pending)
        r = pushed_req[s]
        if pushed_ep[s] != epoch[r]:  # preempted since
            continue
        if seq > SEQ_MASK:
            return n_pending, hsize, seq, 1
        if seq == cap:
            return n_pending, hsize, seq, OUT_OF_ROOM
        pushed_req[seq], pushed_ep[seq], pushed_stop[seq] = r, epoch[r], True
        hsize = _heap_push(heap, hsize, (admit_it[r] + stop_at[r] - gen_at_admit[r]) << _SEQ_BITS | seq)
        seq += 1
    return n_pending, hsize, seq, 0


@kernel(I64, I64, I64, I64S, I64, I64, I64S, I64, PUSHED, REQUESTS, INPUTS, ENDS, I64, I64S, I64, I64, PHASES)
def _pop_boundary(it, interval, rec, run, rlo, rhi, heap, hsize, pushed, req, inputs, ends, n_fin, stops, n, ctx, phases):
    """The finishes and stops at boundary `it`, in (iteration, push) order (SimEngine._fire): a finish leaves the
    batch, a stop joins `stops` (the response leaves after the boundary's admission). Both go to `fin` in that order.
    Returns (rlo, hsize, n, ctx, n_fin, n_stops)."""
    order, prompt, gen, length, stop_at = inputs
    pushed_req, pushed_ep, pushed_stop = pushed
    admit_it, gen_at_admit, epoch, done, on = req
    fin, fin_rec = ends[0], ends[1]
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
        if pushed_stop[s]:
            stops[n_stops] = r
            n_stops += 1
        else:
            g = gen_at_admit[r] + (it - admit_it[r])
            gen[r], done[r], on[r] = g, True, False
            epoch[r] += 1
            n -= 1
            ctx -= prompt[r] + g
            _count_phase(phases, interval, admit_it[r], gen_at_admit[r], length[r], -1)
        fin[n_fin] = r
        fin_rec[r] = rec
        n_fin += 1
    return rlo, hsize, n, ctx, n_fin, n_stops


@kernel(INPUTS, I64S_IN, I64, REQUESTS, PHASES, *(I64,) * 6)
def _preempt(inputs, stack, ssize, req, phases, interval, capacity, it, n, ctx, head):
    """Preemption by recompute while the cache cannot hold the next iteration: the last admitted first, back to the
    head of the queue. Returns (ssize, n, ctx, head, preempted)."""
    order, prompt, gen, length, stop_at = inputs
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
        _count_phase(phases, interval, admit_it[r], gen_at_admit[r], length[r], -1)
        head = pos
        preempted += 1
    return ssize, n, ctx, head, preempted


@kernel(RECORDS, I64, I64, I64, INPUTS, REQUESTS, PHASES, *(I64,) * 7)
def _stop(recs, rec, i, r, inputs, req, phases, interval, n_fin, n, ctx, it, left_at, left):
    """Request r's stop at boundary `it` (SimEngine.abort), record `rec`: its departure (none if it was just preempted).
    Returns (n, ctx, left_at, left)."""
    order, prompt, gen, length, stop_at = inputs
    admit_it, gen_at_admit, epoch, done, on = req
    _open_record(recs, rec, STOP_RECORD, i, n_fin, 0, 0, 0)
    leaving = 1 if on[r] else 0  # running still (not preempted at this boundary): it leaves
    if leaving:
        n -= 1
        ctx -= prompt[r] + stop_at[r]
        _count_phase(phases, interval, admit_it[r], gen_at_admit[r], length[r], -1)
    left_at, left = _depart(recs, rec, leaving, n, it, left_at, left)
    gen[r], done[r], on[r] = stop_at[r], True, False
    epoch[r] += 1
    return n, ctx, left_at, left


@kernel(I64, I64, I64, INPUTS, I64, I64, I64, I64, RECORDS, ENDS, REQUESTS, PUSHED, WORK, PHASES, I64, I64)
def _schedule_instance(i, lo, hi, inputs, interval, capacity, max_seqs, cap, recs, ends, req, pushed, work, phases,
                       n_rec, n_fin):
    """Instance i's schedule of order[lo:hi] from record n_rec and finish n_fin on. Returns (n_rec, n_fin,
    preemptions, error: -1 none, i idle with requests it cannot admit, or _schedule's)."""
    heap, run, stops = work[0], work[1], work[5]
    head, it, n, ctx, hsize, rlo, rhi, ssize, seq, left_at, left, n_pending = lo, 0, 0, 0, 0, 0, 0, 0, 0, -1, 0, 0
    k = n_before = ctx_before = -1
    preemptions = 0
    while True:
        if n_rec + 1 >= cap:
            return n_rec, n_fin, preemptions, OUT_OF_ROOM
        rec = n_rec
        n_rec += 1
        n_stops = 0
        if k < 0:  # the instance's first admission
            _open_record(recs, rec, _START, i, n_fin, 0, 0, -1)
        else:
            _open_record(recs, rec, _FIRE, i, n_fin, n_before, ctx_before, k)
            n0 = n
            rlo, hsize, n, ctx, n_fin, n_stops = _pop_boundary(it, interval, rec, run, rlo, rhi, heap, hsize, pushed, req,
                                                               inputs, ends, n_fin, stops, n, ctx, phases)
            # (each helper below is called only where it has something to do: a call passes every array it takes)
            if interval > 0 and n_pending > 0:
                n_pending, hsize, seq, error = _push_stops(it, work[3], n_pending, pushed, req, inputs[4], heap, hsize,
                                                           seq, cap)
                if error != 0:
                    return n_rec, n_fin, preemptions, -2 - i if error == 1 else error
            left_at, left = _depart(recs, rec, n0 - n, n, it, left_at, left)
            if n > 0 and capacity - ctx < n:
                ssize, n, ctx, head, preempted = _preempt(inputs, work[4], ssize, req, phases, interval, capacity, it, n,
                                                          ctx, head)
                preemptions += preempted
        recs[12][rec] = n_fin - recs[11][rec]
        if n_rec + n_stops + 1 >= cap:  # room for the stops' records
            return n_rec, n_fin, preemptions, OUT_OF_ROOM
        for j in range(n_stops + 1):
            if j > 0:  # the j-th stop: SimEngine.abort, a record of its own
                rec = n_rec
                n_rec += 1
                n, ctx, left_at, left = _stop(recs, rec, i, stops[j - 1], inputs, req, phases, interval, n_fin, n, ctx,
                                              it, left_at, left)
            prefill = 0
            if head < hi and n < max_seqs:
                head, n, ctx, ssize, seq, n_fresh, prefill, n_pending, error = _admit(
                    inputs, interval, capacity, max_seqs, cap, hi, head, n, ctx, ssize, seq, it, rec, req, ends, pushed,
                    work, phases, n_pending)
                if error != 0:
                    return n_rec, n_fin, preemptions, -2 - i if error == 1 else error
                if n_fresh > 0:
                    rlo, rhi, hsize = _settle_fresh(work[2], n_fresh, run, rlo, rhi, heap, hsize)
            recs[8][rec], recs[9][rec], recs[10][rec] = prefill, n, ctx
        if n == 0:
            return n_rec, n_fin, preemptions, i if head < hi else -1
        k, rlo, hsize = _next_boundary(run, rlo, rhi, heap, hsize, pushed, req[2], phases[1], interval, capacity, it, n,
                                       ctx)
        n_before, ctx_before = n, ctx
        ctx += n * k
        it += k


@kernel(I64S, I64, I64, I64S, I64, PUSHED, I64S, I64S, *(I64,) * 5)
def _next_boundary(run, rlo, rhi, heap, hsize, pushed, epoch, bits, interval, capacity, it, n, ctx):
    """The iterations to the next boundary -- a finish or stop, a checkpoint, or the cache unable to hold the next
    iteration's tokens -- with the stale keys before it dropped: (k, rlo, hsize)."""
    pushed_req, pushed_ep = pushed[0], pushed[1]
    while True:  # the smallest key still current (stale ones stay: popping them is the boundary's work)
        key = _peek(run, rlo, rhi, heap, hsize)
        s = key & SEQ_MASK
        if pushed_ep[s] == epoch[pushed_req[s]]:
            break
        rlo, hsize = _pop(run, rlo, rhi, heap, hsize)
    target = min(key >> _SEQ_BITS, it + (capacity - ctx) // n)
    if interval > 0:
        target = _next_check(bits, interval, it, target)
    return target - it, rlo, hsize


@kernel(INPUTS, I64S_IN, I64, I64, I64, I64)
def _schedule(inputs, inst_start, capacity, max_seqs, cap, interval):
    """Every instance's schedule (schedule_stops; `interval` 0 where no response has a checkpoint). The helpers take
    the arrays as views with no owner (lssim.kernels.unowned), the arrays themselves held to the end (`_result`)."""
    n_req, max_len = len(inputs[1]), max(inputs[3].max(), 0) if len(inputs[3]) else 0
    if interval > max_len:  # no response has a checkpoint
        interval = 0
    recs = (np.empty(cap, np.int64), np.empty(cap, np.int64), np.empty(cap, np.int64), np.empty(cap, np.int64),
            np.empty(cap, np.int64), np.empty(cap, np.int64), np.empty(cap, np.int64), np.empty(cap, np.int64),
            np.empty(cap, np.int64), np.empty(cap, np.int64), np.empty(cap, np.int64), np.empty(cap, np.int64),
            np.empty(cap, np.int64))
    ends = (np.empty(n_req, np.int64), np.full(n_req, -1, np.int64), np.full(n_req, -1, np.int64))
    req = (np.zeros(n_req, np.int64), np.zeros(n_req, np.int64), np.zeros(n_req, np.int64), np.zeros(n_req, np.bool_),
           np.zeros(n_req, np.bool_))
    pushed = (np.empty(cap, np.int64), np.empty(cap, np.int64), np.zeros(cap, np.bool_))
    work = (np.empty(cap, np.int64), np.empty(2 * n_req + 2, np.int64), np.empty(2 * n_req + 2, np.int64),
            np.empty(cap, np.int64), np.empty(n_req + 1, np.int64), np.empty(n_req + 1, np.int64))
    phases = (np.zeros(max(interval, 1), np.int64), np.zeros(interval // 64 + 1, np.int64))  # back to 0 per instance
    scratch = (req, pushed, work, phases)
    views = ((unowned(inputs[0]), unowned(inputs[1]), unowned(inputs[2]), unowned(inputs[3]), unowned(inputs[4])),
             (unowned(recs[0]), unowned(recs[1]), unowned(recs[2]), unowned(recs[3]), unowned(recs[4]),
              unowned(recs[5]), unowned(recs[6]), unowned(recs[7]), unowned(recs[8]), unowned(recs[9]),
              unowned(recs[10]), unowned(recs[11]), unowned(recs[12])),
             (unowned(ends[0]), unowned(ends[1]), unowned(ends[2])),
             (unowned(req[0]), unowned(req[1]), unowned(req[2]), unowned(req[3]), unowned(req[4])),
             (unowned(pushed[0]), unowned(pushed[1]), unowned(pushed[2])),
             (unowned(work[0]), unowned(work[1]), unowned(work[2]), unowned(work[3]), unowned(work[4]),
              unowned(work[5])),
             (unowned(phases[0]), unowned(phases[1])))
    n_rec = n_fin = preemptions = 0
    for i in range(len(inst_start) - 1):
        lo, hi = inst_start[i], inst_start[i + 1]
        if lo == hi:
            continue
        n_rec, n_fin, preempted, error = _schedule_instance(i, lo, hi, views[0], interval, capacity, max_seqs, cap,
                                                            views[1], views[2], views[3], views[4], views[5], views[6],
                                                            n_rec, n_fin)
        preemptions += preempted
        if error == OUT_OF_ROOM or error < -1:
            return _result(recs, 0, ends, 0, 0, error, scratch)
        if error >= 0:
            return _result(recs, n_rec, ends, n_fin, preemptions, error, scratch)
    return _result(recs, n_rec, ends, n_fin, preemptions, -1, scratch)


@kernel(I64S_IN, I64S_IN, I64S_IN, I64S, I64S_IN, I64, I64, I64, I64S_IN, I64)
def schedule_stops(order, inst_start, prompt, gen, length, capacity, max_seqs, cap, stop_at, interval):
    """lssim.sim.fastsim_kernels.schedule_records (same arguments and returns) where request r is stopped at its
    checkpoint of `stop_at[r]` tokens (-1: never; a multiple of `interval` below its natural `length`), as the module
    docstring says. A stop is in `fin` where the event engine ends it (among its boundary's finishes) and has its own
    STOP_RECORD after."""
    return _schedule((order, prompt, gen, length, stop_at), inst_start, capacity, max_seqs, cap, interval)
