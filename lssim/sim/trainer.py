"""The simulated trainer: SimTrainer prices a step's train phase with a training-phase cost model; TrainTimeModel is the
old linear placeholder model (lssim.sim.training holds the measured ones). The engine it trains beside: lssim.sim.world.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from lssim.loop.contracts import Trainer
from lssim.loop.cost_contracts import TrainCostModel
from lssim.sim.training import AnalyticTrainCost, StreamedUpdate, TrainPhases, check_lengths

if TYPE_CHECKING:
    from lssim.sim.world import SimEngine


@dataclass(slots=True)
class TrainTimeModel(TrainCostModel):
    """The old linear placeholder, kept for tests and back-of-envelope runs: the update takes fixed + per_token x
    (prompt + response tokens trained), then a fixed weight sync; no log-prob, reference or switch phase.

    Defaults: a 7B model on 8 H100s, 6 * 7e9 FLOPs per token at 40% MFU of 989 TFLOP/s each gives about
    1.3e-5 s per token; a few seconds of fixed overhead; ~10 s to push weights to the rollout engines. Never
    measured: lssim.sim.training.AnalyticTrainCost (the simulator's default) and ProfiledTrainCost replace it.
    It speaks lssim.sim.training.TrainCostModel, ignoring the devices and the mode.
    """

    seconds_per_token: float = 1.3e-5
    fixed_seconds: float = 5.0
    sync_seconds: float = 10.0

    def __post_init__(self):
        for name in ("seconds_per_token", "fixed_seconds", "sync_seconds"):
            if getattr(self, name) < 0:
                raise ValueError(f"TrainTimeModel.{name} must be >= 0, got {getattr(self, name)}")

    def phases(self, seq_lens, prompt_lens, n_devices: int, *, collocated: bool) -> TrainPhases:
        seq, _ = check_lengths(seq_lens, prompt_lens)
        update = self.fixed_seconds + self.seconds_per_token * float(seq.sum())
        return TrainPhases(0.0, 0.0, update, self.sync_seconds, 0.0)

    def micro_batch_seconds(self, seq_lens, n_devices: int = 1, *, forward_only: bool = False) -> float:
        seq, _ = check_lengths(seq_lens)
        return self.seconds_per_token * float(seq.sum()) / (3.0 if forward_only else 1.0)

    def optimizer_step_seconds(self, n_devices: int = 1) -> float:
        return 0.0

    def streamed_update(self, pieces, n_devices: int = 1) -> StreamedUpdate:
        update = np.array([self.seconds_per_token * float(np.sum(seq)) for seq in pieces])
        return StreamedUpdate(np.zeros(len(pieces)), update, self.fixed_seconds)

    def describe(self) -> dict:
        return {"kind": "linear placeholder (never measured)", "seconds_per_token": self.seconds_per_token,
                "fixed_seconds": self.fixed_seconds, "sync_seconds": self.sync_seconds}


class SimTrainer(Trainer):
    """The simulated train phase: prices the step's sequences with a training-phase cost model
    (lssim.sim.training.TrainCostModel); the execution mode puts them on the world's clock (lssim.loop.modes: blocking
    for collocated, beside the rollout for the others).

    `n_devices`: devices the trainer runs on; `collocated`: rollout shares them (verl's default: a context switch
    per step, weights synced by IPC). `signal_only`: train only groups whose rewards differ, as real_backend's
    GRPOTrainer does (verl trains every sequence, zero advantages included)."""

    def __init__(self, engine: SimEngine, model: TrainCostModel | None = None, *, n_devices: int = 8,
                 collocated: bool = True, signal_only: bool = False):
        if isinstance(n_devices, bool) or not isinstance(n_devices, int) or n_devices < 1:
            raise ValueError(f"SimTrainer: n_devices must be an int >= 1, got {n_devices!r}")
        self.engine, self.model = engine, model if model is not None else AnalyticTrainCost()
        self.n_devices, self.collocated, self.signal_only = n_devices, collocated, signal_only
        self.train_mask = None  # a policy's train_mask hook (set_train_mask); None: every token trained

    def set_train_mask(self, hook) -> bool:
        """Ask `hook` (Policy.train_mask) which tokens each step trains, and price only those (lssim.sim.train_policy)."""
        self.train_mask = hook
        return True

    def lengths(self, groups) -> tuple[np.ndarray, np.ndarray]:
        """(prompt + response, prompt) tokens of every sequence this step trains."""
        from lssim.loop.columns import gather, with_signal

        # only the fields priced (groups of Request objects are read a field at a time, not gathered whole)
        prompt, sizes = gather(groups, "prompt_len")
        seq = prompt + gather(groups, "generated")[0]
        if self.signal_only:
            keep = np.repeat(with_signal(gather(groups, "reward")[0], sizes), sizes)
            prompt, seq = prompt[keep], seq[keep]
        return seq, prompt

    def price_streamed(self, groups, step: int) -> StreamedUpdate | None:
        """Each group's piece of the update when it streams in as it ends (hybrid), and the rest; None under a
        policy's train_mask (its tokens are priced by the whole batch: lssim.sim.train_policy)."""
        if self.train_mask is not None:
            return None
        return self.model.streamed_update([self.lengths([g])[0] for g in groups], self.n_devices)

    def train(self, groups, step: int) -> dict:
        if self.train_mask is not None:
            return self._train_masked(groups, step)
        seq, prompt = self.lengths(groups)
        phases = self.model.phases(seq, prompt, self.n_devices, collocated=self.collocated)
        # "seconds": the whole train phase (train_seconds in the step row is the clock's view of the same).
        return {"seconds": phases.total, **phases.as_metrics(), "tokens": int(seq.sum()), "sequences": len(seq)}

    def _train_masked(self, groups, step: int) -> dict:
        from lssim.sim.train_policy import price_masked, sim_batch

        batch = sim_batch(groups, step, self.signal_only)
        mask = self.train_mask(batch)
        if mask is None:
            seq = batch.prompt_len + batch.response_len
            phases, pruning = self.model.phases(seq, batch.prompt_len, self.n_devices, collocated=self.collocated), {}
        else:
            phases, pruning = price_masked(self.model, batch, mask.check(batch), self.n_devices, collocated=self.collocated)
        tokens = int((batch.prompt_len + batch.response_len).sum())
        return {"seconds": phases.total, **phases.as_metrics(), "tokens": tokens, "sequences": len(batch), **pruning}
