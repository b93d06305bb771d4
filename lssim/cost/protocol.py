"""The cost-model contract, and what every model shares: closed-form sums over a span and the bound helpers.

The simulator fast-forwards an engine between changes of batch composition, so it never asks
"how long is one token" but "how long are the next ``k`` decode iterations of ``n`` running
sequences whose contexts sum to ``ctx`` tokens". During such a span nothing joins or leaves, so
``n`` is constant and the summed context grows by exactly ``n`` per iteration: an arithmetic ramp.
Every model here has a per-iteration time that is piecewise linear in ``ctx`` with at most two
pieces, so the span is summed in closed form and inverted (``iterations_within``) by solving a
quadratic, then nudged by at most a step or two so the inverse is exact for the forward formula.

Conventions shared by all models (the contract: lssim.loop.cost_contracts.CostModel):

* ``decode_time(n, ctx, k)``: seconds for ``k`` decode iterations; ``ctx`` is the summed context
  (prompt + generated so far) at the first of them. 0 when ``k == 0`` or ``n == 0``.
* ``iterations_within(n, ctx, s)``: the largest ``k`` with ``decode_time(n, ctx, k) <= s``.
* ``prefill_time(tokens)``: seconds added to the iteration that admits ``tokens`` prompt tokens
  (possibly of several prompts together). Affine in ``tokens`` with a non-negative intercept, so
  it is subadditive: ``prefill_time(a + b) <= prefill_time(a) + prefill_time(b)``. Pricing all
  prompts as one call therefore never overstates their prefill, which keeps lower bounds valid.
* ``departure_time(k)``: seconds added when ``k`` sequences leave a running batch at once (finished or
  aborted): the engine's work to free them and re-pack its batch. 0 for ``k == 0``; non-negative, so it
  only ever adds time and lower bounds priced without it stay valid. 0 in the roofline; a profile
  measures it (on vLLM's CPU build 0.3-0.5 ms per departing sequence,
  a fifth of a small batch's 2 ms iteration).

* ``abort_time(n)`` (optional): seconds the caller of the serving API is blocked while it aborts ``n`` requests (the
  client side of an abort: vLLM's AsyncLLM.abort, one round trip each). The simulator moves its clock by it when a
  controller aborts running requests (a rollout's end carrying or dropping them, a stop, a requeue). A model without
  it costs 0 (the contract's default); a profile measures it (``lssim profile``; on this VM 0.14-0.19 ms a request).

* ``resume_time(n)`` (optional): seconds a resubmission of ``n`` requests that already generated tokens costs beyond
  their re-prefill (each one's prompt and tokens so far, priced by ``prefill_time``), before they reach the engine:
  vLLM's front end takes each back as a new request and the engine frees what the abort left. The simulator moves its
  clock by it when a controller resubmits such requests (an async weight arrival, a carried response's next step, a
  requeue); the instances run on meanwhile. 0 by default; a profile measures it beside a rollout in flight
  (real_backend.resume_probe).

Hot-path methods use plain float arithmetic only (no numpy, no allocation); constants are
precomputed in ``__init__``.

Implementations: ``RooflineCostModel`` (lssim.cost.roofline: analytic, from model and GPU specs),
``ProfiledCostModel`` (lssim.cost.profiled: least-squares fit to measurements of a real engine, as in
Vidur) and ``SpeculativeCost`` (lssim.cost.speculative: any of them with speculation at small batch).
"""

from __future__ import annotations

import math

from lssim.loop.cost_contracts import CostModel

__all__ = ["solo_decode_time", "peak_tokens_per_second", "no_time_to_run", "settle_iterations", "ramp_count", "INF"]

INF = float("inf")


def no_time_to_run(n_seqs: int, seconds: float) -> bool:
    """The checks every `iterations_within` starts with: a batch of at least one sequence and a finite span;
    True when the span is empty (no iteration fits in it)."""
    if n_seqs <= 0:
        raise ValueError("iterations_within needs n_seqs >= 1 (an idle engine never advances)")
    if not seconds < INF:
        raise ValueError(f"seconds must be finite, got {seconds}")
    return seconds <= 0.0


# ----------------------------------------------------------------------------------------------
# Closed-form sums over an arithmetic ramp, shared by the models.
#
# A piece is a per-iteration time f(i) = a + b*i (i = 0, 1, ... counts iterations into the span,
# b >= 0). Its sum over i in [0, k) is k*a + b*k*(k-1)/2.
# ----------------------------------------------------------------------------------------------


def settle_iterations(decode_time, n_seqs: int, ctx_tokens: float, seconds: float, k: int) -> int:
    """Move an estimate k of `iterations_within` to the exact answer against the forward formula:
    the largest k with decode_time(n_seqs, ctx_tokens, k) <= seconds (float rounding moves k by one)."""
    while decode_time(n_seqs, ctx_tokens, k + 1) <= seconds:
        k += 1
    while k > 0 and decode_time(n_seqs, ctx_tokens, k) > seconds:
        k -= 1
    return k


def ramp_count(a: float, b: float, seconds: float) -> float:
    """Real k >= 0 solving ``k*a + b*k*(k-1)/2 == seconds`` (a > 0, b >= 0, seconds >= 0).

    Written as ``(b/2) k^2 + B k - seconds = 0`` with ``B = a - b/2``; the form
    ``2s / (B + sqrt(B^2 + 2bs))`` avoids cancellation when ``b`` is tiny (and covers b == 0).
    It is an estimate: callers fix the last step against the forward formula.
    """
    B = a - 0.5 * b
    disc = math.sqrt(B * B + 2.0 * b * seconds)
    if B > 0.0:
        return 2.0 * seconds / (B + disc)
    return (disc - B) / b  # B <= 0 implies b >= 2a > 0



# ----------------------------------------------------------------------------------------------
# Bounds used by the simulator's lower bound on makespan
# ----------------------------------------------------------------------------------------------


def solo_decode_time(cost: CostModel, prompt_len: int, n_tokens: int) -> float:
    """Seconds for one sequence alone: ``prefill_time(prompt_len) + decode_time(1, prompt_len, n_tokens)``.

    Convention: the ``n_tokens`` decode iterations start with context ``prompt_len`` (nothing
    generated yet) and the prefill is charged once, as the simulator adds it to the admitting
    iteration.

    Lower bound on that sequence's completion time (from its admission) under any schedule the
    simulator can produce with this cost model: each iteration yields at most one token for the
    sequence, so it needs at least ``n_tokens`` iterations, in which its own context is at least
    ``prompt_len + i`` at the i-th; sharing the engine only raises ``n_seqs`` and ``ctx_tokens``, and
    ``decode_time`` is monotone non-decreasing in both; its prefill is paid at least once.
    """
    return cost.prefill_time(prompt_len) + cost.decode_time(1, prompt_len, n_tokens)


def peak_tokens_per_second(cost: CostModel, max_num_seqs: int, mean_ctx: float) -> float:
    """Largest decode throughput (tokens/s) of one instance: ``max over n in 1..max_num_seqs`` of
    ``n / decode_time(n, n * mean_ctx, 1)``, with ``mean_ctx`` the per-sequence context.

    Used for the "total decode tokens / (instances x capacity)" makespan bound. If per-iteration
    time grows sub-linearly in ``n`` (t(n)/n non-increasing, true for the roofline: a max of
    affine functions of n with non-negative intercepts), the max is at ``n = max_num_seqs``; a
    profiled model with ``c3 > 0`` can violate that, so the max is taken over every n
    (``max_num_seqs`` cheap calls, off the hot path).

    Why it bounds: every iteration with ``n`` sequences and summed context ``n*c`` produces ``n``
    tokens in at least ``n / R(c)`` seconds where ``R(c)`` is this function's value at ``c``. For
    both models per-token time at batch n is convex in the per-sequence context ``c`` and the best
    batch size does not depend on ``c``, so by Jensen the bound holds with ``mean_ctx`` equal to
    the token-weighted mean context over all decode iterations (for a schedule-independent bound
    use a lower bound on it, e.g. the mean prompt length; ``mean_ctx = 0`` is always safe).
    Ignores prefill and per-instance KV limits (both only add time).
    """
    if max_num_seqs < 1:
        raise ValueError(f"max_num_seqs must be >= 1, got {max_num_seqs}")
    best = 0.0
    for n in range(1, int(max_num_seqs) + 1):
        rate = n / cost.decode_time(n, n * mean_ctx, 1)
        if rate > best:
            best = rate
    return best
