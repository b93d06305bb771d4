"""Speculative decoding / layer skip at small batch, as a wrapper around any cost model."""

from __future__ import annotations

from dataclasses import asdict

from .protocol import CostModel, _settle

__all__ = ["SpeculativeCost"]


class SpeculativeCost:
    """A cost model with speculation (lssim.core.Speculation) applied while ``n_seqs <= max_batch``.

    Speculation changes the time per generated token by a factor that depends on the running batch only,
    ``factor(n)``; within a span ``n`` is constant, so a span of ``k`` iterations costs exactly
    ``factor(n) * base.decode_time(n, ctx, k)`` (an "iteration" stays one generated token per sequence, now
    at the expected speculative cost) and ``iterations_within`` inverts it exactly.

    Lossless methods (ngram, draft), per generated token, relative to plain decoding at batch ``n``:

        factor(n) = (1 - alpha) (gamma * draft_cost + verify(n)) / (1 - alpha^(gamma+1))

    i.e. T_SD = (1 - alpha)(D + T)/(1 - alpha^(gamma+1)) with D = gamma * draft_cost * t(n) and
    T = verify(n) * t(n), where ``verify(n) = t(n*(gamma+1)) / t(n)``, ``t(m) = base.decode_time(m, 0, 1)``:
    verifying gamma+1 tokens for each of n sequences is priced as one iteration of n*(gamma+1) sequences that
    reads the weights once. Taking it at zero context ignores that the KV is read once for all gamma+1
    positions, which makes verify(n) an over-estimate (speculation is priced conservatively). It is ~1 while
    the model is memory-bound and grows to gamma+1 once compute-bound: why speculation pays only at small batch.

    layer_skip: factor(n) = layer_fraction (lossy, no verification).

    An engine does not speculate where it would be slower (TLT's adaptive engine picks "no speculation" for
    such batches; vLLM takes a per-batch-size draft length), so the factor applied is min(1, factor), and
    it is made non-decreasing in ``n`` (a running maximum, which leaves the factor alone where it already
    grows with ``n``, as it does for both cost models here). Both keep ``decode_time`` non-decreasing in
    ``n_seqs``, so the lower bound (lssim.bounds) stays valid when priced with this model.
    """

    def __init__(self, base: CostModel, speculation) -> None:
        self.base, self.speculation = base, speculation
        spec = speculation
        self.max_batch = spec.max_batch
        factors = [1.0]  # index 0 unused (an idle instance decodes nothing)
        for n in range(1, spec.max_batch + 1):
            if spec.lossless:
                t1 = base.decode_time(n, 0, 1)
                verify = base.decode_time(n * (spec.gamma + 1), 0, 1) / t1
                f = (spec.gamma * spec.draft_cost + verify) / spec.tokens_per_verification()
            else:
                f = spec.layer_fraction
            factors.append(min(1.0, max(f, factors[-1] if n > 1 else 0.0)))
        self._factors = factors
        self.name = f"{base.name}+{spec.method}"

    def factor(self, n_seqs: int) -> float:
        """Time per generated token with speculation over time without, at ``n_seqs`` running sequences."""
        return self._factors[n_seqs] if 0 < n_seqs <= self.max_batch else 1.0

    def decode_time(self, n_seqs: int, ctx_tokens: float, n_iters: int) -> float:
        if 0 < n_seqs <= self.max_batch:
            return self._factors[n_seqs] * self.base.decode_time(n_seqs, ctx_tokens, n_iters)
        return self.base.decode_time(n_seqs, ctx_tokens, n_iters)

    def iterations_within(self, n_seqs: int, ctx_tokens: float, seconds: float) -> int:
        if not 0 < n_seqs <= self.max_batch or self._factors[n_seqs] == 1.0:
            return self.base.iterations_within(n_seqs, ctx_tokens, seconds)
        if seconds <= 0.0:
            return 0
        k = self.base.iterations_within(n_seqs, ctx_tokens, seconds / self._factors[n_seqs])
        # the division may round either way: settle against the forward formula
        return _settle(self.decode_time, n_seqs, ctx_tokens, seconds, k)

    def prefill_time(self, n_tokens: int) -> float:
        return self.base.prefill_time(n_tokens)

    def departure_time(self, n_leaving: int) -> float:
        return self.base.departure_time(n_leaving)

    def work_time(self, tokens: float, context_reads: float, max_num_seqs: int) -> float:
        # every iteration costs at least the smallest factor times its plain cost
        return min(self._factors[1:] + [1.0]) * self.base.work_time(tokens, context_reads, max_num_seqs)

    def describe(self) -> dict:
        return {"kind": "speculative", "name": self.name, "base": self.base.describe(),
                "speculation": asdict(self.speculation),
                "factor": {n: self.factor(n) for n in sorted({1, 8, 16, self.max_batch}) if n <= self.max_batch}}

    def __repr__(self) -> str:
        return f"SpeculativeCost({self.base!r}, {self.speculation!r})"

