"""Seer's chunk rules (policies/seer.py), written once for numbers and arrays: the priority a request is queued at
(`rank`) and whether a request goes back to the scheduler at a chunk boundary (`moves`). The policy calls them on one
request's numbers on the event route and on a submission's arrays; the simulator's requeue route
(lssim.sim.requeue_route) runs them compiled inside its event loop (`rank_at`, `moves_at`: the same functions, declared
as kernels). `RequeueRules` is what a policy's array form of such an on_progress answers (Policy.progress_requeues).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lssim.kernels import BOOL, I64, kernel

BAND = 1 << 40  # priority bands: probes < started requests < fresh requests (lower runs first)


def rank(probe, generated, estimate):
    """Seer's queue order (lower runs first), on one request's numbers or elementwise on arrays of many: a probe by
    its tokens generated (shortest first), ahead of every started request, ahead of every fresh one; those two
    longest-first by their group's estimate (never below what they generated)."""
    longest = estimate + (generated - estimate) * (generated > estimate)  # max(estimate, generated), arrays alike
    return probe * (generated - 3 * BAND) + (1 - probe) * (-BAND - (generated > 0) * BAND - longest)


def moves(here, least, rebalance, every_chunk):
    """At a chunk boundary, whether a request goes back to the scheduler: its instance holds `here` of the policy's
    requests and the least-loaded one `least` (numbers, or arrays elementwise); `every_chunk`: always."""
    return every_chunk | (here - least >= rebalance)


rank_at = kernel(I64, I64, I64)(rank)  # the same functions, compiled for the requeue route's loop (one request's ints)
moves_at = kernel(I64, I64, I64, BOOL)(moves)


@dataclass(frozen=True)
class RequeueRules:
    """A submission's requeue rules (Policy.progress_requeues), row by row in the submission's order: which rows are
    their group's probe, each row's group estimate now (`estimate`: the group's longest finished member, else its
    prompt's history, else its budget) and whether its group has a finished member yet (`known`); per instance, how many
    of the policy's requests it holds (`counts`, the submission placed); the imbalance that
    sends a request back (`rebalance`) or `every_chunk`. Once a member of a group finishes by itself or by its budget,
    the group's estimate is its longest such member (`rank` then reads it)."""

    probe: np.ndarray  # bool per row
    estimate: np.ndarray  # int64 per row
    known: np.ndarray  # bool per row: `estimate` is its group's longest finished member (else a prior)
    counts: np.ndarray  # int64 per instance: the policy's requests placed there and not ended (the submission's too)
    rebalance: int
    every_chunk: bool

    def __post_init__(self):
        n = len(self.probe)
        if len(self.estimate) != n or len(self.known) != n:
            raise ValueError(f"RequeueRules: probe, estimate and known must have one entry per row, got {n}, "
                             f"{len(self.estimate)}, {len(self.known)}")
        if not isinstance(self.rebalance, int) or self.rebalance < 1:
            raise ValueError(f"RequeueRules: rebalance must be an int >= 1, got {self.rebalance!r}")
