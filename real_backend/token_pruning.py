"""Training-side token pruning on the real GRPO trainer: G2TP and micro-entropy pruning, and what they can save.

    lssim real --policy hadb+g2tp ...          # the policy objects (policies/g2tp.py, policies/entropy_prune.py)
    trainer = PruningGRPOTrainer(model_dir, engine, prompts, method="g2tp", fraction=0.4, compact=True)

The decisions are the policies' (`Policy.train_mask`, asked by GRPOTrainer each step); this module keeps the
per-sample helpers and PruningGRPOTrainer, a GRPOTrainer driven by one of those policies, for measurements.

G2TP, gradient-guided token pruning (the seed plan, /work/shared/seeds/000: part 二, 方案一): each loss token
scores ``S_t = |A| x (1 - p_old(t))``; the lowest-scoring ``fraction`` of the batch's loss tokens leave the loss
(tokens the model has mastered, in samples that matter little). Micro-entropy pruning (part 三, 创新点 3): a
window of ``window`` response tokens whose mean entropy is below ``threshold`` (nats) leaves the loss. vLLM
records only the sampled token's log-prob, so a window's mean surprisal (-log p of the sampled token, whose
expectation under the policy is the entropy) stands for its mean entropy. Both read vLLM's behaviour log-probs,
which exist before any training forward, so pruning is decided before the log-prob recompute and the update.

What pruning can save, honestly. A causal transformer cannot skip a token that a later token attends to, and
the backward runs through every position a kept token's loss depends on, so taking interior tokens out of the
loss saves nothing in the transformer's body. What it can save:

1. a sequence with no kept token: dropped from the batch (its forward, backward and log-prob recompute);
2. a pruned suffix, everything after a sequence's last kept token: nothing kept depends on it, so it is cut
   from the input (fewer tokens to pack, shorter padded micro-batches, less attention);
3. for interior pruned tokens, at most the LM head and log-softmax at their positions (not done here: the
   reference model's vocabulary has 18 tokens, nothing to measure; on Qwen2.5-7B the head is
   2 x 3584 x 152064 FLOPs per token, 7% of the forward).

``compact=True`` does 1 and 2, ``compact=False`` only masks. The kept tokens, their advantages and the loss's
normalisation (the count of kept tokens) are the same either way, so both give the same update (tested); only
the time differs. paper/experiments/measure_pruning.py measures it; lssim.sim.training.ScaledTrainCost takes the result.
"""

from __future__ import annotations

import numpy as np

from lssim.loop.policy import Policy, TrainBatch

from .trainer import GRPOTrainer, Sample

METHODS = ("g2tp", "entropy")


def _batch(samples: list[Sample]) -> TrainBatch:
    return TrainBatch(0, np.array([len(s.prompt) for s in samples], np.int64), np.array([len(s.response) for s in samples], np.int64),
                      np.array([s.advantage for s in samples], float), np.array([s.group for s in samples], np.int64),
                      logprobs=tuple(np.asarray(s.behaviour, float) for s in samples),
                      in_loss=tuple(np.asarray(s.mask, float) > 0 for s in samples))


def g2tp_masks(samples: list[Sample], fraction: float) -> list[np.ndarray]:
    """Per sample, 1 for a token kept in the loss, 0 for one pruned: the batch's lowest ``fraction`` of
    |advantage| x (1 - p_old) among the tokens in the loss now (ties broken by position, stably); policies/g2tp.py."""
    from policies.g2tp import g2tp_keep

    if not 0 <= fraction < 1:
        raise ValueError(f"G2TP fraction must be in [0, 1), got {fraction}")
    return [k.astype(float) for k in g2tp_keep(_batch(samples), fraction)]


def entropy_masks(samples: list[Sample], window: int, threshold: float) -> list[np.ndarray]:
    """Per sample, 0 over each window of ``window`` response tokens whose mean surprisal is below ``threshold``
    (policies/entropy_prune.py; here the tokens already out of the loss are not looked at)."""
    from policies.entropy_prune import entropy_keep

    if window < 1 or not threshold >= 0:
        raise ValueError(f"micro-entropy pruning needs window >= 1 and threshold >= 0, got {window}, {threshold}")
    batch = _batch(samples)
    return [k.astype(float) for k in entropy_keep(TrainBatch(0, batch.prompt_len, batch.response_len, batch.advantage,
                                                             batch.group, batch.logprobs), window, threshold)]


def compact_samples(samples: list[Sample]) -> list[Sample]:
    """Drop samples with no kept token; cut each sample after its last kept token."""
    out = []
    for s in samples:
        kept = np.flatnonzero(np.asarray(s.mask) > 0)
        if not len(kept):
            continue
        end = int(kept[-1]) + 1
        out.append(Sample(s.prompt, s.response[:end], s.behaviour[:end], s.mask[:end], s.advantage, s.group, s.rid))
    return out


def pruning_policy(method: str = "g2tp", fraction: float = 0.4, window: int = 16, threshold: float = 0.05,
                   compact: bool = True) -> Policy:
    """The policy object (policies/g2tp.py or policies/entropy_prune.py) for these settings."""
    if method not in METHODS:
        raise ValueError(f"pruning method must be one of {METHODS}, got {method!r}")
    if method == "g2tp":
        from policies.g2tp import G2TP

        return G2TP(fraction=fraction, compact=compact)
    from policies.entropy_prune import EntropyPrune

    return EntropyPrune(window=window, threshold=threshold, compact=compact)


class PruningGRPOTrainer(GRPOTrainer):
    """GRPOTrainer driven by one pruning policy (`pruning_policy`), as `lssim real --policy g2tp` drives the plain
    GRPOTrainer through the controller: a convenience for measurements (paper/experiments/measure_pruning.py).

    ``last_pruning`` (also in the metrics): loss tokens before and after, and the tokens the forward passes
    run over before and after (prompt + response, after compaction)."""

    def __init__(self, *args, method: str = "g2tp", fraction: float = 0.4, window: int = 16, threshold: float = 0.05,
                 compact: bool = True, **kwargs):
        policy = pruning_policy(method, fraction, window, threshold, compact)
        super().__init__(*args, **kwargs)
        self.method, self.fraction, self.window, self.threshold, self.compact = method, fraction, window, threshold, compact
        self.set_train_mask(policy.train_mask)
