"""Early-exit signals computed from a response's tokens and logprobs (real world only).

The simulator reads these from a trace; on vLLM the engine computes them as tokens stream in and
keeps them in `Request.signals`, where policies (a circuit breaker, say) read them at progress events:

    signals["logprobs"]   list[float]  logprob of each sampled token (the behaviour logprobs GRPO uses)
    signals["entropy"]    list[float]  each token's exact entropy, in nats, when the engine was built with
                                       logprobs=-1 (the whole vocabulary's logprobs); empty otherwise
    signals["window"]     dict         lssim.signals' window signals (repetition, entropy, tokens, window),
                                       the same the simulator models: what a circuit breaker reads
    signals["loop_start"] int          where a repetition loop starts; absent while none is detected

Without exact entropies, entropy is estimated by -logprob of the sampled token (unbiased: E[-log p(x)]
over x ~ p is H(p)), in the window signals and in the trace's entropy_mean alike.
"""

from __future__ import annotations

import math


def token_entropy(logprobs: dict) -> float:
    """Entropy (nats) of one position's distribution from vLLM's {token_id: Logprob} dict.

    Exact with the full vocabulary returned (`logprobs=-1`); over a top k only, the mass seen is
    renormalized, which underestimates a flat distribution's entropy.
    """
    lps = [lp.logprob for lp in logprobs.values() if lp.logprob > -math.inf]
    if not lps:
        return 0.0
    mass = sum(math.exp(x) for x in lps)
    if mass <= 0.0:
        return 0.0
    log_mass = math.log(mass)
    return max(0.0, -sum(math.exp(x - log_mass) * (x - log_mass) for x in lps))


def loop_start(tokens: list[int], max_period: int = 64, min_repeats: int = 4, min_tokens: int = 24) -> int:
    """Where a degenerate repetition loop starts: the first index of the longest periodic suffix.

    A loop is a suffix that repeats a block of `p <= max_period` tokens at least `min_repeats` times
    and spans at least `min_tokens` tokens. Returns -1 when the response does not end in one (a
    response that loops and then recovers is not a loop: it ended by itself).
    """
    n = len(tokens)
    best = -1
    for p in range(1, min(max_period, n // min_repeats) + 1):
        # Walk back while tokens[i] == tokens[i + p]: the periodic suffix with period p.
        i = n - p - 1
        while i >= 0 and tokens[i] == tokens[i + p]:
            i -= 1
        start = i + 1
        span = n - start
        if span >= max(min_tokens, min_repeats * p) and (best < 0 or start < best):
            best = start
    return best
