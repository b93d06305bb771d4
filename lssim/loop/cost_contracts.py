"""The cost-model contracts: what the simulator needs from an engine's execution-time model and from a
training-phase time model (the other contracts: lssim.loop.contracts).

    CostModel       an engine's execution-time model (lssim.cost: roofline, profiled, operators, speculative)
    TrainCostModel  a training-phase time model (lssim.sim.training, lssim.sim.train_profiled,
                    lssim.sim.trainer.TrainTimeModel)
    price_each      a scalar price of each distinct value (CostModel's array forms)
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np

__all__ = ["CostModel", "TrainCostModel", "price_each"]


@runtime_checkable
class CostModel(Protocol):
    """What the simulator needs from an execution-time model (lssim.cost.protocol's docstring: the conventions).

    Optional, with defaults built on the scalar methods (a model overrides them where it has faster forms):
    `decode_times` / `prefill_times` / `departure_times`, array forms equal to the scalar calls to the last bit
    (the batch route, lssim.sim.fastsim, prices whole rollouts with them); `abort_time`, seconds the caller is
    blocked aborting requests, and `resume_time`, resubmitting requests with tokens already generated (0: a model
    that does not know)."""

    name: str

    def decode_time(self, n_seqs: int, ctx_tokens: float, n_iters: int) -> float:
        """Seconds for ``n_iters`` consecutive decode iterations of one engine instance with
        ``n_seqs`` running sequences, where ``ctx_tokens`` is the sum of the sequences' context
        lengths (prompt + generated) at the first of those iterations; the sum grows by ``n_seqs``
        each iteration. Exact for the model's per-iteration formula (closed form), monotone
        non-decreasing in every argument, and 0 for ``n_iters == 0``."""
        ...

    def iterations_within(self, n_seqs: int, ctx_tokens: float, seconds: float) -> int:
        """The largest ``k >= 0`` with ``decode_time(n_seqs, ctx_tokens, k) <= seconds``."""
        ...

    def prefill_time(self, n_tokens: int) -> float:
        """Seconds to prefill ``n_tokens`` prompt tokens (added to the admitting iteration);
        0 for ``n_tokens <= 0``; affine (hence subadditive) in ``n_tokens`` above 0."""
        ...

    def work_time(self, tokens: float, context_reads: float, max_num_seqs: int) -> float:
        """A lower bound on the summed decode seconds of any schedule that generates ``tokens`` tokens with at
        most ``max_num_seqs`` sequences per iteration, where ``context_reads`` is the sum over those tokens of
        the context each was decoded at (schedule-independent: a response of ``L`` tokens on a context of
        ``c`` reads ``L*c + L*(L-1)/2``). The lower bound's work term (lssim.sim.bounds)."""
        ...

    def departure_time(self, n_leaving: int) -> float:
        """Seconds added when ``n_leaving`` sequences leave the running batch at one iteration boundary;
        0 for ``n_leaving <= 0``, non-negative otherwise."""
        ...

    def describe(self) -> dict:
        """The model's parameters, for reports."""
        ...

    def decode_times(self, n_seqs: np.ndarray, ctx_tokens: np.ndarray, n_iters: np.ndarray) -> np.ndarray:
        """`decode_time` of every span i, equal to the scalar call."""
        return np.fromiter((self.decode_time(a, b, c) for a, b, c in zip(n_seqs.tolist(), ctx_tokens.tolist(), n_iters.tolist())),
                           dtype=float, count=len(n_seqs))

    def prefill_times(self, n_tokens: np.ndarray) -> np.ndarray:
        """`prefill_time` of each."""
        return price_each(self.prefill_time, n_tokens)

    def departure_times(self, n_leaving: np.ndarray) -> np.ndarray:
        """`departure_time` of each."""
        return price_each(self.departure_time, n_leaving)

    def abort_time(self, n_aborted: int) -> float:
        """Seconds the caller of the serving API is blocked while it aborts `n_aborted` requests; 0 unknown."""
        return 0.0

    def resume_time(self, n_resumed: int) -> float:
        """Seconds a resubmission of `n_resumed` requests with tokens already generated (an async weight arrival's,
        a carry's, a requeue's) costs beyond their re-prefill, before they reach the engine; 0 unknown."""
        return 0.0


def price_each(fn, values: np.ndarray) -> np.ndarray:
    """fn(v) for each distinct v (prefill and departure are cheap scalars; distinct values are few). Most records
    admit nothing and end nothing: v <= 0 costs 0 (CostModel), only the rest are sorted."""
    out = np.zeros(len(values))
    live = np.flatnonzero(values > 0)
    if len(live):
        uniq, inverse = np.unique(values[live], return_inverse=True)
        out[live] = np.array([fn(int(v)) for v in uniq.tolist()], dtype=float)[inverse]
    return out


@runtime_checkable
class TrainCostModel(Protocol):
    """What the simulator (and the execution modes built on it) need from a training-phase model."""

    def phases(self, seq_lens: np.ndarray, prompt_lens: np.ndarray, n_devices: int, *, collocated: bool):
        """Seconds per phase for one step that trains these sequences (``seq_lens``: prompt + response tokens of
        each; ``prompt_lens``: its prompt tokens) on ``n_devices`` devices; ``collocated``: rollout shares them
        (adds the context switch; weights sync by IPC rather than over the network). An empty batch trains
        nothing and syncs nothing: all zero. Returns an lssim.sim.training.TrainPhases."""
        ...

    def micro_batch_seconds(self, seq_lens: np.ndarray, n_devices: int = 1, *, forward_only: bool = False) -> float:
        """Seconds of one micro-batch holding these sequences: forward + backward (``forward_only``: forward),
        no optimizer step; for modes that stream micro-batches into training as groups finish."""
        ...

    def optimizer_step_seconds(self, n_devices: int = 1) -> float:
        """Seconds of one optimizer step (after a mini-batch's micro-batches)."""
        ...

    def streamed_update(self, pieces: list[np.ndarray], n_devices: int = 1):
        """One step's update over `pieces` (each: the prompt + response tokens of one group's sequences) when each
        streams into training on its own as its group ends (hybrid). Returns an lssim.sim.train_batches.StreamedUpdate.
        By default each piece is one forward + backward micro-batch and the rest one optimizer step."""
        from lssim.sim.train_batches import StreamedUpdate

        update = np.array([self.micro_batch_seconds(seq, n_devices) for seq in pieces], dtype=float)
        return StreamedUpdate(np.zeros(len(pieces)), update, self.optimizer_step_seconds(n_devices))

    def describe(self) -> dict:
        """Every constant, with its source."""
        ...
