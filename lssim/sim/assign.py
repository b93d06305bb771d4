"""Greedy assignment of work to instances, over arrays (numba): the loop a placement rule runs per request, for
policies that answer `Policy.placements` at once (the oracle's LPT)."""

from __future__ import annotations

import numpy as np

from lssim.kernels import F64S, F64S_IN, I64S, I64S_IN, kernel


@kernel(I64S, I64S_IN, more=[(F64S, F64S_IN)])  # integer or float work
def _least_work(work, sizes):
    out = np.empty(len(sizes), np.int64)
    for j in range(len(sizes)):
        best = 0
        for i in range(1, len(work)):
            if work[i] < work[best]:  # ties go to the lowest index, as min(range(n), key=...) does
                best = i
        work[best] += sizes[j]
        out[j] = best
    return out


def least_work(work: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """Each item, in order, on the instance with the least work so far (`work`, integer or float, is updated in
    place; `sizes` are read as its type)."""
    if not len(work):
        raise ValueError("least_work: no instance to place on")
    return _least_work(work, np.asarray(sizes, work.dtype))
