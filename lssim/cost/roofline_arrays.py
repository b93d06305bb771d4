"""RooflineCostModel.decode_time over arrays of spans, in numba (its own module so that importing lssim.cost does not
load numba: only the simulator's batch route asks for it)."""

import numpy as np

from lssim.kernels import F64, I64S_IN, kernel


@kernel(I64S_IN, I64S_IN, I64S_IN, F64, F64, F64, F64, F64)
def decode_times(n, ctx, k, mem_a, mem_b, cmp_a, cmp_b, ov):
    """RooflineCostModel.decode_time for each span, its operations in its order (so equal to the last bit): k
    iterations of n sequences from context ctx, each max(memory, compute) + ov, both affine in the iteration, summed
    in closed form; where the two lines cross inside the span, summed in two pieces."""
    out = np.zeros(len(n))
    for i in range(len(n)):
        if k[i] <= 0 or n[i] <= 0:
            continue
        nf, cf, kf = float(n[i]), float(ctx[i]), float(k[i])
        m0 = mem_a + mem_b * cf
        c0 = cmp_a * nf + cmp_b * cf
        if c0 >= m0:
            v0, v1, s0, s1 = c0, m0, cmp_b * nf, mem_b * nf
        else:
            v0, v1, s0, s1 = m0, c0, mem_b * nf, cmp_b * nf
        plain = kf * (v0 + s0 * (kf - 1) * 0.5 + ov)
        if s1 > s0:
            j = np.trunc((v0 - v1) / (s1 - s0)) + 1
            if j < kf:
                plain = j * (v0 + s0 * (j - 1) * 0.5) + (kf - j) * (v1 + s1 * (j + kf - 1) * 0.5) + kf * ov
        out[i] = plain
    return out
