"""Rows for prompt ids, so that what a policy remembers per prompt can live in arrays (lssim.loop.history,
lssim.loop.difficulty): a dict answers one id, sorted arrays answer many at once."""

from __future__ import annotations

import numpy as np


class PromptRows:
    """Each prompt id seen gets the next row, in the order first added."""

    def __init__(self):
        self.row: dict[int, int] = {}
        self._sorted_ids = np.zeros(0, np.int64)
        self._sorted_rows = np.zeros(0, np.int64)

    def __len__(self) -> int:
        return len(self.row)

    def find(self, prompt_ids: np.ndarray) -> np.ndarray:
        """Each id's row, -1 for an id never added."""
        ids = np.asarray(prompt_ids, np.int64)
        if not len(self._sorted_ids):
            return np.full(len(ids), -1, np.int64)
        at = np.minimum(np.searchsorted(self._sorted_ids, ids), len(self._sorted_ids) - 1)
        return np.where(self._sorted_ids[at] == ids, self._sorted_rows[at], -1)

    def add(self, prompt_ids: np.ndarray) -> np.ndarray:
        """Each id's row, a new one for each id never added (new rows number on from len(self))."""
        rows = self.find(prompt_ids)
        if (rows >= 0).all():
            return rows
        new = np.unique(np.asarray(prompt_ids, np.int64)[rows < 0])
        first = len(self.row)
        self.row.update(zip(new.tolist(), range(first, first + len(new))))
        ids = np.concatenate([self._sorted_ids, new])
        order = np.argsort(ids, kind="stable")
        self._sorted_ids = ids[order]
        self._sorted_rows = np.concatenate([self._sorted_rows, np.arange(first, first + len(new))])[order]
        return self.find(prompt_ids)


def grown(values: np.ndarray, rows: int) -> np.ndarray:
    """`values` (one entry, or row, per prompt) with zeros appended up to `rows` entries."""
    if len(values) >= rows:
        return values
    return np.concatenate([values, np.zeros((rows - len(values),) + values.shape[1:], values.dtype)])
