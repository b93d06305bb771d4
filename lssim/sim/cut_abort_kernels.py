"""The aborts at a cut in one numba pass (lssim.sim.cut_aborts): SimEngine.abort_many of every request still in flight
on instances left as the cut route's schedule leaves them, operation for operation as SimEngine._abort_on runs them
(catch-up to each abort's clock, the departure, admissions from the queue with their prefill and first token), priced
with the roofline's coefficients (RooflineCostModel.kernel_coefficients; its departures cost nothing).

Each instance's requests in flight are rows in the order it admits them: nothing was preempted, so those running are
a prefix of that order and the queue the rest (a cursor); its next event is the least finish of those running (no
checkpoints on the cut route) or the cache filling up.
"""

from __future__ import annotations

import numpy as np

from lssim.cost.roofline_arrays import decode_time_at, iterations_within_at
from lssim.kernels import BOOLS, F64, F64S, F64S_2D, F64S_IN, I64, I64S, I64S_2D, I64S_IN, kernel

# an instance's integers (ints[i]) and clocks (clocks[i]): SimEngine._Instance's fields of those names
IT, N, CTX, LEFT_AT, LEFT = range(5)
T, BUSY, SEQS, OWED = range(4)


@kernel(F64S_IN, I64S_2D, I64, I64)
def _decode(coef, ints, i, k):
    """cost.decode_time of k iterations of instance i's batch as it stands."""
    return decode_time_at(ints[i, N], ints[i, CTX], k, coef[0], coef[1], coef[2], coef[3], coef[4])


@kernel(F64S_IN, I64S_2D, F64S_2D, I64, I64)
def _run(coef, ints, clocks, i, k):
    """SimEngine._run: k decode iterations of instance i's batch."""
    if k <= 0:
        return
    n = ints[i, N]
    dt = _decode(coef, ints, i, k) + clocks[i, OWED]
    clocks[i, OWED] = 0.0
    clocks[i, T] += dt
    clocks[i, BUSY] += dt
    clocks[i, SEQS] += n * dt
    ints[i, CTX] += n * k
    ints[i, IT] += k


@kernel(F64S_IN, I64, I64S_2D, F64S_2D, I64, F64, I64, I64, I64S_IN, I64S, I64S, BOOLS)
def _catch_up(coef, kv, ints, clocks, i, now, lo, hi, length, gen, admit_it, aborted):
    """SimEngine._catch_up: instance i (its rows lo..hi) to the last boundary at or before `now`, short of its next
    event (the least finish of its running rows, or the cache filling up)."""
    n = ints[i, N]
    if n == 0:
        clocks[i, T] = max(clocks[i, T], now)
        return
    if clocks[i, T] + clocks[i, OWED] >= now:
        return
    k = iterations_within_at(n, ints[i, CTX], now - clocks[i, T] - clocks[i, OWED], coef[0], coef[1], coef[2], coef[3],
                             coef[4])
    nxt = ints[i, IT] + (kv - ints[i, CTX]) // n
    for j in range(lo, hi):
        if admit_it[j] >= 0 and not aborted[j]:
            nxt = min(nxt, admit_it[j] + max(0, length[j] - gen[j]))
    _run(coef, ints, clocks, i, min(k, nxt - ints[i, IT] - 1))


@kernel(F64S_IN, I64, I64, I64S_2D, F64S_2D, I64, I64, I64, I64S_IN, I64S, I64S, BOOLS, F64S)
def _admit(coef, kv, max_seqs, ints, clocks, i, q, hi, prompt, gen, admit_it, aborted, first_token):
    """SimEngine._admit from queue position q (rows q..hi of instance i; aborted ones are stale entries): in order
    while the cache holds the admitted and the next iteration's tokens; their prefill and first token. The queue's
    position after."""
    head, prefill = q, 0
    while q < hi and ints[i, N] < max_seqs:
        if aborted[q]:
            q += 1
            continue
        need = prompt[q] + gen[q]
        if ints[i, CTX] + need + ints[i, N] + 1 > kv:
            break
        ints[i, N] += 1
        ints[i, CTX] += need
        prefill += need
        admit_it[q] = ints[i, IT]
        q += 1
    if prefill:
        dt = coef[5] * prefill + coef[6]
        clocks[i, T] += dt
        clocks[i, BUSY] += dt
        first = clocks[i, T] + _decode(coef, ints, i, 1)
        for j in range(head, q):
            if not aborted[j]:
                first_token[j] = first
    return q


@kernel(F64S_IN, I64, I64, I64S_IN, I64S_IN, I64S_IN, I64S, I64S, I64S_IN, F64S_IN, I64S_2D, F64S_2D, F64S)
def abort_in_flight(coef, kv, max_seqs, starts, prompt, length, gen, admit_it, aborts, at, ints, clocks, first_token):
    """Every row aborted (SimEngine._abort_on, each in turn): instance i's rows are starts[i]..starts[i + 1], in the
    order it admits them, admit_it[j] the iteration row j was admitted at (-1: queued), gen[j] its tokens then (its
    tokens when aborted, after); aborts[starts[i]:starts[i + 1]] its rows in the order they are aborted, at the clocks
    `at`. first_token: NaN, set for the rows admitted from the queue on the way."""
    aborted = np.zeros(len(prompt), np.bool_)
    for i in range(len(starts) - 1):
        lo, hi = starts[i], starts[i + 1]
        q = lo
        while q < hi and admit_it[q] >= 0:
            q += 1
        for a in range(lo, hi):
            row, now = aborts[a], at[a]
            if ints[i, N] == 0 or _decode(coef, ints, i, 1) <= now - clocks[i, T] - clocks[i, OWED]:
                _catch_up(coef, kv, ints, clocks, i, now, lo, hi, length, gen, admit_it, aborted)
            aborted[row] = True
            if admit_it[row] >= 0:  # running: keeps its tokens, frees its KV, departs
                gen[row] += ints[i, IT] - admit_it[row]
                ints[i, N] -= 1
                ints[i, CTX] -= prompt[row] + gen[row]
                if ints[i, N] == 0:
                    clocks[i, OWED] = 0.0
                else:
                    before = ints[i, LEFT] if ints[i, LEFT_AT] == ints[i, IT] else 0
                    ints[i, LEFT_AT], ints[i, LEFT] = ints[i, IT], before + 1
                    clocks[i, OWED] += 0.0 - 0.0  # departure_time(before + 1) - departure_time(before): 0 here
            q = _admit(coef, kv, max_seqs, ints, clocks, i, q, hi, prompt, gen, admit_it, aborted, first_token)
