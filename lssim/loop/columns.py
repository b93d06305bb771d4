"""Requests as columns: one array per field instead of one `Request` object per response.

The controller plans every step's requests as columns (lssim.loop.plan_columns.plan_requests). A step on the event
route turns them into `Request` objects, because engines report events about single requests and per-event hooks read
them; a step on the batch route (lssim.sim.fastsim) never does: the engine fills the columns in place and the books
(lssim.loop.records), the groups that train (`lssim.loop.core.Group`) and the trainer read them as arrays. At the step's end
both routes hand the records the same columns (`RequestColumns.of` gathers the event route's objects), so what
is recorded is computed once, in one place.
"""

from __future__ import annotations

import itertools
import operator
from dataclasses import dataclass, fields
from typing import NamedTuple, Sequence

import numpy as np

from lssim.loop.core import (REQUEST_DTYPES, REQUEST_FLOATS, REQUEST_INTS, Group, Request, field_of,
                             instance_column, object_array)

class VersionSpans(NamedTuple):
    """Every span of tokens with tokens of the rows that resumed under other weights: its row, the weights version it
    ran under and its tokens, row after row, oldest first; and those rows (RequestColumns.version_spans)."""

    rows: np.ndarray
    versions: np.ndarray
    tokens: np.ndarray
    resumed: np.ndarray


@dataclass(slots=True, eq=False)
class RequestColumns:
    """Requests, one row each. `instance` is -1 where the engine's dispatcher chooses (Request.instance None);
    `resumes` is None when no row ever resumed under other weights (else Request.resumes, row by row, as an object
    array: numpy's takes and concatenations read it, not a Python loop over its rows; rows taken keep it, even where
    none of them resumed);
    `natural_len` / `natural_reward` (what the engine says the response would have been unstopped: -1 / NaN where
    it cannot tell) and `context_at_start` (prompt + tokens generated before the step) are the step's, filled when
    a step's books are closed."""

    rid: np.ndarray
    group_id: np.ndarray
    step: np.ndarray
    prompt_id: np.ndarray
    sample_idx: np.ndarray
    prompt_len: np.ndarray
    max_tokens: np.ndarray
    priority: np.ndarray
    instance: np.ndarray
    seed: np.ndarray
    batch: np.ndarray
    batch_sample: np.ndarray
    generated: np.ndarray
    first_version: np.ndarray
    last_version: np.ndarray
    tokens_before_resume: np.ndarray
    ran_on: np.ndarray  # the instance its latest submission ran on (Request.ran_on; -1 until submitted)
    reward: np.ndarray
    submit_time: np.ndarray
    first_token_time: np.ndarray
    finish_time: np.ndarray
    exact: np.ndarray  # bool
    finish_reason: np.ndarray  # object (str)
    stop_reason: np.ndarray  # object (str)
    natural_len: np.ndarray
    natural_reward: np.ndarray
    context_at_start: np.ndarray
    resumes: np.ndarray | None = None  # object: Request.resumes of each row (a list, or None)

    def __len__(self) -> int:
        return len(self.rid)

    @staticmethod
    def planned(**created) -> "RequestColumns":
        """New requests: the given creation fields (rid, group_id, ...), the rest as a fresh Request has them."""
        n = len(created["rid"])
        cols = {name: np.asarray(created[name], np.int64) for name in created}
        # the rest start at their defaults, each a row of one block (an allocation per default, not per column)
        unset = [c for c in REQUEST_INTS if c not in cols and c in _UNSET_INTS]
        zero = [c for c in REQUEST_INTS if c not in cols and c not in _UNSET_INTS]
        nan = [c for c in REQUEST_FLOATS if c not in cols]
        cols.update(zip(unset, np.full((len(unset), n), -1, np.int64)))
        cols.update(zip(zero, np.zeros((len(zero), n), np.int64)))
        cols.update(zip(nan, np.full((len(nan), n), np.nan)))
        empty = np.empty(n, object)
        empty[:] = ""
        return RequestColumns(**cols, exact=np.ones(n, bool), finish_reason=empty, stop_reason=empty.copy(),
                              natural_len=np.full(n, -1, np.int64), natural_reward=np.full(n, np.nan),
                              context_at_start=cols["prompt_len"].copy())

    @staticmethod
    def of(requests: Sequence[Request], context_at_start: dict[int, int] | None = None, counterfactual=None) -> "RequestColumns":
        """Request objects gathered into columns; `context_at_start` (rid -> tokens) defaults to the prompt,
        `counterfactual(request)` (lssim.loop.contracts.Engine.counterfactual) fills natural_len / natural_reward."""
        n = len(requests)
        # One pass per kind of field: an object's ints, then its floats, then the rest, each read by one attrgetter
        # into one flat array (a pass per field costs a numpy call and a generator step per object and field).
        ints = np.fromiter(_chain(map(_read_ints, requests)), np.int64, n * len(_INT_FIELDS)).reshape(n, len(_INT_FIELDS)).T.copy()
        floats = np.fromiter(_chain(map(_read_floats, requests)), float, n * len(REQUEST_FLOATS)).reshape(n, len(REQUEST_FLOATS)).T.copy()
        instance, exact, finish_reason, stop_reason, resumes = zip(*map(_read_rest, requests)) if n else ((),) * 5
        cols = dict(zip(_INT_FIELDS, ints))
        cols.update(zip(REQUEST_FLOATS, floats))
        natural = natural_outcomes(requests, counterfactual)
        return RequestColumns(
            **cols, instance=instance_column(instance), exact=np.fromiter(exact, bool, n),
            finish_reason=object_array(list(finish_reason)), stop_reason=object_array(list(stop_reason)),
            natural_len=natural[0], natural_reward=natural[1],
            context_at_start=cols["prompt_len"].copy() if context_at_start is None else
            np.fromiter(map(context_at_start.__getitem__, cols["rid"].tolist()), np.int64, n),
            resumes=_resumes(resumes))

    @staticmethod
    def concat(parts: Sequence["RequestColumns"]) -> "RequestColumns":
        if len(parts) == 1:
            return parts[0]
        if not parts:
            return RequestColumns.planned(rid=np.zeros(0, np.int64), prompt_len=np.zeros(0, np.int64))
        out = {name: np.concatenate([getattr(p, name) for p in parts]) for name in _ARRAYS}
        resumes = None
        if any(p.resumes is not None for p in parts):
            resumes = np.concatenate([p.resumes if p.resumes is not None else np.full(len(p), None) for p in parts])
        return RequestColumns(**out, resumes=resumes)

    @staticmethod
    def concat_taken(parts: Sequence[tuple["RequestColumns", np.ndarray | None]]) -> "RequestColumns":
        """RequestColumns.concat of each part's rows (positions; None: all of them), each column written once into
        its place (a take and then a concatenation copy every row twice, about twice the time)."""
        if len(parts) == 1:
            columns, rows = parts[0]
            return columns if rows is None else columns.take(rows)
        sizes = [len(columns) if rows is None else len(rows) for columns, rows in parts]
        bounds = np.cumsum([0, *sizes]).tolist()
        places = list(zip([rows for _, rows in parts], bounds, bounds[1:]))
        out = {}
        for name in _ARRAYS:
            sources = [getattr(columns, name) for columns, _ in parts]
            column = out[name] = np.empty(bounds[-1], np.result_type(*sources))  # as np.concatenate promotes
            for source, (rows, start, stop) in zip(sources, places):
                if rows is None:
                    column[start:stop] = source
                elif source.dtype == column.dtype:  # taken straight into place ("wrap": as "raise" takes valid rows,
                    source.take(rows, out=column[start:stop], mode="wrap")  # where "raise" copies through a buffer)
                else:
                    column[start:stop] = source.take(rows)
        resumes = None
        if any(columns.resumes is not None for columns, _ in parts):
            resumes = np.concatenate([np.full(n, None) if columns.resumes is None else
                                      columns.resumes if rows is None else columns.resumes.take(rows)
                                      for (columns, rows), n in zip(parts, sizes)])
        return RequestColumns(**out, resumes=resumes)

    def copy(self) -> "RequestColumns":
        """Every row, in columns of their own (take of every row, by the quicker copy)."""
        return RequestColumns(**{name: getattr(self, name).copy() for name in _ARRAYS},
                              resumes=None if self.resumes is None else self.resumes.copy())

    def take(self, rows) -> "RequestColumns":
        """The given rows (indices, a slice or a boolean mask), in that order."""
        if isinstance(rows, np.ndarray) and rows.dtype.kind in "iu":  # positions: ndarray.take is the quicker read
            out = {name: getattr(self, name).take(rows) for name in _ARRAYS}
        else:
            out = {name: getattr(self, name)[rows] for name in _ARRAYS}
        resumes = None
        if self.resumes is not None:
            # (kept even where none of the rows taken resumed: whoever reads it asks which did)
            resumes = self.resumes.take(rows) if isinstance(rows, np.ndarray) and rows.dtype.kind in "iu" else self.resumes[rows]
        return RequestColumns(**out, resumes=resumes)

    def to_requests(self, rows=None) -> list[Request]:
        """Request objects for the given rows (all by default): for the event route and for hooks that read one."""
        picked = np.arange(len(self)) if rows is None else np.arange(len(self))[rows]
        cols = {name: (getattr(self, name) if rows is None else getattr(self, name)[picked]).tolist()
                for name in _MADE_FIELDS if name != "resumes"}
        instance = cols["instance"]
        if instance and min(instance) < 0:
            cols["instance"] = [None if i < 0 else i for i in instance]
        cols["resumes"] = itertools.repeat(None) if self.resumes is None else self.resumes[picked].tolist()
        return list(map(Request, *(cols[name] for name in _MADE_FIELDS)))  # positional: no dict per object

    def off_policy_tokens(self, train_step: int, spans: VersionSpans | None = None) -> np.ndarray:
        """lssim.loop.core.off_policy_tokens of every row: tokens generated under weights older than `train_step`'s
        (`spans`: these rows' version_spans(), where already read)."""
        gen, first = self.generated, self.first_version
        out = np.where(first >= train_step, 0, gen)
        hand = first < 0  # no version history (a hand-made request): what the last resume says
        if hand.any():
            out[hand] = np.where(self.last_version[hand] >= train_step, self.tokens_before_resume[hand], gen[hand])
        rows, versions, tokens, resumed = self.version_spans() if spans is None else spans
        if len(resumed):
            resumed = resumed[first[resumed] >= 0]
            out[resumed] = 0
            older = (versions < train_step) & (first[rows] >= 0)
            np.add.at(out, rows[older], tokens[older])
        return out

    def token_lags(self, train_step: int, spans: VersionSpans | None = None) -> dict[int, int]:
        """Tokens by staleness (versions behind `train_step`) over every row (lssim.loop.core.token_lags, summed;
        `spans`: these rows' version_spans(), where already read)."""
        lag = train_step - self.first_version
        plain = self.generated > 0
        _, versions, tokens, resumed = self.version_spans() if spans is None else spans
        plain[resumed] = False
        keys = np.concatenate([lag[plain], train_step - versions])
        return {int(k): int(v) for k, v in zip(*_sum_by(keys, np.concatenate([self.generated[plain], tokens])))}

    def version_spans(self) -> VersionSpans:
        """lssim.loop.core.version_spans of the rows that resumed under other weights, as arrays (read once for
        off_policy_tokens and token_lags of the same rows)."""
        # (nonzero reads an object's truth, as astype(bool) does, without the array in between: a list is true)
        resumed = np.zeros(0, np.int64) if self.resumes is None else np.flatnonzero(self.resumes)
        if not len(resumed):
            return VersionSpans(resumed, resumed, resumed, resumed)
        resumes = self.resumes[resumed].tolist()
        spans = np.fromiter(map(len, resumes), np.int64, len(resumes)) + 1  # the first version's, then one per resume
        first = np.zeros(int(spans.sum()), bool)
        first[np.cumsum(spans) - spans] = True
        version, start = np.empty(len(first), np.int64), np.zeros(len(first), np.int64)
        version[first] = self.first_version[resumed]
        pairs = _chain(_chain(resumes))  # each resume's (version, tokens before it), flat
        version[~first], start[~first] = np.fromiter(pairs, np.int64, 2 * (len(first) - len(resumes))).reshape(-1, 2).T
        end = np.empty_like(start)
        end[:-1] = start[1:]
        end[np.cumsum(spans) - 1] = self.generated[resumed]  # a row's last span ends at its tokens so far
        rows, tokens = np.repeat(resumed, spans), end - start
        kept = tokens > 0
        return VersionSpans(rows[kept], version[kept], tokens[kept], resumed)


def _resumes(rows: Sequence) -> np.ndarray | None:
    """RequestColumns.resumes of rows whose Request.resumes are `rows` (lists or None): None where no row ever resumed.
    (np.fromiter: an array of lists, never read as a deeper array.)"""
    return None if rows.count(None) == len(rows) else np.fromiter(rows, object, len(rows))


def natural_outcomes(requests: Sequence[Request], counterfactual=None) -> tuple[np.ndarray, np.ndarray]:
    """natural_len / natural_reward of each request: `counterfactual(request)` (lssim.loop.contracts.Engine.counterfactual),
    -1 / NaN where it answers None or there is none."""
    n = len(requests)
    answers = [None] * n if counterfactual is None else list(map(counterfactual, requests))
    if answers.count(None) == n:
        return np.full(n, -1, np.int64), np.full(n, np.nan)
    return (np.fromiter((-1 if c is None else c[0] for c in answers), np.int64, n),
            np.fromiter((np.nan if c is None else c[1] for c in answers), float, n))


# Request's fields up to the last one the columns hold, in its order (to_requests passes them by position)
_MADE_FIELDS = tuple(f.name for f in fields(Request))[:[f.name for f in fields(Request)].index("exact") + 1]
_ARRAYS = tuple(f.name for f in fields(RequestColumns) if f.name != "resumes")  # every column but `resumes` (None where none resumed)
_ARRAY_NAMES = frozenset(_ARRAYS)
_INT_FIELDS = tuple(name for name in REQUEST_INTS if name != "instance")  # instance: None read as -1, apart
_read_ints = operator.attrgetter(*_INT_FIELDS)
_read_floats = operator.attrgetter(*REQUEST_FLOATS)
_read_rest = operator.attrgetter("instance", "exact", "finish_reason", "stop_reason", "resumes")
_chain = itertools.chain.from_iterable


class TakenRows:
    """`columns.take(rows)` read column by column as a hook asks: a step's placement pass reads two or three of the
    26 columns, and a copy of all of them costs more than the pass (a step's trained members: the eight its row
    reads). Read-only, like every submission a hook sees, and read while `columns` stay as they are; the version
    methods below read only the columns they need, any other method of RequestColumns (to_requests, take, ...) takes
    every column first."""

    __slots__ = ("_columns", "_rows", "_read", "_whole")

    def __init__(self, columns: RequestColumns, rows: np.ndarray):
        self._columns, self._rows, self._read, self._whole = columns, rows, {}, None

    def __len__(self) -> int:
        return len(self._rows)

    # (RequestColumns' own functions: they read the columns by name, which __getattr__ takes one at a time)
    version_spans = RequestColumns.version_spans
    off_policy_tokens = RequestColumns.off_policy_tokens
    token_lags = RequestColumns.token_lags

    def __getattr__(self, name: str):
        if name in _ARRAY_NAMES:
            value = self._read.get(name)
            if value is None:
                value = self._read[name] = getattr(self._columns, name).take(self._rows)
            return value
        if name == "resumes":
            if "resumes" not in self._read:
                resumes = self._columns.resumes
                self._read["resumes"] = None if resumes is None else resumes.take(self._rows)
            return self._read["resumes"]
        if self._whole is None:
            self._whole = self._columns.take(self._rows)
        return getattr(self._whole, name)


def _sum_by(keys: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    if not len(keys):
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    if keys.min() == keys.max():  # one key (a synchronous step: every token is of one version): nothing to sort
        return keys[:1], np.array([weights.sum()], np.int64)
    uniq, inverse = np.unique(keys, return_inverse=True)
    return uniq, np.bincount(inverse, weights=weights).astype(np.int64)


class GroupBatch(Sequence):
    """Groups that are rows of one step's columns (a batch-route step's; a selection over a step's closed columns), as
    a read-only list of `Group`s: a Group is made only for a group someone looks at; `gather` reads them without any."""

    def __init__(self, columns: RequestColumns, rows: np.ndarray, sizes: np.ndarray, held: list | None = None):
        self.columns, self.rows, self.sizes = columns, rows, sizes  # rows: group after group; sizes: per group
        self.held = held  # per group, the Request objects it holds too (Group.held), or None; None: rows only
        self.starts = np.cumsum(sizes) - sizes
        self._groups: list[Group] | None = None

    def __len__(self) -> int:
        return len(self.sizes)

    def __getitem__(self, i):
        if self._groups is None:
            cols, rows = self.columns, self.rows
            first = rows[self.starts]
            held = itertools.repeat(None) if self.held is None else self.held
            self._groups = [Group(p, st, h, columns=cols, rows=rows[a:a + n]) for p, st, a, n, h in
                            zip(cols.prompt_id[first].tolist(), cols.step[first].tolist(), self.starts.tolist(),
                                self.sizes.tolist(), held)]
        return self._groups[i]

    @property
    def prompt_ids(self) -> np.ndarray:
        return self.columns.prompt_id[self.rows[self.starts]]


def prompt_ids(groups) -> np.ndarray:
    """Each group's prompt, in order."""
    if isinstance(groups, GroupBatch):
        return groups.prompt_ids
    return np.fromiter(map(operator.attrgetter("prompt_id"), groups), np.int64, len(groups))


def rows_of_one(groups) -> tuple[RequestColumns, np.ndarray, np.ndarray] | None:
    """(columns, rows, sizes): the members of `groups`, group after group, where every group is rows (not a slice) of
    one RequestColumns (a batch-route step's GroupBatch, a step's closed columns); None where they are not."""
    if isinstance(groups, GroupBatch):
        return groups.columns, groups.rows, groups.sizes
    columns = list(map(operator.attrgetter("columns"), groups))  # (a pass in C: a step has hundreds of groups)
    if not columns or columns[0] is None or columns.count(columns[0]) != len(columns):  # (columns compare by identity)
        return None
    rows = list(map(operator.attrgetter("rows"), groups))
    if slice in set(map(type, rows)):
        return None
    return columns[0], np.concatenate(rows), np.fromiter(map(len, rows), np.int64, len(rows))


def gather(groups, name: str | None = None, lazy: bool = False):
    """The members of `groups`, in group order, as columns (`name` None: every field, a RequestColumns) or one field
    (an array), and each group's size. Consecutive groups that are rows of one RequestColumns are read in one take
    (the batch route's step: one per field, however many groups); groups of Request objects are gathered. `lazy`:
    where they are rows of one step's columns, a TakenRows of them (each column taken when read)."""
    one = rows_of_one(groups)
    if one is not None:  # the common case: every group is rows of one step's columns
        first, rows, sizes = one
        whole = len(rows) == len(first) and bool((rows == np.arange(len(rows))).all())  # every row, in order
        if name:
            return (getattr(first, name) if whole else getattr(first, name)[rows]), sizes
        return (first if whole else TakenRows(first, rows) if lazy else first.take(rows)), sizes
    parts, sizes = [], np.zeros(len(groups), np.int64)
    run_cols, run_rows, objects = None, [], []

    def flush():
        nonlocal run_cols, run_rows, objects
        if run_cols is not None:
            rows = np.concatenate(run_rows) if len(run_rows) > 1 else run_rows[0]
            parts.append(getattr(run_cols, name)[rows] if name else run_cols.take(rows))
        if objects:
            parts.append(field_of(objects, name) if name else RequestColumns.of(objects))
        run_cols, run_rows, objects = None, [], []

    for i, g in enumerate(groups):
        if g.columns is not None:
            if objects or (run_cols is not None and g.columns is not run_cols):
                flush()
            run_cols = g.columns
            rows = g.rows if not isinstance(g.rows, slice) else np.arange(len(g.columns))[g.rows]
            run_rows.append(rows)
            sizes[i] = len(rows)
        else:
            if run_cols is not None:
                flush()
            objects.extend(g.requests)
            sizes[i] = len(g.requests)
    flush()
    if name:
        return (np.concatenate(parts) if len(parts) > 1 else parts[0] if parts else np.zeros(0, REQUEST_DTYPES.get(name, float))), sizes
    return RequestColumns.concat(parts), sizes


def with_signal(rewards: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """Per group (members consecutive, `sizes` each): do its rewards differ (lssim.loop.core.Group.has_signal)?"""
    out = np.zeros(len(sizes), bool)
    some = sizes > 0
    if some.any():
        starts = (np.cumsum(sizes) - sizes)[some]
        spread = np.maximum.reduceat(rewards, starts) - np.minimum.reduceat(rewards, starts)
        out[some] = (sizes[some] > 1) & (spread > 0)  # NaN-safe: a NaN comparison is False
    return out


_UNSET_INTS = ("instance", "batch", "batch_sample", "first_version", "last_version", "ran_on")  # -1 until set


def rows_by_rid(rids: np.ndarray, rows: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """The row paired with each of `wanted` (rows[i] is distinct rids[i]'s), -1 where it is not among `rids`: a table or
    one sort and one search over arrays, where a dict costs a Python lookup per request."""
    if not len(rids) or not len(wanted):
        return np.full(len(wanted), -1, np.int64)
    lo, hi = min(int(rids.min()), int(wanted.min())), max(int(rids.max()), int(wanted.max()))
    if hi - lo < 4 * (len(rids) + len(wanted)):  # a step's rids are about one range: a table over it, no sort
        table = np.full(hi - lo + 1, -1, np.int64)
        table[rids - lo] = rows
        return table[wanted - lo]
    order = np.argsort(rids, kind="stable")
    keys = rids[order]
    at = np.minimum(np.searchsorted(keys, wanted), len(keys) - 1)
    return np.where(keys[at] == wanted, rows[order][at], -1)


def rids_of(requests: Sequence[Request]) -> np.ndarray:
    """Request.rid of each request."""
    return np.fromiter(map(_read_rid, requests), np.int64, len(requests))


_read_rid = operator.attrgetter("rid")


def runs(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Where each run of equal consecutive values starts, and its length (np.r_'s concatenation costs more than the
    comparison on a step's rows)."""
    n = len(values)
    new = np.empty(n, bool)
    if n:
        new[0] = True
        np.not_equal(values[1:], values[:-1], out=new[1:])
    starts = np.flatnonzero(new)
    sizes = np.empty(len(starts), np.int64)
    if len(starts):
        np.subtract(starts[1:], starts[:-1], out=sizes[:-1])
        sizes[-1] = n - starts[-1]
    return starts, sizes


def stable_argsort(values: np.ndarray) -> np.ndarray:
    """np.argsort(values, kind="stable") for integers; where they span fewer than 2**16 values (priorities that are
    lengths, instance numbers), through numpy's radix sort of 16-bit keys, several times quicker than its merge sort."""
    if len(values) > 1:
        lo, hi = int(values.min()), int(values.max())
        if hi - lo < 1 << 16:
            return np.argsort((values - lo).astype(np.uint16), kind="stable")
    return np.argsort(values, kind="stable")


def stable_smallest(values: np.ndarray, k: int) -> np.ndarray:
    """np.argsort(values, kind="stable")[:k] for numbers without NaN, sorting only those k (a partition finds them;
    ties at the k-th value go in index order, as the stable sort takes them)."""
    if k >= len(values):
        return np.argsort(values, kind="stable")
    if k <= 0:
        return np.zeros(0, np.int64)
    kth = np.partition(values, k - 1)[k - 1]
    below = np.flatnonzero(values < kth)
    chosen = np.sort(np.concatenate([below, np.flatnonzero(values == kth)[:k - len(below)]]))
    return chosen[np.argsort(values[chosen], kind="stable")]


def rid_order(rid: np.ndarray) -> np.ndarray:
    """np.argsort(rid, kind="stable") for rids, quicker where they are distinct and cover one range (a step's are,
    in whatever order a priority hook left them): one scatter instead of a sort."""
    n = len(rid)
    if n < 2 or (rid[1:] > rid[:-1]).all():  # already in order (no priority hook reordered them)
        return np.arange(n)
    pos = rid - rid.min()
    if pos.max() == n - 1:
        order = np.full(n, -1, np.int64)
        order[pos] = np.arange(n)
        if (order >= 0).all():  # every place filled once: a permutation of the range
            return order
    return stable_argsort(rid)
