"""A submission's progress checkpoints on the simulator's batch route: what the array form of on_progress reads
(Policy.progress_stops) to say where it stops each response, before the rollout is scheduled (lssim.sim.event_kernels).

The event engine (lssim.sim.world.SimEngine) reports a running response every `interval` tokens strictly inside its
natural length, each multiple once, in order, whatever preemption does (a checkpoint at a boundary fires before the
boundary preempts, and a resumed response's next one is the next multiple), with the window signals of its trace row
there. A rule that reads only those (and its own books of each response) therefore decides the same stops on both
routes, wherever the checkpoints fall in time.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np


class Checkpoints:
    """The checkpoints of `len(length)` responses: iterate for (rows, generated) -- the responses that reach their
    next checkpoint, in checkpoint order (the j-th multiple of the interval for every one of them at once) -- and ask
    `window(rows, generated)` for the signals there, as the event engine puts them in Request.signals."""

    def __init__(self, length: np.ndarray, start: np.ndarray, interval: int, max_tokens: np.ndarray, trace_rows: np.ndarray,
                 signals, spec):
        if interval < 1:
            raise ValueError(f"Checkpoints: the interval must be >= 1 token, got {interval}")
        self.length, self.start, self.interval = length, start, interval  # start: tokens generated before the rollout
        self.max_tokens, self.trace_rows, self._signals, self._spec = max_tokens, trace_rows, signals, spec

    def __len__(self) -> int:
        return len(self.length)

    def __iter__(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        c = self.interval
        first = (self.start // c + 1) * c  # SimEngine._push_checkpoint's next multiple
        live = np.flatnonzero(first < self.length)
        at = first[live]
        while len(live):
            yield live, at
            at = at + c
            keep = at < self.length[live]
            live, at = live[keep], at[keep]

    def window(self, rows: np.ndarray, generated: np.ndarray) -> tuple[dict, np.ndarray]:
        """The window signals of responses `rows` after `generated` tokens (lssim.traces.signal_trace.TraceSignals.windows):
        a dict of arrays and which rows have any."""
        return self._signals.windows(self.trace_rows[rows], generated, self._spec, self.max_tokens[rows])
