"""The per-step lower bound: how fast could any policy have generated this step's tokens?

Two limits, and the step can beat neither:

- the longest response alone: its prefill plus its decode with a batch of one (an iteration never
  gets cheaper by adding sequences, and its context is at least its own);
- total work over capacity: every token must be decoded at no more than the instance's peak decode
  throughput (the best batch size, at the smallest context any sequence has), and every prompt
  prefilled, spread evenly over the instances.

Both hold for any cost model whose iteration time is non-decreasing in batch size and context.
"""

from __future__ import annotations

import numpy as np

from .cost import peak_tokens_per_second, solo_decode_time


def make_lower_bound(cost, n_instances: int, max_num_seqs: int):
    """A `LowerBound` for the controller: f(prompt_lens, ctx_at_start, tokens_in_step) -> seconds."""
    peak_cache: dict[int, float] = {}

    def lower_bound(prompt_lens: np.ndarray, ctx0: np.ndarray, tokens: np.ndarray) -> float:
        ran = tokens > 0
        if not ran.any():
            return 0.0
        ctx0, tokens = ctx0[ran], tokens[ran]
        # The solo bound grows with tokens and context, so only the longest few can hold the maximum.
        top = np.argsort(tokens)[-32:]
        solo = max(solo_decode_time(cost, int(c), int(t)) for c, t in zip(ctx0[top], tokens[top]))
        min_ctx = int(ctx0.min())
        if min_ctx not in peak_cache:
            peak_cache[min_ctx] = peak_tokens_per_second(cost, max_num_seqs, min_ctx)
        work = (float(tokens.sum()) / peak_cache[min_ctx] + cost.prefill_time(int(ctx0.sum()))) / n_instances
        return max(solo, work)

    return lower_bound
