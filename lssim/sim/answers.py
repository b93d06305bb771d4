"""The Workload's answer for each request the simulator has been submitted, by rid (SimEngine._target).

The event route asks the Workload request by request and writes each answer into the dict. The cut and carry routes
(lssim.sim.cut_route, lssim.sim.carry_route) ask it for a whole submission over arrays; a Python tuple per request would
cost more than the rest of their books of it, and the engine reads few of them (the requests it still runs at a cut,
a counterfactual asked of an aborted one), so `remember` keeps those as arrays indexed by rid, and a row becomes the
dict's entry when first read.
"""

from __future__ import annotations

import numpy as np


class Answers(dict):
    """rid -> (length, finish reason, reward, trace row): a dict, with rows remembered as arrays (`remember`) read into
    it when first asked for (`in`, `[]`). A run's rids are small non-negative integers, numbered in order, so the
    arrays are indexed by rid."""

    __slots__ = ("_known", "_length", "_reason", "_reward", "_row", "_read")

    def __init__(self):
        super().__init__()
        self._known = np.zeros(0, bool)
        self._length, self._reason = np.zeros(0, np.int64), np.zeros(0, object)
        self._reward, self._row = np.zeros(0, float), np.zeros(0, np.int64)
        self._read = 0  # entries of the dict read from the arrays (every other one was written into it)

    def remember(self, rids: np.ndarray, length: np.ndarray, reason: np.ndarray, reward: np.ndarray,
                 row: np.ndarray) -> None:
        """The answers of `rids` (distinct, >= 0), as `self[rid] = (length, reason, reward, row)` of each would keep
        them; an answer in the dict already is replaced (as that assignment replaces it)."""
        if not len(rids):
            return
        if rids.min() < 0:
            raise ValueError(f"Answers.remember: rids must be >= 0, got {int(rids.min())}")
        self._grow(int(rids.max()) + 1)
        if len(self):  # replaced: an entry of the dict is dropped, read from the arrays again when asked
            was_known = self._known[rids]
            for rid, remembered in zip(rids.tolist(), was_known.tolist()):
                if super().pop(rid, None) is not None and remembered:
                    self._read -= 1  # (an entry written into the dict was not remembered: `in` would have found it)
        self._known[rids] = True
        self._length[rids], self._reason[rids], self._reward[rids], self._row[rids] = length, reason, reward, row

    def known(self, rids: np.ndarray) -> np.ndarray:
        """`rid in self` of each of `rids`, over arrays."""
        out = np.zeros(len(rids), bool)
        inside = (rids >= 0) & (rids < len(self._known))
        out[inside] = self._known[rids[inside]]
        if len(self) > self._read:  # entries written into the dict: asked there
            rest = np.flatnonzero(~out)
            out[rest] = list(map(super().__contains__, rids[rest].tolist()))
        return out

    def __contains__(self, rid) -> bool:
        return super().__contains__(rid) or (0 <= rid < len(self._known) and bool(self._known[rid]))

    def __missing__(self, rid):
        if not (0 <= rid < len(self._known) and self._known[rid]):
            raise KeyError(rid)
        answer = self[rid] = (int(self._length[rid]), self._reason[rid], float(self._reward[rid]), int(self._row[rid]))
        self._read += 1
        return answer

    def _grow(self, size: int) -> None:
        if size <= len(self._known):
            return
        size = max(size, 2 * len(self._known), 1024)
        for name in ("_known", "_length", "_reason", "_reward", "_row"):
            old = getattr(self, name)
            new = np.zeros(size, old.dtype)
            new[:len(old)] = old
            setattr(self, name, new)
