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

    def __init__(self, submitted: RequestColumns, given: Sequence[Request | None], filled: RequestColumns | None = None):
        if len(given) > len(submitted):
            raise ValueError(f"RowRequests: {len(given)} requests given for {len(submitted)} rows")
        self._submitted = submitted
        self.filled = submitted if filled is None else filled  # the columns the engine fills in place
        self._objects: list[Request | None] = list(given) + [None] * (len(submitted) - len(given))
        self._has = np.zeros(len(submitted), bool)  # which rows have an object
        if given.count(None) < len(given):  # (carried as rows: none given, none looked at one by one)
            self._has[:len(given)] = np.fromiter(map(_is_object, given), bool, len(given))
        # rows whose filled columns hold what their object would (`carry`, `hold`): made from there, read there
        self._carried = np.zeros(len(submitted), bool)
        # carried rows resubmitted as rows of the next submission (`forward`): their objects are made there
        self._later: RowRequests | None = None
        self._forward: np.ndarray | None = None  # row -> its row there (-1: not resubmitted)
        # ... and the earlier submissions whose rows were resubmitted as this one's: (submission, its rows, these rows)
        self._earlier: list[tuple[RowRequests, np.ndarray, np.ndarray]] = []

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
        if missing and self._forward is not None:  # resubmitted since: made where it ran on (there, or later still)
            later = self._forward[missing]
            moved = np.flatnonzero(later >= 0)
            if len(moved):
                at = np.array(missing, np.int64)[moved]
                for i, r in zip(at.tolist(), self._later.make(later[moved], source=self._later.filled)):
                    objects[i] = r
                self._has[at] = True
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
        if not self._has[rows].any():
            return [None] * len(rows)
        return list(map(self._objects.__getitem__, rows.tolist()))

    def carry(self, rows: np.ndarray) -> None:
        """`rows` were carried out of the rollout: open, with no object made where none was (their filled columns hold
        what a carried object holds: lssim.sim.carry_route)."""
        self._carried[rows] = True

    def hold(self, rows: np.ndarray) -> None:
        """`rows` are in flight at a cut, their filled columns set back to what their objects hold there
        (lssim.sim.cut_route): an object not made yet is made from them, and until then they are read there."""
        self._carried[rows] = True

    def forward(self, rows: np.ndarray, later: "RowRequests", later_rows: np.ndarray) -> None:
        """`rows`, carried out of this submission, were resubmitted as `later`'s `later_rows` (the next step's carried
        rows): their objects are made there from now on, and their rewards written back here once it is filled
        (`write_back`), as to every earlier submission they ran in."""
        if self._later is not None and self._later is not later:
            raise RuntimeError("RowRequests.forward: rows already resubmitted in another submission")
        if self._forward is None:
            self._forward = np.full(len(self._objects), -1, np.int64)
        self._later, self._forward[rows] = later, later_rows
        later._earlier = [(self, rows, later_rows)]
        for earlier, their_rows, our_rows in self._earlier:  # (those resubmitted again, through this one)
            there = self._forward[our_rows]
            again = there >= 0
            if again.any():
                later._earlier.append((earlier, their_rows[again], there[again]))
        self._earlier = []  # written back already; `later` holds what is still to write (no chain of every step kept)

    def write_back(self) -> None:
        """This submission is filled: the rewards of its rows resubmitted from earlier ones (`forward`) written to their
        rows there, so a GroupRows of an earlier step reads its own rows."""
        reward = self.filled.reward
        for earlier, their_rows, our_rows in self._earlier:
            earlier.filled.reward[their_rows] = reward[our_rows]

    def rewards_of(self, rows: np.ndarray, filled: RequestColumns) -> list[float]:
        """Each of `rows`' reward as it stands, `filled` the columns the engine filled: its object's, else its row's (a
        carried row's written back from where it ran on since: `write_back`) (a group's few rows: read in Python, where
        numpy's calls cost more than the rows)."""
        objects = self._objects
        return [row if (r := objects[i]) is None else r.reward for i, row in zip(rows.tolist(), filled.reward[rows].tolist())]

    def reward_array(self, rows: np.ndarray, filled: RequestColumns) -> np.ndarray:
        """`rewards_of` as an array (many groups' rows at once)."""
        out = filled.reward[rows]
        made = np.flatnonzero(self._has[rows])
        if len(made):
            out[made] = [r.reward for r in map(self._objects.__getitem__, rows[made].tolist())]
        return out

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


class LeftOpenRows:
    """`requests.left_open(rows, filled)`, read when a column or method of it is first asked for (each one of
    RequestColumns'): a policy's on_unfinished_rows may read none (unbounded april carries every row, reading how
    many). Read while the policy is asked, as the rollout left the rows."""

    __slots__ = ("_requests", "_rows", "_filled", "_columns")

    def __init__(self, requests: RowRequests, rows: np.ndarray, filled: RequestColumns):
        self._requests, self._rows, self._filled, self._columns = requests, rows, filled, None

    def __len__(self) -> int:
        return len(self._rows)

    def __getattr__(self, name: str):
        if self._columns is None:
            self._columns = self._requests.left_open(self._rows, self._filled)
        return getattr(self._columns, name)


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
