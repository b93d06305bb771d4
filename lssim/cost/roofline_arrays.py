"""RooflineCostModel's pricing in numba (its own module so that importing lssim.cost does not load numba: only the
simulator's batch and requeue routes ask for it): decode_time over arrays of spans, and decode_time and
iterations_within of one span, for a kernel that prices spans as it schedules them (lssim.sim.requeue_kernels)."""

import numpy as np

from lssim.cost.protocol import ramp_count
from lssim.kernels import F64, I64, I64S_IN, kernel

ramp_count_at = kernel(F64, F64, F64)(ramp_count)  # the same function, compiled


@kernel(I64S_IN, I64S_IN, I64S_IN, F64, F64, F64, F64, F64)
def decode_times(n, ctx, k, mem_a, mem_b, cmp_a, cmp_b, ov):
    """RooflineCostModel.decode_time for each span (decode_time_at)."""
    out = np.zeros(len(n))
    for i in range(len(n)):
        out[i] = decode_time_at(n[i], ctx[i], k[i], mem_a, mem_b, cmp_a, cmp_b, ov)
    return out


@kernel(I64, I64, I64, F64, F64, F64, F64, F64)
def decode_time_at(n, ctx, k, mem_a, mem_b, cmp_a, cmp_b, ov):
    """RooflineCostModel.decode_time of one span, its operations in its order (so equal to the last bit): k
    iterations of n sequences from context ctx, each max(memory, compute) + ov, both affine in the iteration, summed
    in closed form; where the two lines cross inside the span, summed in two pieces."""
    if k <= 0 or n <= 0:
        return 0.0
    nf, cf, kf = float(n), float(ctx), float(k)
    m0 = mem_a + mem_b * cf
    c0 = cmp_a * nf + cmp_b * cf
    if c0 >= m0:
        v0, v1, s0, s1 = c0, m0, cmp_b * nf, mem_b * nf
    else:
        v0, v1, s0, s1 = m0, c0, mem_b * nf, cmp_b * nf
    if s1 > s0:
        j = np.trunc((v0 - v1) / (s1 - s0)) + 1
        if j < kf:
            return j * (v0 + s0 * (j - 1) * 0.5) + (kf - j) * (v1 + s1 * (j + kf - 1) * 0.5) + kf * ov
    return kf * (v0 + s0 * (kf - 1) * 0.5 + ov)


@kernel(I64, I64, F64, F64, F64, F64, F64, F64)
def iterations_within_at(n, ctx, seconds, mem_a, mem_b, cmp_a, cmp_b, ov):
    """RooflineCostModel.iterations_within (n >= 1, `seconds` finite), its operations in its order."""
    if seconds <= 0.0:
        return 0
    nf, cf = float(n), float(ctx)
    m0 = mem_a + mem_b * cf
    c0 = cmp_a * nf + cmp_b * cf
    if c0 >= m0:
        v0, s0, v1, s1 = c0, cmp_b * nf, m0, mem_b * nf
    else:
        v0, s0, v1, s1 = m0, mem_b * nf, c0, cmp_b * nf
    est = ramp_count_at(v0 + ov, s0, seconds)
    if s1 > s0:
        j = np.trunc((v0 - v1) / (s1 - s0)) + 1
        if est > j:
            rest = seconds - j * (v0 + s0 * (j - 1) * 0.5 + ov)
            est = j + ramp_count_at(v1 + s1 * j + ov, s1, max(rest, 0.0))
    k = int(est)  # protocol.settle_iterations: the exact answer against the forward formula
    while decode_time_at(n, ctx, k + 1, mem_a, mem_b, cmp_a, cmp_b, ov) <= seconds:
        k += 1
    while k > 0 and decode_time_at(n, ctx, k, mem_a, mem_b, cmp_a, cmp_b, ov) > seconds:
        k -= 1
    return k
