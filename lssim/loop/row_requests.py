"""A cut or carried rollout's requests as rows of its submission's columns, with a Request object only where one is
read (lssim.loop.cut_books): every row's object on demand (RowRequests), and a group's members so (GroupRows).
"""

from __future__ import annotations

import operator
from typing import Sequence

import numpy as np

from lssim.loop.columns import RequestColumns
from lssim.loop.core import Request


class RowRequests(Sequence):
    """A submission's Request objects, one per row of its columns: those given (carried responses, or every one where
    a hook read them before the submission), the others made when first asked for (`make`), as they were when
    submitted (from `submitted`, a copy of the columns then: the engine fills the columns in place)."""

    def __init__(self, submitted: RequestColumns, given: Sequence[Request]):
        if len(given) > len(submitted):
            raise ValueError(f"RowRequests: {len(given)} requests given for {len(submitted)} rows")
        self._submitted = submitted
        self._objects: list[Request | None] = list(given) + [None] * (len(submitted) - len(given))
        self._has = np.zeros(len(submitted), bool)  # which rows have an object
        self._has[:len(given)] = True

    def __len__(self) -> int:
        return len(self._objects)

    @property
    def submitted(self) -> RequestColumns:
        """The columns as submitted (read-only: the objects not made yet are made from them)."""
        return self._submitted

    def __getitem__(self, i):
        return self.make(np.array([i], np.int64))[0]

    def make(self, rows: np.ndarray, source: RequestColumns | None = None) -> list[Request]:
        """The objects of `rows`: those that exist, the others made from `source` (default: the columns as submitted)."""
        objects, wanted = self._objects, rows.tolist()
        missing = [i for i in wanted if objects[i] is None]
        if missing:
            made = (self._submitted if source is None else source).to_requests(np.array(missing, np.int64))
            for i, r in zip(missing, made):
                objects[i] = r
            self._has[missing] = True
        return list(map(objects.__getitem__, wanted))

    def made(self) -> tuple[np.ndarray, list[Request]]:
        """The rows that have an object, in row order, and their objects."""
        rows = np.flatnonzero(self._has)
        return rows, list(map(self._objects.__getitem__, rows.tolist()))

    def left_open(self, rows: np.ndarray, filled: RequestColumns) -> RequestColumns:
        """`rows` (each with its object: open when the rollout left it, running at the cut or carried) as their objects
        hold them, as RequestColumns.of would read them, in one pass over the objects: the columns as submitted, what
        the engine filled of every row submitted (`filled`: instance, submit time, exactness) and what each object
        moved on to since (tokens, first token, finish and stop reasons: the engine's aborts, the carry, the books)."""
        objects = self.make(rows)
        out = self._submitted.take(rows)
        for name in ("ran_on", "submit_time", "exact"):
            getattr(out, name)[:] = getattr(filled, name)[rows]
        if len(rows):
            out.generated[:], out.first_token_time[:], reasons, stops = zip(*map(_moved_on, objects))
            out.finish_reason[:], out.stop_reason[:] = reasons, stops
        out.natural_len[:], out.natural_reward[:] = -1, np.nan  # (of's defaults for the step's own fields)
        out.context_at_start[:] = out.prompt_len
        return out

    def open(self, rows: np.ndarray) -> np.ndarray:
        """Of `rows`: which have an object that has not ended (a carried or still-running response)."""
        out = self._has[rows]
        at = np.flatnonzero(out)
        out[at] = [not r.finish_reason for r in map(self._objects.__getitem__, rows[at].tolist())]
        return out


_moved_on = operator.attrgetter("generated", "first_token_time", "finish_reason", "stop_reason")


class GroupRows(Sequence):
    """A group's members, in member order, as rows of a cut or carried rollout's submission (`columns`, filled by the
    engine) with the objects that rollout made (`requests`: those of the members still open when it ended, running or
    carried, which later steps fill as they run on): how the books hold a group with an open member
    (StepState.members, Controller._waiting_groups), with no object per member that ended. Read as a sequence, each
    member's object is made when first read (RowRequests.make, from the filled columns)."""

    __slots__ = ("requests", "columns", "rows")

    def __init__(self, requests: RowRequests, columns: RequestColumns, rows: np.ndarray):
        if len(columns) != len(requests):
            raise ValueError(f"GroupRows: {len(requests)} requests but {len(columns)} rows of columns")
        self.requests, self.columns, self.rows = requests, columns, rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return self.requests.make(self.rows[i], source=self.columns)
        return self.requests.make(self.rows[[i]], source=self.columns)[0]

    def __iter__(self):
        return iter(self.requests.make(self.rows, source=self.columns))

    def rids(self) -> np.ndarray:
        return self.columns.rid[self.rows]

    def rewards(self) -> list[float]:
        """Each member's reward: its object's where it has one (an open member's, filled as it ran on), else its row's.
        (A group is a few rows: read in Python, where numpy's calls cost more than the rows.)"""
        objects = self.requests._objects
        rows = self.rows.tolist()
        return [row if (r := objects[i]) is None else r.reward for i, row in zip(rows, self.columns.reward[self.rows].tolist())]
