"""An engine instance's limits (EngineConfig) and state (Instance), as lssim.sim.world.SimEngine keeps them, and its
refusal of a policy that reads signals the trace lacks (MissingSignals)."""

from __future__ import annotations

from dataclasses import dataclass

from lssim.traces.signal_trace import HOW_TO_MEASURE


@dataclass(slots=True)
class EngineConfig:
    """One engine instance's limits (vLLM's `max_num_seqs` and KV-cache size) and the cluster size."""

    n_instances: int = 8
    max_num_seqs: int = 256
    kv_capacity_tokens: int = 500_000

    def __post_init__(self):
        for name in ("n_instances", "max_num_seqs", "kv_capacity_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"EngineConfig.{name} must be >= 1, got {getattr(self, name)}")


class Instance:
    """One engine instance's state (lssim.sim.world.SimEngine runs it)."""

    __slots__ = ("idx", "t", "it", "n", "ctx", "running", "waiting", "members", "busy", "seq_seconds", "version", "pending",
                 "left_at", "left", "owed", "priced")

    def __init__(self, idx: int, t: float):
        self.idx = idx
        self.t = t  # time at the iteration boundary `it`
        self.it = 0  # decode iterations run so far
        self.n = 0  # running sequences
        self.ctx = 0  # sum of running sequences' context lengths at boundary `it` (= KV tokens held)
        self.running: list = []  # heap of (iteration, seq, event kind, epoch, request): finishes and checkpoints
        self.waiting: list = []  # heap of (priority, arrival, epoch, request)
        self.members: dict[int, tuple] = {}  # rid -> (priority, arrival, admit_it, generated_at_admit, request)
        self.busy = 0.0  # seconds with at least one sequence running
        self.seq_seconds = 0.0  # integral of running sequences over time (mean batch = seq_seconds / busy)
        self.version = 0  # invalidates this instance's stale entries in the cluster's event heap
        self.pending = 0  # requests placed here and not yet ended (running + waiting)
        self.left_at, self.left = -1, 0  # the boundary of the last departure and how many left there
        self.owed = 0.0  # departure (re-pack) seconds the next iteration pays; dropped if the batch empties first
        self.priced = (0, 0, 0, 0.0)  # (n, ctx, k, decode_time) priced by _schedule: _fire runs that very span next


class MissingSignals(ValueError):
    """A policy reads early-exit signals the replayed trace does not have."""

    @classmethod
    def of(cls, missing: frozenset[str], source: str | None) -> "MissingSignals":
        """The refusal naming the `missing` signals, the trace's signal source and how to measure them."""
        why = ("no signal_repetition / signal_entropy measured from tokens, no loop_start / entropy_collapse_start "
               "labels" if not source else "its entropy is unknown (measured without log-probs, or labels without "
               "entropy_mean)")
        return cls(f"it reads the early-exit signal(s) {', '.join(sorted(missing))}, which this trace lacks (signal "
                   f"source: {source or 'none'}: {why}); {HOW_TO_MEASURE}; or replay with --allow-missing-signals (the "
                   f"table then says what was missing)")
