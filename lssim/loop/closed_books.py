"""An event-route step's responses gathered into columns once, when the step closes, as functions of the step's state
(lssim.loop.records.StepState) that the controller (lssim.loop.controller) calls.

On the event route (and the cut route) the books are Request objects while the rollout runs. Once it is over and each
response's last weights version is set, `close_step` gathers them into columns once (`StepState.closed`): those that ended
in the step, those carried out, and the members of the groups done now, group after group. The done groups hold both
their objects (a policy's `select` reads them) and their rows; `with_rows` gives a policy's own groups of those
objects their rows too; the trainer, the books (StepState.books), the rows settled later and the step's row read the
columns. Rows others already hold are not read again from the objects: the cut route's responses that ended in the
cut are rows of its submission's columns, which the engine filled as it filled the objects (`StepState.cut`), and
members that ended in an earlier step while their groups stayed open are rows of that step's closed columns (`held_rows`).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np

from lssim.loop.columns import RequestColumns, natural_outcomes, rids_of, rows_by_rid
from lssim.loop.core import Group, Request

if TYPE_CHECKING:
    from lssim.loop.records import StepState


@dataclass(slots=True, frozen=True)
class HeldRows:
    """Columns of responses that ended while their groups stayed open, as their step closed them (final: an ended
    response never changes), found by rid (a run's rids are distinct)."""

    columns: RequestColumns


def close_step(s: StepState, done: list[list[Request]], version: int, earlier: HeldRows | None = None) -> list[Group]:
    """Step `s` once its rollout is over and its responses' last version is set (`version`): its responses (ended,
    carried out, and the members of the groups `done` now, whichever step they ended in) gathered into columns once
    (`s.closed`; the cut's and `earlier`'s rows read from there), and the done groups made over them (Group with both
    objects and rows). Members stay read-only from here on."""
    objects = list(itertools.chain.from_iterable(done))
    done_rids = rids_of(objects)
    if len(np.unique(done_rids)) != len(done_rids):
        raise RuntimeError(f"step {s.step}: a response is a member of two groups done now")
    ended_rids, carried_rids = rids_of(s.ended), rids_of(s.carried_out)
    more_ended = np.flatnonzero(~np.isin(ended_rids, done_rids)) if len(objects) else np.arange(len(s.ended))
    objects.extend(map(s.ended.__getitem__, more_ended.tolist()))
    seen = np.concatenate([done_rids, ended_rids[more_ended]])
    more_carried = np.flatnonzero(~np.isin(carried_rids, seen)) if len(seen) else np.arange(len(s.carried_out))
    objects.extend(map(s.carried_out.__getitem__, more_carried.tolist()))
    rids = np.concatenate([seen, carried_rids[more_carried]])
    s.closed, place = _gathered(objects, rids, s.cut, earlier, version)
    s.closed_objects, s.closed_place = objects, place
    position = np.arange(len(objects))
    s.closed_ended = place[rows_by_rid(rids, position, ended_rids)]
    s.closed_carried = place[rows_by_rid(rids, position, carried_rids)]
    groups, at = [], 0
    for members in done:
        groups.append(Group(members[0].prompt_id, members[0].step, members, columns=s.closed, rows=place[at:at + len(members)]))
        at += len(members)
    return groups


def held_rows(s: StepState, waiting: list[list[Request]], earlier: HeldRows | None = None) -> HeldRows | None:
    """The rows (step `s`'s closed ones, or `earlier`'s) of the members of the groups still `waiting` that have ended,
    for the step that completes their groups (close_step's `earlier`); None: none."""
    rids = rids_of([r for members in waiting for r in members if r.done])
    now = rows_by_rid(s.closed.rid, np.arange(len(s.closed)), rids)
    before = (np.full(len(rids), -1, np.int64) if earlier is None else
              rows_by_rid(earlier.columns.rid, np.arange(len(earlier.columns)), rids))
    in_now, in_before = now >= 0, (now < 0) & (before >= 0)
    if not (in_now.any() or in_before.any()):
        return None
    parts = [s.closed.take(now[in_now])] + ([earlier.columns.take(before[in_before])] if in_before.any() else [])
    return HeldRows(RequestColumns.concat(parts))


def with_rows(s: StepState, groups: Sequence[Group]) -> list[Group]:
    """`groups` (a policy's selection), each group of objects whose members step `s`'s closed columns hold made a
    Group over those rows as well (the same objects: the trainer and the books read the columns)."""
    closed, row_of = s.closed, None
    out = []
    for g in groups:
        if g.columns is None and closed is not None:
            row_of = s.closed_row if row_of is None else row_of
            members = g.requests
            rows = np.fromiter(map(row_of.get, map(id, members), itertools.repeat(-1)), np.int64, len(members))
            if len(rows) and rows.min() >= 0:
                g = Group(g.prompt_id, g.step, members, columns=closed, rows=rows)
        out.append(g)
    return out


def natural_outcomes_of(s: StepState, counterfactual: Callable[[Request], tuple[int, float] | None]) -> tuple[np.ndarray, np.ndarray]:
    """natural_len / natural_reward of the responses that ended in step `s` (lssim.loop.columns.natural_outcomes);
    those that ended in a cut rollout read from its submission's columns, which the engine filled with what
    `counterfactual` answers (lssim.loop.contracts.Engine.run_cut)."""
    if s.cut is None:
        return natural_outcomes(s.ended, counterfactual)
    columns, cut_rows = s.cut
    row = rows_by_rid(columns.rid[cut_rows], cut_rows, rids_of(s.ended))
    known = row >= 0
    length, reward = np.empty(len(row), np.int64), np.empty(len(row))
    length[known], reward[known] = columns.natural_len[row[known]], columns.natural_reward[row[known]]
    length[~known], reward[~known] = natural_outcomes([r for r, k in zip(s.ended, known.tolist()) if not k], counterfactual)
    return length, reward


def _gathered(objects: list[Request], rids: np.ndarray, cut: tuple[RequestColumns, np.ndarray] | None,
              earlier: HeldRows | None, version: int) -> tuple[RequestColumns, np.ndarray]:
    """RequestColumns.of(objects) (`rids`: theirs), reading the rows others hold, and each object's row in it: those
    that ended in a cut rollout (`cut`: its submission's columns, filled as the objects were, and the rows of those
    that ended in it) with the last version they were given (`version`) and of's defaults for the step's own fields
    (natural_len, natural_reward, context_at_start); those that ended in earlier steps from `earlier`. The rows of each
    source come first, in object order, then those read from the objects."""
    sources = ([(cut[0], cut[0].rid[cut[1]], cut[1])] if cut is not None else []) + \
        ([(earlier.columns, earlier.columns.rid, np.arange(len(earlier.columns)))] if earlier is not None else [])
    if not sources:
        return RequestColumns.of(objects), np.arange(len(objects))
    n = len(objects)
    source, row = np.full(n, len(sources), np.int64), np.full(n, -1, np.int64)  # len(sources): read from the object
    for k, (_, keys, rows) in enumerate(sources):
        found = rows_by_rid(keys, rows, rids)
        new = (found >= 0) & (source == len(sources))
        source[new], row[new] = k, found[new]
    order = np.argsort(source, kind="stable")
    parts = [columns.take(row[order[source[order] == k]]) for k, (columns, _, _) in enumerate(sources)]
    parts.append(RequestColumns.of([objects[i] for i in order[source[order] == len(sources)].tolist()]))
    out = RequestColumns.concat(parts)
    if cut is not None:
        in_cut = slice(0, len(parts[0]))
        out.last_version[in_cut], out.natural_len[in_cut], out.natural_reward[in_cut] = version, -1, np.nan
        out.context_at_start[in_cut] = out.prompt_len[in_cut]
    place = np.empty(n, np.int64)
    place[order] = np.arange(n)
    return out, place
