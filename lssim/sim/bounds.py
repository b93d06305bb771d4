"""The per-step lower bound: how fast could any policy have generated this step's tokens?

Two limits, and the step can beat neither:

- the longest response alone: its prefill plus its decode with a batch of one (an iteration never
  gets cheaper by adding sequences, and its context is at least its own);
- total work over capacity: the least decode time of all the step's tokens (`cost.work_time`: at the
  best batch sizes, but each token at its own context, whose sum no schedule changes) and every prompt
  prefilled, spread evenly over the instances.

Both hold for any cost model whose iteration time is non-decreasing in batch size and context. The
work term used to price every token at the smallest context any sequence had (peak throughput); the
context each token reads is known from the lengths alone, and counting it makes the bound tighter
wherever reading the KV cache is a real share of an iteration (long responses).

The bound depends on the step's responses as a set, never on their order: the solo term is the
exact maximum over every response that no other one beats in both length and context (the only
ones that can hold it), and the work term sums integers.
"""

from __future__ import annotations

import numpy as np

from lssim.cost.protocol import solo_decode_time
from lssim.kernels import I64S_IN, kernel


def solo_candidates(ctx0: np.ndarray, tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The (context, tokens) pairs whose solo time can be the step's largest: those no other response
    matches or beats in both (the solo time is non-decreasing in each), each pair once. Depends only on
    the multiset of pairs, not on their order. Usually a handful; at most the number of distinct contexts."""
    if len(tokens) > 2:
        # Cheap first cut: the most tokens (with the largest context among them) and the largest context (with the
        # most tokens among them) are undominated, and any other undominated pair beats both of them on the other
        # axis. Dropping dominated pairs leaves the undominated ones as they were; the sort below sees a handful.
        t_top = tokens.max()
        c_of_t = ctx0[tokens == t_top].max()
        c_top = ctx0.max()
        t_of_c = tokens[ctx0 == c_top].max()
        keep = (((ctx0 > c_of_t) & (tokens > t_of_c)) | ((tokens == t_top) & (ctx0 == c_of_t))
                | ((ctx0 == c_top) & (tokens == t_of_c)))
        ctx0, tokens = ctx0[keep], tokens[keep]
    order = np.lexsort((-ctx0, -tokens))  # most tokens first, and among equal tokens the largest context
    c, t = ctx0[order], tokens[order]
    # Every earlier row has at least as many tokens, so a row is dominated unless its context beats them all.
    best_before = np.maximum.accumulate(np.concatenate(([np.iinfo(np.int64).min], c[:-1].astype(np.int64))))
    keep = c > best_before
    return c[keep], t[keep]


def make_lower_bound(cost, n_instances: int, max_num_seqs: int):
    """A `LowerBound` for the controller: f(prompt_lens, ctx_at_start, tokens_in_step, running=None) -> seconds.

    `running` marks responses still generating when the step began (an async mode keeps them): they need no
    prefill, and the iteration they were in may have begun before the step, so their first token of the step
    is taken as free (looser for them, still a bound)."""

    def priced(solo: float, step_tokens, context_reads, prefilled) -> float:
        """The bound from its two terms: the solo time, and the work spread over the instances."""
        work = (cost.work_time(float(step_tokens), float(context_reads), max_num_seqs) + cost.prefill_time(int(prefilled))) / n_instances
        return max(solo, work)

    def lower_bound(prompt_lens: np.ndarray, ctx0: np.ndarray, tokens: np.ndarray, running: np.ndarray | None = None) -> float:
        if running is None or not np.any(running):  # the usual step (no response kept generating): one pass
            n_ran, c_rows, t_rows, step_tokens, context_reads, prefilled = bound_terms(
                np.asarray(ctx0, np.int64), np.asarray(tokens, np.int64))
            if not n_ran:
                return 0.0
            solo = max(solo_decode_time(cost, int(c), int(t)) for c, t in zip(c_rows.tolist(), t_rows.tolist()))
            return priced(solo, step_tokens, context_reads, prefilled)
        # an async step that kept responses generating
        ran = tokens > 0
        if not ran.any():
            return 0.0
        ctx0, tokens = ctx0[ran].astype(np.int64), tokens[ran].astype(np.int64)
        kept = np.asarray(running, dtype=bool)[ran]
        if not kept.any():  # those kept generated nothing in the step
            parts, prefilled = ((False, ctx0, tokens),), ctx0
        else:
            ctx0, tokens = ctx0 + kept, tokens - kept
            parts, prefilled = ((False, ctx0[~kept], tokens[~kept]), (True, ctx0[kept], tokens[kept])), ctx0[~kept]
        solo = 0.0
        for is_kept, c_part, t_part in parts:
            if len(t_part):
                c_rows, t_rows = solo_candidates(c_part, t_part)
                solo = max(solo, max(solo_decode_time(cost, int(c), int(t)) - (cost.prefill_time(int(c)) if is_kept else 0.0)
                                     for c, t in zip(c_rows.tolist(), t_rows.tolist())))
        # token j of a response resumed at context c is decoded at context c + j (integers: the sum is exact)
        context_reads = float((tokens * ctx0 + tokens * (tokens - 1) // 2).sum())
        return priced(solo, tokens.sum(), context_reads, prefilled.sum())

    return lower_bound


@kernel(I64S_IN, I64S_IN)
def bound_terms(ctx0, tokens):
    """`lower_bound`'s terms over the responses that ran (tokens > 0), none of them kept generating: how many ran,
    the solo candidates (`solo_candidates`: most tokens first), the tokens, the context reads (integers: exact) and
    the prompt tokens to prefill."""
    n_ran = 0
    t_top = c_top = -1
    step_tokens = context_reads = prefilled = 0
    for j in range(len(tokens)):
        t, c = tokens[j], ctx0[j]
        if t <= 0:
            continue
        n_ran += 1
        step_tokens += t
        context_reads += t * c + t * (t - 1) // 2
        prefilled += c
        t_top, c_top = max(t_top, t), max(c_top, c)
    c_of_t = t_of_c = -1  # the largest context among the most tokens, the most tokens among the largest context
    for j in range(len(tokens)):
        t, c = tokens[j], ctx0[j]
        if t > 0:
            if t == t_top:
                c_of_t = max(c_of_t, c)
            if c == c_top:
                t_of_c = max(t_of_c, t)
    # the pairs the first cut of solo_candidates keeps, then its sort (a handful: insertion) and its dominance pass
    kept_c = np.empty(n_ran, np.int64)
    kept_t = np.empty(n_ran, np.int64)
    k = 0
    for j in range(len(tokens)):
        t, c = tokens[j], ctx0[j]
        if t > 0 and ((c > c_of_t and t > t_of_c) or (t == t_top and c == c_of_t) or (c == c_top and t == t_of_c)):
            i = k
            while i > 0 and (kept_t[i - 1] < t or (kept_t[i - 1] == t and kept_c[i - 1] < c)):
                kept_t[i], kept_c[i] = kept_t[i - 1], kept_c[i - 1]
                i -= 1
            kept_t[i], kept_c[i] = t, c
            k += 1
    out_c = np.empty(k, np.int64)
    out_t = np.empty(k, np.int64)
    m = 0
    best = -(2 ** 62)
    for i in range(k):
        if kept_c[i] > best:
            out_c[m], out_t[m] = kept_c[i], kept_t[i]
            m += 1
        best = max(best, kept_c[i])
    return n_ran, out_c[:m], out_t[:m], step_tokens, context_reads, prefilled
