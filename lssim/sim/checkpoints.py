"""A submission's progress checkpoints on the simulator's batch route: what the array forms of on_progress read
(Policy.progress_stops, Policy.progress_carries) to say where they stop or carry each response, before the rollout is
scheduled (lssim.sim.event_kernels).

The event engine (lssim.sim.world.SimEngine) reports a running response every `interval` tokens strictly inside its
natural length, each multiple once, in order, whatever preemption does (a checkpoint at a boundary fires before the
boundary preempts, and a resumed response's next one is the next multiple), with the window signals of its trace row
there. A rule that reads only those (and its own books of each response) therefore decides the same stops on both
routes, wherever the checkpoints fall in time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Collection, Iterator

import numpy as np

from lssim.loop.signals import WINDOW_FIELDS


class Checkpoints:
    """The checkpoints of `len(length)` responses. Iterate for (rows, generated, signals, has): the responses that reach
    their next checkpoint, in checkpoint order (the j-th multiple of the interval for every one of them at once), the
    tokens each has generated there, the window signals there as the event engine puts them in Request.signals (a
    dict of arrays, lssim.loop.signals) and which rows have any (the others' values mean nothing). Or take them all at
    once, response by response (`flat`): a rule whose state is counters of checks in a row then runs as arrays along
    the checkpoints (`streaks`, `first_hits`) instead of one checkpoint at a time. `requests`: the submission's columns,
    row for row, where a rule reads a response's own books (segment: its prompt, its tokens before the step)."""

    def __init__(self, length: np.ndarray, start: np.ndarray, interval: int, max_tokens: np.ndarray, trace_rows: np.ndarray,
                 signals, spec, requests=None):
        if interval < 1:
            raise ValueError(f"Checkpoints: the interval must be >= 1 token, got {interval}")
        self.length, self.start, self.interval = length, start, interval  # start: tokens generated before the rollout
        self.max_tokens, self.trace_rows, self._signals, self._spec = max_tokens, trace_rows, signals, spec
        self._requests = requests

    @property
    def requests(self):
        """The responses' own books (lssim.loop.columns.RequestColumns, row for row): what a rule reads of each besides
        its tokens and signals (segment: its prompt, its tokens before this step)."""
        if self._requests is None:
            raise ValueError("Checkpoints: made without the submission's columns (requests=), which this rule reads")
        return self._requests

    def __len__(self) -> int:
        return len(self.length)

    def __iter__(self) -> Iterator[tuple[np.ndarray, np.ndarray, dict, np.ndarray]]:
        rows, generated, ends = self._all()
        # every checkpoint's signals in one pass over arrays; then one checkpoint (a slice of each) at a time
        signals, has = self._signals.windows(self.trace_rows[rows], generated, self._spec, self.max_tokens[rows])
        for a, b in zip(ends[:-1].tolist(), ends[1:].tolist()):
            yield rows[a:b], generated[a:b], {name: values[a:b] for name, values in signals.items()}, has[a:b]

    def flat(self) -> "FlatCheckpoints":
        """Every checkpoint at once, response by response, each one's in order."""
        c = self.interval
        first = (self.start // c + 1) * c  # SimEngine._push_checkpoint's next multiple
        count = np.maximum(0, -(-(self.length - first) // c))  # multiples in [first, length)
        starts = np.zeros(len(count) + 1, np.int64)
        np.cumsum(count, out=starts[1:])
        return FlatCheckpoints(starts, first, first - c * starts[:-1], self)

    def windows(self, rows: np.ndarray, generated: np.ndarray, names: Collection[str] = WINDOW_FIELDS) -> tuple[dict, np.ndarray]:
        """The window signals `names` (all unless fewer are asked) of responses `rows` at `generated` tokens, and which
        have any."""
        return self._signals.windows(self.trace_rows[rows], generated, self._spec, self.max_tokens[rows], names)

    def _all(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every (row, tokens generated) checkpoint, the first ones of all rows first, then the second ones, ...; and
        where each such round ends."""
        c = self.interval
        first = (self.start // c + 1) * c  # SimEngine._push_checkpoint's next multiple
        count = np.maximum(0, -(-(self.length - first) // c))  # multiples in [first, length)
        by_count = np.argsort(-count, kind="stable")
        rounds = np.arange(int(count.max()) if len(count) else 0)
        reaching = np.searchsorted(-count[by_count], -(rounds + 1), side="right")  # count > j: a prefix of by_count
        rows = np.concatenate([by_count[:m] for m in reaching.tolist()]) if len(rounds) else np.zeros(0, np.int64)
        ends = np.r_[0, np.cumsum(reaching)]
        generated = first[rows] + c * np.repeat(rounds, reaching)
        return rows, generated, ends



@dataclass(slots=True, frozen=True)
class FlatCheckpoints:
    """Every checkpoint of `len(starts) - 1` responses, response by response, each one's in order (Checkpoints.flat):
    where each response's checkpoints begin and its first one's tokens; each checkpoint's row, tokens and window
    signals where asked (all of them, or some: a rule that can tell where it may stop reads only those)."""

    starts: np.ndarray
    first: np.ndarray
    offset: np.ndarray  # each response's tokens at its checkpoint k, less interval * k: one gather per lookup
    points: Checkpoints

    @property
    def rows(self) -> np.ndarray:
        """Every checkpoint's row."""
        return np.repeat(np.arange(len(self.first)), np.diff(self.starts))

    @property
    def generated(self) -> np.ndarray:
        """Every checkpoint's tokens generated (repeated per response rather than gathered by row: quicker)."""
        c = self.points.interval
        return np.repeat(self.offset, np.diff(self.starts)) + c * np.arange(self.starts[-1])

    def rows_at(self, index: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.starts, index, side="right") - 1

    def generated_at(self, index: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray:
        """The tokens at the checkpoints at `index` (of rows `rows`, where known)."""
        rows = self.rows_at(index) if rows is None else rows
        return self.offset[rows] + self.points.interval * index

    def signals(self) -> tuple[dict, np.ndarray]:
        """Every checkpoint's window signals (a dict of arrays) and whether its row has any."""
        count, points = np.diff(self.starts), self.points
        return points._signals.windows(np.repeat(points.trace_rows, count), self.generated, points._spec,
                                       np.repeat(points.max_tokens, count))

    def signals_at(self, index: np.ndarray, rows: np.ndarray | None = None,
                   names: Collection[str] = WINDOW_FIELDS) -> tuple[dict, np.ndarray]:
        """`signals` of the checkpoints at `index` (of rows `rows`, where known) only; those `names` only where asked."""
        rows = self.rows_at(index) if rows is None else rows
        return self.points.windows(rows, self.generated_at(index, rows), names)

    def every(self, stride: int) -> tuple[np.ndarray, np.ndarray]:
        """The index of every response's stride-th, 2 stride-th, ... checkpoint, and its row: any `stride` of a
        response's checkpoints in a row hold one of them."""
        count = np.diff(self.starts) // stride
        base = self.starts[:-1] + stride - 1 - stride * np.concatenate(([0], np.cumsum(count)[:-1]))
        return np.repeat(base, count) + stride * np.arange(int(count.sum())), np.repeat(np.arange(len(count)), count)

    def streaks(self, counted: np.ndarray, reset: np.ndarray) -> np.ndarray:
        """At each checkpoint, a counter of checks in a row: `run + 1` where counted, 0 where reset, else unchanged, from
        0 at each response's first checkpoint -- the counter a rule keeps one checkpoint at a time, in closed form
        (counted and reset never both)."""
        counted_so_far = np.cumsum(counted, dtype=np.int64)
        base = np.where(reset, counted_so_far, 0)  # the count at the last reset or response start, carried forward
        begins = self.starts[:-1][self.starts[:-1] < self.starts[1:]]
        base[begins] = np.maximum(base[begins], counted_so_far[begins] - counted[begins])
        np.maximum.accumulate(base, out=base)
        return counted_so_far - base

    def first_hits(self, hit: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each response's first checkpoint where `hit`: (its index into these arrays, the tokens generated there),
        -1 and -1 where none."""
        at = np.flatnonzero(hit)
        hit_rows = self.rows_at(at)
        first = np.ones(len(at), bool)
        first[1:] = hit_rows[1:] != hit_rows[:-1]
        index = np.full(len(self.starts) - 1, -1, np.int64)
        index[hit_rows[first]] = at[first]
        tokens = np.full(len(index), -1, np.int64)
        tokens[hit_rows[first]] = self.generated_at(at[first])
        return index, tokens
