"""entropy_prune -- micro-entropy pruning (seed plan §3.3, /work/shared/seeds/000: part 三, 创新点 3).

Rule (each step, before the log-prob recompute and the update): each response is cut into windows of ``window``
tokens; a window whose mean entropy is below ``threshold`` nats (filler: restating the question, connectives, a
collapse into low-entropy rambling) leaves the loss. vLLM records only the sampled token's log-prob, so a window's
mean surprisal (-log p of the sampled token, whose expectation under the policy is the entropy) stands for its mean
entropy. ``compact``: sequences with nothing kept are dropped and each is cut after its last kept token; a
low-entropy tail (the usual shape of a collapse) is then not computed at all. The plan's further step, skipping such
a span in the next rollout by reusing its KV cache, is not done.

In the simulator there are no tokens: the policy prunes ``pruned_fraction`` of each sequence's loss tokens and cuts
the forward to ``computed_fraction`` of the batch's tokens, by default what the real trainer measured with these
settings (lssim/sim/data/pruning_cpu.json, window=16, threshold=0.05 on the reference model; `python -m
paper.experiments.measure_pruning`). Both depend on the model's confidence: on another model, measure them.

Defaults: window=16, threshold=0.05 nats, compact=True.
"""

from __future__ import annotations

import numpy as np

from lssim.loop.policy import Policy, TrainBatch, TrainMask


def entropy_keep(batch: TrainBatch, window: int, threshold: float) -> tuple[np.ndarray, ...]:
    """Per sequence, False over each window of ``window`` response tokens whose mean surprisal is below
    ``threshold``, and over tokens not in the loss before; True elsewhere."""
    if batch.logprobs is None:
        raise ValueError("entropy_keep needs the tokens' behaviour logprobs (a batch from a world with tokens)")
    out = []
    for i, lp in enumerate(batch.logprobs):
        surprisal = -np.asarray(lp, dtype=float)
        keep = np.ones(len(surprisal), bool) if batch.in_loss is None else np.asarray(batch.in_loss[i], bool).copy()
        for start in range(0, len(surprisal), window):
            if surprisal[start:start + window].mean() < threshold:
                keep[start:start + window] = False
        out.append(keep)
    return tuple(out)


def _fraction(value, name: str, low_open: bool) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and (0 < value <= 1 if low_open else 0 <= value <= 1)
    if value is not None and not ok:
        raise ValueError(f"entropy_prune: {name} must be in {'(0, 1]' if low_open else '[0, 1]'} or None (measured), got {value!r}")


class EntropyPrune(Policy):
    name = "entropy_prune"

    def __init__(self, window: int = 16, threshold: float = 0.05, compact: bool = True,
                 computed_fraction: float | None = None, pruned_fraction: float | None = None, measurement: str | None = None):
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ValueError(f"entropy_prune: window must be an int >= 1, got {window!r}")
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0 <= threshold < float("inf"):
            raise ValueError(f"entropy_prune: threshold must be a number >= 0 (nats), got {threshold!r}")
        if not isinstance(compact, bool):
            raise ValueError(f"entropy_prune: compact must be a bool, got {compact!r}")
        _fraction(computed_fraction, "computed_fraction", True)
        _fraction(pruned_fraction, "pruned_fraction", False)
        self.window, self.threshold, self.compact = window, float(threshold), compact
        self.computed_fraction, self.pruned_fraction, self.measurement = computed_fraction, pruned_fraction, measurement
        self._measured: tuple[float, float] | None = None  # (computed, pruned) fractions measured, once read

    def train_mask(self, batch: TrainBatch) -> TrainMask:
        if batch.logprobs is not None:
            return TrainMask.from_keep(entropy_keep(batch, self.window, self.threshold), self.compact)
        from lssim.sim.train_policy import MEASUREMENT, measured_fractions, measured_mask

        computed, pruned = self.computed_fraction, self.pruned_fraction
        if computed is None or pruned is None:
            if self._measured is None:  # read once: the measurement does not change during a run
                settings = {"window": self.window, "threshold": self.threshold, "compact": True}
                self._measured = measured_fractions(self.measurement or MEASUREMENT, "entropy", settings)
            m_computed, m_pruned = self._measured
            computed = m_computed if computed is None else computed
            pruned = m_pruned if pruned is None else pruned
        return measured_mask(batch, computed if self.compact else 1.0, pruned)
