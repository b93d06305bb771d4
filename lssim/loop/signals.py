"""Early-exit signals over a sliding window, the same in both worlds.

A circuit breaker (policies/breaker.py) decides from two numbers about the last `window` tokens of a
response, which each engine puts in `Request.signals[WINDOW_KEY]` at every progress event:

    repetition   fraction of the window's n-grams that repeat an earlier n-gram of the window:
                 1 - distinct / total, with total = window - ngram + 1. Natural text: near 0; a loop
                 whose period is small against the window: near 1.
    entropy      mean per-token entropy over the window, in nats. From logprobs alone it is the mean
                 of -log p(sampled token), an unbiased one-sample estimate of the entropy (E[-log p(x)]
                 over x ~ p is H(p)); when the engine gives each position's exact entropy, their mean.
    tokens       how many tokens the window holds (min(generated, window)), and `window` its size; a
                 rule should wait for a full window before it trusts the other two.

The real engine computes them from the tokens and logprobs it streamed (`signals_from_tokens`); the
simulator models them from the trace's per-response columns (`signals_from_trace`):

    repetition = clip((generated - loop_start) / window, 0, 1) once a loop has started (loop_start >= 0),
                 else 0: the share of the window inside the loop, which is what the n-gram measure gives
                 for a loop whose period is small against the window. It reaches 1 at loop_start + window.
    entropy    = the response's recorded `entropy_mean` where it has no loop or collapse; after
                 `loop_start` (or `entropy_collapse_start`), a mix (1 - f) * text + f * degenerate, f the
                 share of the window past that point, where `degenerate` is the row's `entropy_mean`
                 (such a response is mostly loop or collapse, so its mean is that level) and `text` the
                 typical entropy of the trace's healthy responses (their median `entropy_mean`).
                 NaN where the trace has no entropy.

Both signals use DEFAULT (window 256, 4-grams) unless an engine is built with another `SignalSpec`, over at most half a
response's token budget (`SignalSpec.window_for`): a rule trusts a window only once it is full, and checks fall strictly
inside a response, so a 256-token window on a 256-token budget (the real backend's default world) would never be full;
there it is 128 tokens, full from the middle of the budget on.

What the real engine (real_backend/engine.py) keeps in `Request.signals`, from the tokens it streams:

    signals["logprobs"]   list[float]  logprob of each sampled token (the behaviour logprobs GRPO uses)
    signals["entropy"]    list[float]  each token's exact entropy (`token_entropy`), in nats, when the engine
                                       returns the whole vocabulary's logprobs; empty otherwise
    signals[WINDOW_KEY]   dict         the window signals above (`signals_from_tokens`)
    signals["loop_start"] int          where the response ends in a repetition loop (`loop_start`); absent
                                       while none is detected
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

SIGNAL_NAMES = ("repetition", "entropy")  # what a policy may read (PolicyNeeds.signals) and an engine gives
WINDOW_FIELDS = (*SIGNAL_NAMES, "tokens", "window")  # what a window gives at each checkpoint: the signals and their window
WINDOW_KEY = "window"  # Request.signals[WINDOW_KEY] -> {"repetition": float, "entropy": float, "tokens": int, "window": int}
_NAN = float("nan")


@dataclass(slots=True, frozen=True)
class SignalSpec:
    """The window the engines measure over, and the n-gram length of the repetition measure."""

    window: int = 256
    ngram: int = 4

    def window_for(self, max_tokens: int) -> int:
        """The window over a response with this token budget: at most half of it (and at least one n-gram)."""
        return max(self.ngram, min(self.window, max_tokens // 2))

    def windows_for(self, max_tokens):
        """`window_for` of each budget of an array."""
        import numpy as np

        return np.maximum(self.ngram, np.minimum(self.window, np.asarray(max_tokens) // 2))

    def __post_init__(self):
        if self.window < 1 or self.ngram < 1 or self.ngram > self.window:
            raise ValueError(f"SignalSpec needs 1 <= ngram <= window, got window={self.window}, ngram={self.ngram}")


DEFAULT = SignalSpec()


def repetition_rate(tokens: Sequence[int], ngram: int) -> float:
    """Fraction of the n-grams of `tokens` that repeat an earlier one: 1 - distinct / total (0 if none)."""
    total = len(tokens) - ngram + 1
    if total <= 0:
        return 0.0
    seen = {tuple(tokens[i:i + ngram]) for i in range(total)}
    return 1.0 - len(seen) / total


def signals_along(tokens: Sequence[int], logprobs: Sequence[float] | None, positions: Iterable[int],
                  spec: SignalSpec = DEFAULT, entropies: Sequence[float] | None = None) -> tuple[list[float], list[float]]:
    """The window signals after each of `positions` tokens of a response: (repetition, entropy), one value each.

    The one computation both worlds use: the real engine at a progress event (`signals_from_tokens`, one position:
    the tokens so far) and a trace's measured signals (lssim.traces.signal_trace: every `stride` tokens of a recorded
    response), so a replay reads what the policy would have read on the engine. Repetition is counted by sliding
    the window's n-gram counts from one position to the next (the same integers as `repetition_rate` on each
    window); entropy is the window's mean of `entropies` where given, else of -logprob (NaN without either).
    Positions must be increasing and within the tokens.
    """
    window, ngram = spec.window, spec.ngram
    counts: dict[tuple, int] = {}
    lo = hi = 0  # the n-grams of tokens[lo:hi] are in `counts`
    repetition, entropy = [], []
    for p in positions:
        if p < hi or p > len(tokens):
            raise ValueError(f"signals_along: positions must increase within the {len(tokens)} tokens, got {p}")
        start = max(0, p - window)
        if start >= hi - ngram + 1:  # no n-gram in common with the last window: count afresh
            counts, lo, hi = {}, start, start
        for i in range(lo, min(start, hi - ngram + 1)):  # n-grams leaving the window
            key = tuple(tokens[i:i + ngram])
            counts[key] -= 1
            if not counts[key]:
                del counts[key]
        for i in range(max(start, hi - ngram + 1), p - ngram + 1):  # n-grams entering it
            key = tuple(tokens[i:i + ngram])
            counts[key] = counts.get(key, 0) + 1
        lo, hi = start, p
        total = p - start - ngram + 1
        repetition.append(1.0 - len(counts) / total if total > 0 else 0.0)
        entropy.append(_window_entropy(logprobs, entropies, start, p))
    return repetition, entropy


def _window_entropy(logprobs, entropies, start: int, end: int) -> float:
    if entropies is not None:
        values = entropies[start:end]
        return math.fsum(values) / len(values) if len(values) else _NAN
    if logprobs is None or end <= start:
        return _NAN
    return -math.fsum(logprobs[start:end]) / (end - start)


def signals_from_tokens(tokens: Sequence[int], logprobs: Sequence[float], window: int = DEFAULT.window,
                        ngram: int = DEFAULT.ngram, entropies: Sequence[float] | None = None) -> dict:
    """The real world's signals from a response's token ids and the logprobs of the sampled tokens (`signals_along`
    at the last token). `entropies` (each position's exact entropy, when the engine has them) replace the
    one-sample estimate -logprob. Only the last `window` tokens count.
    """
    (repetition,), (entropy,) = signals_along(tokens, logprobs, [len(tokens)], SignalSpec(window, ngram), entropies)
    return {"repetition": repetition, "entropy": entropy, "tokens": min(len(tokens), window), "window": window}


def signals_from_trace(generated: int, loop_start: int, collapse_start: int, entropy: float, text_entropy: float,
                       window: int = DEFAULT.window) -> dict:
    """The simulator's model of the same signals, from the trace's columns (see the module docstring)."""
    repetition = 0.0
    if loop_start >= 0 and generated > loop_start:
        repetition = min(1.0, (generated - loop_start) / window)
    starts = [s for s in (loop_start, collapse_start) if s >= 0]
    if starts and entropy == entropy:
        start = min(starts)
        f = min(1.0, max(0.0, (generated - start) / window))
        text = text_entropy if text_entropy == text_entropy else entropy
        entropy = (1.0 - f) * text + f * entropy
    return {"repetition": repetition, "entropy": entropy, "tokens": min(generated, window), "window": window}


def signals_from_trace_many(generated, loop_start, collapse_start, entropy, text_entropy: float, window,
                            names=WINDOW_FIELDS) -> dict:
    """`signals_from_trace` over arrays (one response each; `window` an array or one size), to the last bit: the
    simulator's batch route reads a submission's checkpoints at once (lssim.sim.checkpoints). Only the fields
    `names` are computed (a rule computes only what it reads: early_exit the entropy)."""
    import numpy as np

    generated = np.asarray(generated, np.int64)
    out = {}
    if "repetition" in names:
        loop_start = np.asarray(loop_start, np.int64)
        looped = (loop_start >= 0) & (generated > loop_start)
        out["repetition"] = np.where(looped, np.minimum(1.0, (generated - loop_start) / window), 0.0)
    if "entropy" in names:
        out["entropy"] = entropy_from_trace_many(generated, loop_start, collapse_start, entropy, text_entropy, window)
    window = np.asarray(window)
    if "tokens" in names:
        out["tokens"] = np.minimum(generated, window)
    if "window" in names:
        out["window"] = window if window.shape == generated.shape else np.broadcast_to(window, generated.shape)
    return out


def entropy_from_trace_many(generated, loop_start, collapse_start, entropy, text_entropy: float, window):
    """The "entropy" of `signals_from_trace_many`: the label, mixed towards the text's only where a loop or collapse
    starts (the mix computed there only: a few of them)."""
    import numpy as np

    loop_start, collapse_start = np.asarray(loop_start, np.int64), np.asarray(collapse_start, np.int64)
    entropy = np.array(entropy, float)  # a copy: the mixed ones are written in place
    loop, collapse = loop_start >= 0, collapse_start >= 0
    mixed = np.flatnonzero((loop | collapse) & (entropy == entropy))
    if not len(mixed):
        return entropy
    loop_at, collapse_at = loop_start[mixed], collapse_start[mixed]
    start = np.where(loop[mixed] & collapse[mixed], np.minimum(loop_at, collapse_at),
                     np.where(loop[mixed], loop_at, collapse_at))
    window = np.asarray(window)
    window = window[mixed] if window.ndim else window
    f = np.minimum(1.0, np.maximum(0.0, (np.asarray(generated, np.int64)[mixed] - start) / window))
    label = entropy[mixed]
    text = text_entropy if text_entropy == text_entropy else label
    entropy[mixed] = (1.0 - f) * text + f * label
    return entropy


def entropy_from_logprobs(logprobs: Iterable[float]) -> float:
    """Entropy (nats) of one position's distribution from its tokens' logprobs.

    Exact given the whole vocabulary; over a top k only, the mass seen is renormalized, which
    underestimates a flat distribution's entropy. -inf logprobs (no mass) are skipped.
    """
    lps = [x for x in logprobs if x > -math.inf]
    if not lps:
        return 0.0
    mass = sum(math.exp(x) for x in lps)
    if mass <= 0.0:
        return 0.0
    log_mass = math.log(mass)
    return max(0.0, -sum(math.exp(x - log_mass) * (x - log_mass) for x in lps))


def token_entropy(position: Mapping[int, Any]) -> float:
    """`entropy_from_logprobs` of one position as vLLM returns it: {token_id: Logprob} (anything with a
    `.logprob`)."""
    return entropy_from_logprobs(lp.logprob for lp in position.values())


def loop_start(tokens: Sequence[int], max_period: int = 64, min_repeats: int = 4, min_tokens: int = 24) -> int:
    """Where a degenerate repetition loop starts: the first index of the longest periodic suffix.

    A loop is a suffix that repeats a block of `p <= max_period` tokens at least `min_repeats` times
    and spans at least `min_tokens` tokens. Returns -1 when the response does not end in one (a
    response that loops and then recovers is not a loop: it ended by itself). The real engine's
    counterpart of a trace's `loop_start` column.
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
