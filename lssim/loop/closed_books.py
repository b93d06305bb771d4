"""An event-route step's responses gathered into columns once, when the step closes, as functions of the step's state
(lssim.loop.records.StepState) that the controller (lssim.loop.controller) calls.

On the event route (and the cut route) the books are Request objects while the rollout runs. Once it is over and each
response's last weights version is set, `close_step` gathers them into columns once (`StepState.closed`): those that ended
in the step, those carried out, and the members of the groups done now, group after group. The done groups hold both
their objects (a policy's `select` reads them) and their rows; `with_rows` gives a policy's own groups of those
objects their rows too; the trainer, the books (StepState.books), the rows settled later and the step's row read the
columns. Rows others already hold are not read again from the objects, and are found by rid: the cut and carry routes'
responses that ended in the rollout are rows of the submission's columns, which the engine filled (`StepState.cut`; a
group whose every member ended there has no objects: lssim.loop.cut_books), and members that ended in an earlier step
while their groups stayed open are rows of that step's closed columns (`held_rows`).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterable, Sequence

import numpy as np

from lssim.loop.columns import GroupBatch, RequestColumns, natural_outcomes, rids_of, rows_by_rid
from lssim.loop.core import Group, Request
from lssim.loop.row_requests import CarriedRows, GroupRows

if TYPE_CHECKING:
    from lssim.loop.records import StepState


@dataclass(slots=True, frozen=True)
class HeldRows:
    """Columns of responses that ended while their groups stayed open, as their step closed them (final: an ended
    response never changes), found by rid (a run's rids are distinct)."""

    columns: RequestColumns


def close_step(s: StepState, done: list[list[Request] | np.ndarray | GroupRows], version: int,
               earlier: HeldRows | None = None) -> GroupBatch:
    """Step `s` once its rollout is over and its responses' last version is set (`version`): its responses (those that
    ended in the cut, the other ended, those carried out, and the members of the groups `done` now, whichever step they
    ended in) gathered into columns once (`s.closed`; the cut's and `earlier`'s rows read from there), and the done
    groups as rows of them (a GroupBatch; a group of objects holds them too, a group of the cut booked as rows or as
    GroupRows is rows only: StepState.members). Members stay read-only from here on."""
    kinds = [_OBJECTS if isinstance(members, list) else _HELD if isinstance(members, GroupRows) else _CUT for members in done]
    objects = list(itertools.chain.from_iterable(m for m, kind in zip(done, kinds) if kind == _OBJECTS))
    held = _member_rids([m for m, kind in zip(done, kinds) if kind == _HELD])  # found by rid, never read as objects
    done_rids = np.concatenate([rids_of(objects), held])
    if not _distinct(done_rids):
        raise RuntimeError(f"step {s.step}: a response is a member of two groups done now")
    carried = s.carried_out
    carried_rids = carried.rids() if isinstance(carried, CarriedRows) else rids_of(carried)
    rest = list(itertools.chain(s.cut_objects, s.ended, () if isinstance(carried, CarriedRows) else carried))
    n_objects = len(objects) + len(rest)
    # (carried as rows: found in the rows left open, as the members held as rows are found where they are held)
    as_rows = [carried_rids] if isinstance(carried, CarriedRows) else []
    rids = np.concatenate([done_rids[:len(objects)], rids_of(rest), *as_rows, done_rids[len(objects):]])
    first = np.sort(np.unique(rids, return_index=True)[1])  # each response once, where it first comes (objects first)
    objects.extend(rest)
    objects, rids = list(map(objects.__getitem__, first[first < n_objects].tolist())), rids[first]
    left_open = None if s.open_cut is None else s.open_cut[0].left_open(s.open_cut[1], s.cut[0])
    s.closed, place = _gathered(objects, rids, s.cut, [earlier.columns] if earlier is not None else [], left_open, version)
    s.closed_objects, s.closed_place = objects, place[:len(objects)]
    position = np.arange(len(rids))
    in_cut = len(s.cut[1]) if s.cut is not None else 0  # the cut's rows: the closed columns' first, in order
    s.closed_ended = np.concatenate([np.arange(in_cut), place[rows_by_rid(rids, position, rids_of(s.ended))]])
    s.closed_carried = place[rows_by_rid(rids, position, carried_rids)]
    held_place = place[rows_by_rid(rids, position, done_rids[len(done_rids) - len(held):])]
    return _done_groups(s, done, kinds, place, held_place)


_OBJECTS, _HELD, _CUT = 0, 1, 2  # _done_groups' kinds of group: Request objects, GroupRows, rows of the cut


def _distinct(rids: np.ndarray) -> bool:
    """No rid twice: counted over their range where it is about as long as they are (a step's rids are about one
    range), else sorted (numpy 2's np.unique without a return hashes them, several times slower)."""
    if len(rids) < 2:
        return True
    lo, hi = int(rids.min()), int(rids.max())
    if hi - lo < 4 * len(rids):
        return np.count_nonzero(np.bincount(rids - lo)) == len(rids)
    ordered = np.sort(rids)
    return not (ordered[1:] == ordered[:-1]).any()


def _member_rids(groups: list[GroupRows]) -> np.ndarray:
    """The rids of `groups`' members, group after group (GroupRows.rids of each), read a submission's columns at a
    time."""
    if not groups:
        return np.zeros(0, np.int64)
    rows, sources = np.concatenate([g.rows for g in groups]), [g.columns for g in groups]
    if sources.count(sources[0]) == len(sources):  # (RequestColumns compare by identity: eq=False)
        return sources[0].rid[rows]
    source = np.repeat([id(c) for c in sources], np.fromiter(map(len, groups), np.int64, len(groups)))
    out = np.empty(len(rows), np.int64)
    for columns in {id(c): c for c in sources}.values():
        at = source == id(columns)
        out[at] = columns.rid[rows[at]]
    return out


def _done_groups(s: StepState, done: list[list[Request] | np.ndarray | GroupRows], kinds: list[int], place: np.ndarray,
                 held_place: np.ndarray) -> GroupBatch:
    """close_step's groups (of `kinds`), as rows of the closed columns (a Group made only for a group someone looks at),
    each group of objects holding them (GroupBatch.held): the object groups' members are the first gathered (`place`:
    each gathered object's row), the GroupRows' members' rows are `held_place`, group after group, and a group booked as
    rows is rows of the cut's submission (the closed columns' first rows)."""
    # Members placed kind by kind (each kind's rows come in group order), not group by group (a step has thousands of groups)
    sizes = np.fromiter(map(len, done), np.int64, len(done))
    member_kinds = np.repeat(np.array(kinds, np.int8), sizes)
    rows = np.empty(len(member_kinds), np.int64)
    objects = member_kinds == _OBJECTS
    rows[objects] = place[:np.count_nonzero(objects)]
    rows[member_kinds == _HELD] = held_place
    if _CUT in kinds:
        columns, cut_rows = s.cut
        cut_place = np.full(len(columns), -1, np.int64)
        cut_place[cut_rows] = np.arange(len(cut_rows))
        rows[member_kinds == _CUT] = cut_place[np.concatenate([m for m, kind in zip(done, kinds) if kind == _CUT])]
    held = [members if kind == _OBJECTS else None for members, kind in zip(done, kinds)]
    return GroupBatch(s.closed, rows, sizes, None if held.count(None) == len(held) else held)


def held_rows(s: StepState, waiting: Iterable[int], earlier: HeldRows | None = None) -> HeldRows | None:
    """The rows (step `s`'s closed ones, or `earlier`'s) of the members that have ended of the groups still `waiting`
    (their group ids), for the step that completes their groups (close_step's `earlier`); None: none. Found by group
    id over the columns (a run's group ids are distinct): the closed rows of a waiting group that ended (its carried
    members are closed too, not ended), and every row `earlier` holds of one (only ended members are held)."""
    gids = np.fromiter(waiting, np.int64)
    if not len(gids):
        return None
    closed = s.closed
    now = np.flatnonzero(np.isin(closed.group_id, gids) & (closed.finish_reason != ""))
    before = np.zeros(0, np.int64) if earlier is None else np.flatnonzero(np.isin(earlier.columns.group_id, gids))
    if not (len(now) or len(before)):
        return None
    parts = [(closed, now)] + ([(earlier.columns, before)] if len(before) else [])
    return HeldRows(RequestColumns.concat_taken(parts))


def with_rows(s: StepState, groups: Sequence[Group]) -> list[Group]:
    """`groups` (a policy's selection), each group of objects whose members step `s`'s closed columns hold made a
    Group over those rows as well (the same objects: the trainer and the books read the columns)."""
    if isinstance(groups, GroupBatch):  # every group rows of one step's columns already (no Group object made)
        return groups
    closed, row_of = s.closed, None
    out = []
    for g in groups:
        if g.columns is None and closed is not None:
            row_of = dict(zip(map(id, s.closed_objects), s.closed_place.tolist())) if row_of is None else row_of
            members = g.requests
            rows = np.fromiter(map(row_of.get, map(id, members), itertools.repeat(-1)), np.int64, len(members))
            if len(rows) and rows.min() >= 0:
                g = Group(g.prompt_id, g.step, members, columns=closed, rows=rows)
        out.append(g)
    return out


def natural_outcomes_of(s: StepState, counterfactual: Callable[[Request], tuple[int, float] | None]) -> tuple[np.ndarray, np.ndarray]:
    """natural_len / natural_reward of the responses that ended in step `s` (lssim.loop.columns.natural_outcomes), in
    the order they ended: those that ended in a cut rollout read from its submission's columns, which the engine filled
    with what `counterfactual` answers (lssim.loop.contracts.Engine.run_cut), then the others (those aborted at the cut
    are rows of those columns too, still open when the rollout left them: read there)."""
    if s.cut is None:
        return natural_outcomes(s.ended, counterfactual)
    columns, rows = s.cut
    at = np.full(len(s.ended), -1, np.int64)
    if s.open_cut is not None and s.ended:
        left = s.open_cut[1]
        at = rows_by_rid(columns.rid[left], left, rids_of(s.ended))
    if (at >= 0).all():
        length, reward = columns.natural_len[at], columns.natural_reward[at]
    else:
        length, reward = natural_outcomes(s.ended, counterfactual)
    return np.concatenate([columns.natural_len[rows], length]), np.concatenate([columns.natural_reward[rows], reward])


def _gathered(objects: list[Request], rids: np.ndarray, cut: tuple[RequestColumns, np.ndarray] | None,
              held: list[RequestColumns], left_open: RequestColumns | None, version: int) -> tuple[RequestColumns, np.ndarray]:
    """Columns of the responses that ended in a cut rollout (`cut`: its submission's columns, filled as the objects
    were, and those rows: first, in that order, with the last version they were given, `version`, and of's defaults
    for the step's own fields: natural_len, natural_reward, context_at_start), then those of `rids` (the objects', then
    those of members held as rows) found in neither: from `held` (ended in earlier steps: HeldRows) where there, then
    from `left_open` (the cut's rows still open when its rollout left them: StepState.open_cut, given `version`), else
    RequestColumns.of(objects) (a row held so is always found); and the row of each of `rids`."""
    parts, at, versioned = [], 0, []  # (columns, rows) to gather; the gathered rows given `version`
    place = np.full(len(rids), -1, np.int64)
    if cut is not None:
        columns, rows = cut
        parts.append((columns, rows))
        versioned.append((0, len(rows)))
        place, at = rows_by_rid(columns.rid.take(rows), np.arange(len(rows)), rids), len(rows)
    for source in held + ([left_open] if left_open is not None else []):
        found = rows_by_rid(source.rid, np.arange(len(source)), rids)
        there = np.flatnonzero((found >= 0) & (place < 0))
        parts.append((source, found[there]))
        if source is left_open:
            versioned.append((at, at + len(there)))
        place[there], at = at + np.arange(len(there)), at + len(there)
    rest = np.flatnonzero(place < 0)
    if len(rest) and rest[-1] >= len(objects):
        raise RuntimeError(f"response {int(rids[rest[-1]])}, held as a row, is neither in the cut nor held from an earlier step")
    if len(rest) or not parts:  # (no part of no rows: RequestColumns.of makes every column for none)
        parts.append((RequestColumns.of(list(map(objects.__getitem__, rest.tolist()))), None))
    place[rest] = at + np.arange(len(rest))
    closed = RequestColumns.concat_taken(parts)
    for start, stop in versioned:
        closed.last_version[start:stop] = version
    if cut is not None:  # the step's own fields, as of() leaves them
        in_cut = slice(0, len(cut[1]))
        closed.natural_len[in_cut], closed.natural_reward[in_cut] = -1, np.nan
        closed.context_at_start[in_cut] = closed.prompt_len[in_cut]
    return closed, place
