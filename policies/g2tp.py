"""g2tp -- gradient-guided token pruning (seed plan §2.1, /work/shared/seeds/000: part 二, 方案一).

Rule (each step, after `select`, before the log-prob recompute and the update): every token in the loss scores
``S_t = |A| x (1 - p_old(t))`` (A: its sequence's GRPO advantage; p_old: the behaviour probability vLLM recorded
when it sampled the token); the batch's lowest-scoring ``fraction`` of loss tokens leave the loss (tokens the model
has mastered, in samples that matter little), ties broken by position. ``compact``: the trainer then drops a
sequence with no kept token and cuts each sequence after its last kept token (nothing kept depends on those in a
causal model); the update is the same, only cheaper. Interior pruned tokens save nothing in the transformer's body
(real_backend/token_pruning.py says what can be saved and where).

In the simulator there are no tokens: the policy prunes ``fraction`` of each sequence's loss tokens and cuts the
forward to ``computed_fraction`` of the batch's tokens, by default the share the real trainer still ran over when it
pruned with these settings (lssim/sim/data/pruning_cpu.json, `python -m paper.experiments.measure_pruning`; measured only
for fraction=0.4: give computed_fraction= for another). lssim.sim.train_policy spreads it and prices the rest.

Defaults: fraction=0.4 (the plan suggests pruning 30-50% of tokens), compact=True.
"""

from __future__ import annotations

import math

import numpy as np

from lssim.loop.policy import Policy, TrainBatch, TrainMask


def g2tp_keep(batch: TrainBatch, fraction: float) -> tuple[np.ndarray, ...]:
    """Per sequence, True for a response token kept in the loss: all of the batch's loss tokens less the lowest
    ``fraction`` of them by |advantage| x (1 - p_old) (a stable sort: earlier positions go first among ties)."""
    if batch.logprobs is None:
        raise ValueError("g2tp_keep needs the tokens' behaviour logprobs (a batch from a world with tokens)")
    live = [np.ones(int(n), bool) if batch.in_loss is None else np.asarray(m, bool)
            for n, m in zip(batch.response_len, batch.in_loss or [None] * len(batch))]
    if not len(batch):
        return ()
    scores = np.concatenate([abs(a) * (1.0 - np.exp(np.asarray(lp, float))) for a, lp in zip(batch.advantage, batch.logprobs)])
    keep = np.concatenate(live)
    n_prune = int(math.floor(fraction * keep.sum()))
    if n_prune:
        order = np.argsort(np.where(keep, scores, np.inf), kind="stable")
        keep[order[:n_prune]] = False
    return tuple(np.split(keep, np.cumsum(np.asarray(batch.response_len, np.int64))[:-1]))


class G2TP(Policy):
    name = "g2tp"

    def __init__(self, fraction: float = 0.4, compact: bool = True, computed_fraction: float | None = None,
                 measurement: str | None = None):
        if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 <= fraction < 1:
            raise ValueError(f"g2tp: fraction must be a number in [0, 1), got {fraction!r}")
        if not isinstance(compact, bool):
            raise ValueError(f"g2tp: compact must be a bool, got {compact!r}")
        if computed_fraction is not None and not (isinstance(computed_fraction, (int, float)) and 0 < computed_fraction <= 1):
            raise ValueError(f"g2tp: computed_fraction must be in (0, 1] or None (measured), got {computed_fraction!r}")
        self.fraction, self.compact, self.computed_fraction, self.measurement = float(fraction), compact, computed_fraction, measurement
        self._measured: float | None = None  # the measured computed_fraction, once read

    def train_mask(self, batch: TrainBatch) -> TrainMask:
        if batch.logprobs is not None:
            return TrainMask.from_keep(g2tp_keep(batch, self.fraction), self.compact)
        from lssim.sim.train_policy import MEASUREMENT, measured_fractions, measured_mask

        computed = self.computed_fraction
        if computed is None:
            if self._measured is None:  # read once: the measurement does not change during a run
                path = self.measurement or MEASUREMENT
                self._measured = 1.0 if not self.compact or self.fraction == 0 else measured_fractions(
                    path, "g2tp", {"fraction": self.fraction, "compact": True})[0]
            computed = self._measured
        return measured_mask(batch, computed, self.fraction)
