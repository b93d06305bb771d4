"""A GRPO step streamed in as its groups finish (RLinf's pipelined mode; lssim.loop.modes.Hybrid), and the trainer
states a checkpoint beside the rollout is taken from.

    trainer.feed(group, step)      # during the rollout, once the group ended: its forward and backward on the lane
    trainer.stream_group(stream, group)  # the same piece on the caller's thread (real_backend.host_sharing times it)
    job = trainer.start(batch, step)  # after it: the groups not fed yet, then the one optimizer step

Why the streamed update is the update: GRPO's advantages are per group (a group's samples need only the group),
and the loss is the token-level mean over the whole batch, `-sum(surrogate * mask) / n_tokens`. Its gradient is
the sum of each micro-batch's `-sum(surrogate * mask)` gradient divided by `n_tokens`, so each fed group's
gradient is accumulated unnormalised (n_tokens is not known until every group is in) and the sum is divided once
when the rollout ends, before gradient clipping and the optimizer step: the same update up to float rounding
(tests/test_real_modes_stream.py). Streaming needs one optimizer step per RL step (`mini_batches=1`: a second one
would train on weights the first changed) and no policy `train_mask` (it reads the whole batch); otherwise
`feed` does nothing and the update runs whole after the rollout. A fed group that the step does not train after
all (the policy's `select` left it out) makes the update start over on the step's batch: the result never
depends on what was streamed.
"""

from __future__ import annotations

import copy
import math

import torch


def group_key(group) -> tuple[int, ...]:
    """A group as the trainer recognises it again: its members' request ids."""
    return tuple(sorted(r.rid for r in group.requests))


class GradientStream:
    """Step `step`'s gradients so far: the groups fed (by `group_key`), their samples and loss tokens, the
    unnormalised sums of loss, clipped tokens and |logp - behaviour|, and when and how long it ran."""

    __slots__ = ("step", "keys", "samples", "signal_groups", "tokens", "loss", "clipped", "gap", "start", "seconds",
                 "logprob_seconds", "cpu_seconds", "logprob_cpu_seconds", "work", "pieces")

    def __init__(self, step: int):
        self.step, self.keys = step, set()
        self.work: list = []  # the futures of the fed groups' work on the lane (their errors are the update's)
        self.samples = self.signal_groups = self.tokens = 0
        self.loss = self.clipped = self.gap = 0.0
        self.start = math.nan  # the engine's clock when the first fed group's work began
        self.seconds = self.logprob_seconds = self.cpu_seconds = self.logprob_cpu_seconds = 0.0
        self.pieces: list[list] = []  # each fed group's [start, end] on the engine's clock and its samples (0: no signal)

    def covers(self, groups) -> bool:
        """Is every fed group one of `groups` (the step's batch)? If not, what was streamed is not the update."""
        return self.keys <= {group_key(g) for g in groups}


def capture(trainer, weights: dict | None = None) -> dict:
    """The trainer's state now, as a checkpoint holds it: weights, AdamW's moments, its version and generators
    (copies: later steps cannot change them). `weights`: a copy of the weights taken already (a job's snapshot)."""
    return {"model": weights if weights is not None else {k: v.detach().clone() for k, v in trainer.model.state_dict().items()},
            "optimizer": copy.deepcopy(trainer.optimizer.state_dict()),
            "trainer": {"version": trainer.version, "rng": copy.deepcopy(trainer.rng.bit_generator.state),
                        "torch_rng": torch.get_rng_state()}}


__all__ = ["GradientStream", "group_key", "capture"]
