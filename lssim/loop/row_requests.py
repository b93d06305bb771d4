"""A cut or carried rollout's requests as rows of its submission's columns, with a Request object only where one is
read (lssim.loop.cut_books): every row's object on demand (RowRequests), and a group's members so (GroupRows).
"""

from __future__ import annotations

import itertools
import operator
from typing import Sequence

import numpy as np

from lssim.loop.columns import RequestColumns
from lssim.loop.core import Request


class RowRequests(Sequence):
    """A submission's Request objects, one per row of its columns: those given (carried responses, or every one where
    a hook read them before the submission), the others made when first asked for (`make`), as they were when
    submitted (from `submitted`, a copy of the columns then: the engine fills the columns in place)."""

    def __init__(self, submitted: RequestColumns, given: Sequence[Request | None], filled: RequestColumns | None = None):
        if len(given) > len(submitted):
            raise ValueError(f"RowRequests: {len(given)} requests given for {len(submitted)} rows")
        self._submitted = submitted
        self.filled = submitted if filled is None else filled  # the columns the engine fills in place
        self._objects: list[Request | None] = list(given) + [None] * (len(submitted) - len(given))
        self._has = np.zeros(len(submitted), bool)  # which rows have an object
        self._has[:len(given)] = np.fromiter(map(_is_object, given), bool, len(given))
        self._carried = np.zeros(len(submitted), bool)  # rows carried out with no object made (`carry`)
        self._carried_rids: dict[int, int] = {}  # ... row -> rid
        # where each response carried as a row ran last, by rid (`forward`): one store for the run's submissions that
        # carried rows from one to the next, read for this one's carried rows
        self._latest: dict[int, tuple[RowRequests, int]] = {}

    def __len__(self) -> int:
        return len(self._objects)

    @property
    def submitted(self) -> RequestColumns:
        """The columns as submitted (read-only: the objects not made yet are made from them)."""
        return self._submitted

    def __getitem__(self, i):
        return self.make(np.array([i], np.int64))[0]

    def make(self, rows: np.ndarray, source: RequestColumns | None = None) -> list[Request]:
        """The objects of `rows`: those that exist, the others made from `source` (default: the columns as submitted),
        or, for a row resubmitted as a row of a later submission, there (from its filled columns)."""
        objects, wanted = self._objects, rows.tolist()
        missing = [i for i in wanted if objects[i] is None]
        carried, latest = self._carried_rids, self._latest
        if missing and carried and latest:
            for i in missing:
                holder, row = latest.get(carried.get(i), (self, i))
                if holder is not self:  # resubmitted since: made where it ran last
                    objects[i] = holder.make(np.array([row], np.int64), source=holder.filled)[0]
                    self._has[i] = True
            missing = [i for i in missing if objects[i] is None]
        if missing:
            missing = np.array(missing, np.int64)
            carried = self._carried[missing]  # (a carried row is read where it was filled, whatever `source`)
            for part, columns in ((missing[~carried], self._submitted if source is None else source),
                                  (missing[carried], self.filled)):
                for i, r in zip(part.tolist(), columns.to_requests(part) if len(part) else []):
                    objects[i] = r
            self._has[missing] = True
        return list(map(objects.__getitem__, wanted))

    def has(self, rows: np.ndarray) -> np.ndarray:
        """Of `rows`: which have an object (none made)."""
        return self._has[rows]

    def made(self) -> tuple[np.ndarray, list[Request]]:
        """The rows that have an object, in row order, and their objects."""
        rows = np.flatnonzero(self._has)
        return rows, list(map(self._objects.__getitem__, rows.tolist()))

    def made_of(self, rows: np.ndarray) -> list[Request]:
        """The objects that exist of `rows`, in that order (none made)."""
        return list(map(self._objects.__getitem__, rows[self._has[rows]].tolist()))

    def objects_of(self, rows: np.ndarray) -> list[Request | None]:
        """Each of `rows`' object, None where it has none (none made)."""
        return list(map(self._objects.__getitem__, rows.tolist()))

    def carry(self, rows: np.ndarray) -> None:
        """`rows` were carried out of the rollout: open, with no object made where none was (their filled columns hold
        what a carried object holds: lssim.sim.carry_route)."""
        self._carried[rows] = True
        self._carried_rids.update(zip(rows.tolist(), self.filled.rid[rows].tolist()))

    def forward(self, rows: np.ndarray, later: "RowRequests", later_rows: np.ndarray) -> None:
        """`rows`, carried out of this submission, were resubmitted as `later`'s `later_rows` (the next step's carried
        rows): where they ran last, for every submission that held them (its objects made there, its rewards read
        there)."""
        later._latest = latest = self._latest
        latest.update(zip(self.filled.rid[rows].tolist(), zip(itertools.repeat(later), later_rows.tolist())))

    def rewards_of(self, rows: np.ndarray, filled: RequestColumns) -> list[float]:
        """Each of `rows`' reward as it stands, `filled` the columns the engine filled: its object's, else its row's where
        it ran last (a carried row resubmitted since: `forward`) (a group's few rows: read in Python, where numpy's
        calls cost more than the rows)."""
        objects, at = self._objects, rows.tolist()
        out = [row if (r := objects[i]) is None else r.reward for i, row in zip(at, filled.reward[rows].tolist())]
        carried, latest = self._carried_rids, self._latest
        if carried and latest:
            for k, i in enumerate(at):
                if i in carried and objects[i] is None and (holder := latest.get(carried[i], (self,)))[0] is not self:
                    r = holder[0]._objects[holder[1]]
                    out[k] = float(holder[0].filled.reward[holder[1]]) if r is None else r.reward
        return out

    def release(self, rids: np.ndarray) -> None:
        """The responses `rids` are read as rows of a closed step from now on (their group is done): where they ran last
        is no longer kept."""
        if self._latest:
            pop = self._latest.pop
            for rid in rids.tolist():
                pop(rid, None)

    def left_open(self, rows: np.ndarray, filled: RequestColumns) -> RequestColumns:
        """`rows` (each with its object: open when the rollout left it, running at the cut or carried) as their objects
        hold them, as RequestColumns.of would read them, in one pass over the objects: the columns as submitted, what
        the engine filled of every row submitted (`filled`: instance, submit time, exactness) and what each object
        moved on to since (tokens, first token, finish and stop reasons: the engine's aborts, the carry, the books)."""
        out = self._submitted.take(rows)
        for name in ("ran_on", "submit_time", "exact"):
            getattr(out, name)[:] = getattr(filled, name)[rows]
        as_rows = self._carried[rows] & ~self._has[rows]  # carried with no object: their filled rows hold it all
        if as_rows.any():
            for name in ("generated", "first_token_time", "finish_reason", "stop_reason"):
                getattr(out, name)[as_rows] = getattr(filled, name)[rows[as_rows]]
        with_object = np.flatnonzero(~as_rows)
        if len(with_object):
            objects = self.make(rows[with_object])
            generated, first_token, reasons, stops = zip(*map(_moved_on, objects))
            out.generated[with_object], out.first_token_time[with_object] = generated, first_token
            out.finish_reason[with_object], out.stop_reason[with_object] = reasons, stops
        out.natural_len[:], out.natural_reward[:] = -1, np.nan  # (of's defaults for the step's own fields)
        out.context_at_start[:] = out.prompt_len
        return out

    def open(self, rows: np.ndarray) -> np.ndarray:
        """Of `rows`: which have an object that has not ended (a carried or still-running response)."""
        out = self._has[rows]
        at = np.flatnonzero(out)
        out[at] = [not r.finish_reason for r in map(self._objects.__getitem__, rows[at].tolist())]
        return out | (self._carried[rows] & ~self._has[rows])


_moved_on = operator.attrgetter("generated", "first_token_time", "finish_reason", "stop_reason")


def _is_object(r: Request | None) -> bool:
    return r is not None


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
        return self.requests.rewards_of(self.rows, self.columns)


class CarriedRows(Sequence):
    """Responses carried out of a carried rollout (lssim.sim.carry_route) as rows of its submission (`requests`, whose
    filled columns hold what a carried object holds: RowRequests.carry), `rows` in the order they left: how the books
    hold them across the step boundary (StepState.carried_out, Controller._carried, the next step's carried_in), with
    an object only where one is read. Read as a sequence, each object is made when first read (RowRequests.make); the
    next step resubmits them as rows (RowRequests.forward)."""

    __slots__ = ("requests", "rows")

    def __init__(self, requests: RowRequests, rows: np.ndarray):
        self.requests, self.rows = requests, rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return self.requests.make(self.rows[i], source=self.requests.filled)
        return self.requests.make(self.rows[[i]], source=self.requests.filled)[0]

    def __iter__(self):
        return iter(self.requests.make(self.rows, source=self.requests.filled))

    def rids(self) -> np.ndarray:
        return self.requests.filled.rid[self.rows]

    def objects(self) -> list[Request | None]:
        """Each one's object, None where none was made."""
        return self.requests.objects_of(self.rows)

    def set_last_version(self, version: int) -> None:
        """They last ran under weights `version`: their rows, and the objects made of them."""
        self.requests.filled.last_version[self.rows] = version
        for r in self.requests.made_of(self.rows):
            r.last_version = version
