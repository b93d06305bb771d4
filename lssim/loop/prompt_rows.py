"""Rows for prompt ids, so that what a policy remembers per prompt can live in arrays (lssim.loop.history,
lssim.loop.difficulty): a dict answers one id, sorted arrays answer many at once."""

from __future__ import annotations

import numpy as np


class PromptRows:
    """Each prompt id seen gets the next row, in the order first added. Ids that are small non-negative numbers (a
    trace's, a dataset's) are looked up in a table indexed by id; others by a binary search over the sorted ids."""

    def __init__(self):
        self.row: dict[int, int] = {}
        self._table: np.ndarray | None = None  # id -> row (-1: none), where the ids are dense enough (_table)
        self._sorted_ids = np.zeros(0, np.int64)
        self._sorted_rows = np.zeros(0, np.int64)

    def __len__(self) -> int:
        return len(self.row)

    def find(self, prompt_ids: np.ndarray) -> np.ndarray:
        """Each id's row, -1 for an id never added."""
        ids = np.asarray(prompt_ids, np.int64)
        table = self._table
        if not len(self.row):
            return np.full(len(ids), -1, np.int64)
        if table is not None:
            inside = (ids >= 0) & (ids < len(table))
            return table[ids] if inside.all() else np.where(inside, table[np.where(inside, ids, 0)], -1)
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
        self._table = _table(self._sorted_ids, self._sorted_rows)
        return self.find(prompt_ids)


def _table(sorted_ids: np.ndarray, rows: np.ndarray) -> np.ndarray | None:
    """id -> row over 0..max id, where the ids are non-negative and dense enough for it to stay small."""
    if sorted_ids[0] < 0 or sorted_ids[-1] >= 8 * len(sorted_ids) + 65536:
        return None
    table = np.full(int(sorted_ids[-1]) + 1, -1, np.int64)
    table[sorted_ids] = rows
    return table


def grown(values: np.ndarray, rows: int) -> np.ndarray:
    """`values` (one entry, or row, per prompt) with zeros appended up to `rows` entries."""
    if len(values) >= rows:
        return values
    return np.concatenate([values, np.zeros((rows - len(values),) + values.shape[1:], values.dtype)])
