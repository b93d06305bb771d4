"""Simulated engine instances that share one host: while b of them are busy, each runs `slowdown[b-1]` times
slower than its cost model says (processor sharing, measured per layout by real_backend/layout.py).

    engine = SharedHostEngine(workload, cost, EngineConfig(n_instances=2, ...), slowdown=(0.99, 1.52))

Why: SimEngine's instances are independent, as GPUs are. Several vLLM instances on one CPU host are not (they
share the cores, the front end that streams their tokens, the memory bus): measured on a 2-core machine, an
instance runs at about its profiled speed alone and ~1.5x slower while the other is busy, so a policy that
spreads the tail over both instances (seer's requeues) gains less than independent instances would predict,
and one that leaves an instance alone with the tail loses less.

How: the cost model every instance prices with is the base model times slowdown[b - 1] (b: instances with a
sequence running, at most len(slowdown) counted). When b changes (a submission, an abort, an event that
empties or fills an instance), every busy instance is first brought to its last iteration boundary at the old
speed, then its next event is priced again at the new one (the iteration in progress is priced at the new
speed: off by at most one iteration per change). The batch route (lssim.sim.fastsim) prices instances apart, so
this engine keeps every rollout on the event route; speculation is not modelled on a shared host.
"""

from __future__ import annotations

import math
from typing import Sequence

from lssim.loop.cost_contracts import CostModel
from lssim.sim.world import SimEngine


def slowdown_problem(slowdown) -> str | None:
    """Why `slowdown` is not a host slow-down (None if it is): one finite factor > 0 per number of busy instances."""
    try:
        values = [float(v) for v in slowdown]
    except (TypeError, ValueError):
        return f"host slow-down must be a sequence of numbers (one per number of busy instances), got {slowdown!r}"
    if not values or not all(math.isfinite(v) and v > 0 for v in values):
        return f"host slow-down must be one finite factor > 0 per number of busy instances, got {slowdown!r}"
    return None


class ScaledCost(CostModel):
    """A cost model whose every time is `factor` times its base's."""

    def __init__(self, base, factor: float):
        self.base, self.scale = base, float(factor)

    def decode_time(self, n_seqs: int, ctx_tokens: float, n_iters: int) -> float:
        return self.scale * self.base.decode_time(n_seqs, ctx_tokens, n_iters)

    def iterations_within(self, n_seqs: int, ctx_tokens: float, seconds: float) -> int:
        return self.base.iterations_within(n_seqs, ctx_tokens, seconds / self.scale)

    def prefill_time(self, n_tokens: int) -> float:
        return self.scale * self.base.prefill_time(n_tokens)

    def departure_time(self, n_leaving: int) -> float:
        return self.scale * self.base.departure_time(n_leaving)

    def abort_time(self, n_aborted: int) -> float:  # the caller's, not the instances': not slowed by their sharing
        return self.base.abort_time(n_aborted)

    def work_time(self, tokens: float, context_reads: float, max_num_seqs: int) -> float:
        return self.scale * self.base.work_time(tokens, context_reads, max_num_seqs)

    def factor(self, n_seqs: int) -> float:  # speculation's per-token factor: none here
        return 1.0

    def describe(self) -> dict:
        return {**self.base.describe(), "scaled_by": self.scale}


class SharedHostEngine(SimEngine):
    """SimEngine whose instances share one host (module docstring)."""

    def __init__(self, workload, cost, config=None, *args, slowdown: Sequence[float], **kwargs):
        problem = slowdown_problem(slowdown)
        if problem:
            raise ValueError(problem)
        kwargs["batch_route"] = False  # the batch route prices instances apart
        super().__init__(workload, cost, config, *args, **kwargs)
        self.slowdown = tuple(float(v) for v in slowdown)
        self._by_busy = [ScaledCost(cost, s) for s in self.slowdown]
        self._busy_now = 1
        self.cost = self.base_cost = self._by_busy[0]

    def set_speculation(self, speculation) -> None:
        if speculation is not None:
            raise ValueError("speculative decoding is not modelled on instances that share a host (SharedHostEngine)")

    def submit(self, requests) -> None:
        super().submit(requests)
        self._reprice()

    def abort(self, r) -> None:
        super().abort(r)
        self._reprice()

    def next_events(self):
        out = super().next_events()
        self._reprice()
        return out

    def _reprice(self) -> None:
        """If the number of busy instances changed: the busy ones to now at the old speed, then rescheduled."""
        busy = [inst for inst in self.instances if inst.n]
        b = min(max(len(busy), 1), len(self.slowdown))
        if b == self._busy_now:
            return
        for inst in busy:
            self._catch_up(inst, self.clock)
        self._busy_now = b
        self.cost = self.base_cost = self._by_busy[b - 1]
        for inst in busy:
            self._schedule(inst)


__all__ = ["SharedHostEngine", "ScaledCost", "slowdown_problem"]
