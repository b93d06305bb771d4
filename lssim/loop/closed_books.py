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

from lssim.loop.columns import RequestColumns, natural_outcomes
from lssim.loop.core import Group, Request

if TYPE_CHECKING:
    from lssim.loop.records import StepState


@dataclass(slots=True, frozen=True)
class HeldRows:
    """Columns of responses that ended while their groups stayed open, as their step closed them (final: an ended
    response never changes), by id of the object; the objects are held with them, so no other object takes an id."""

    columns: RequestColumns
    row: dict[int, int]
    objects: list[Request]


def close_step(s: StepState, done: list[list[Request]], version: int, earlier: HeldRows | None = None) -> list[Group]:
    """Step `s` once its rollout is over and its responses' last version is set (`version`): its responses (ended,
    carried out, and the members of the groups `done` now, whichever step they ended in) gathered into columns once
    (`s.closed`; the cut's and `earlier`'s rows read from there), and the done groups made over them (Group with both
    objects and rows). Members stay read-only from here on."""
    objects, seen = [], set()
    for members in done:
        objects.extend(members)
    seen.update(map(id, objects))
    if len(seen) != len(objects):
        raise RuntimeError(f"step {s.step}: a response is a member of two groups done now")
    objects.extend(r for r in s.ended if id(r) not in seen)
    seen.update(map(id, s.ended))
    objects.extend(r for r in s.carried_out if id(r) not in seen)
    s.closed, place = _gathered(objects, s.cut, earlier, version)
    s.closed_row = row_of = dict(zip(map(id, objects), place.tolist()))
    s.closed_ended = np.fromiter(map(row_of.__getitem__, map(id, s.ended)), np.int64, len(s.ended))
    s.closed_carried = np.fromiter(map(row_of.__getitem__, map(id, s.carried_out)), np.int64, len(s.carried_out))
    groups, at = [], 0
    for members in done:
        groups.append(Group(members[0].prompt_id, members[0].step, members, columns=s.closed, rows=place[at:at + len(members)]))
        at += len(members)
    return groups


def held_rows(s: StepState, waiting: list[list[Request]], earlier: HeldRows | None = None) -> HeldRows | None:
    """The rows (step `s`'s closed ones, or `earlier`'s) of the members of the groups still `waiting` that have ended,
    for the step that completes their groups (close_step's `earlier`); None: none."""
    ended = [r for members in waiting for r in members if r.done]
    ids = list(map(id, ended))
    now = np.fromiter(map(s.closed_row.get, ids, itertools.repeat(-1)), np.int64, len(ids))
    before = (np.full(len(ids), -1, np.int64) if earlier is None else
              np.fromiter(map(earlier.row.get, ids, itertools.repeat(-1)), np.int64, len(ids)))
    in_now, in_before = now >= 0, (now < 0) & (before >= 0)
    if not (in_now.any() or in_before.any()):
        return None
    objects = [ended[i] for i in np.flatnonzero(in_now).tolist() + np.flatnonzero(in_before).tolist()]
    parts = [s.closed.take(now[in_now])] + ([earlier.columns.take(before[in_before])] if in_before.any() else [])
    return HeldRows(RequestColumns.concat(parts), dict(zip(map(id, objects), range(len(objects)))), objects)


def with_rows(s: StepState, groups: Sequence[Group]) -> list[Group]:
    """`groups` (a policy's selection), each group of objects whose members step `s`'s closed columns hold made a
    Group over those rows as well (the same objects: the trainer and the books read the columns)."""
    closed, row_of = s.closed, s.closed_row
    out = []
    for g in groups:
        if g.columns is None and closed is not None:
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
    row = np.fromiter(map(cut_rows.get, map(id, s.ended), itertools.repeat(-1)), np.int64, len(s.ended))
    known = row >= 0
    length, reward = np.empty(len(row), np.int64), np.empty(len(row))
    length[known], reward[known] = columns.natural_len[row[known]], columns.natural_reward[row[known]]
    length[~known], reward[~known] = natural_outcomes([r for r, k in zip(s.ended, known.tolist()) if not k], counterfactual)
    return length, reward


def _gathered(objects: list[Request], cut: tuple[RequestColumns, dict[int, int]] | None, earlier: HeldRows | None,
              version: int) -> tuple[RequestColumns, np.ndarray]:
    """RequestColumns.of(objects), reading the rows others hold, and each object's row in it: those that ended in a
    cut rollout (`cut`: its submission's columns, filled as the objects were, and id -> row) with the last version
    they were given (`version`) and of's defaults for the step's own fields (natural_len, natural_reward,
    context_at_start); those that ended in earlier steps from `earlier`. The rows of each source come first, in object
    order, then those read from the objects."""
    sources = ([cut] if cut is not None else []) + ([(earlier.columns, earlier.row)] if earlier is not None else [])
    if not sources:
        return RequestColumns.of(objects), np.arange(len(objects))
    ids, n = list(map(id, objects)), len(objects)
    source, row = np.full(n, len(sources), np.int64), np.full(n, -1, np.int64)  # len(sources): read from the object
    for k, (_, row_of) in enumerate(sources):
        found = np.fromiter(map(row_of.get, ids, itertools.repeat(-1)), np.int64, n)
        new = (found >= 0) & (source == len(sources))
        source[new], row[new] = k, found[new]
    order = np.argsort(source, kind="stable")
    parts = [columns.take(row[order[source[order] == k]]) for k, (columns, _) in enumerate(sources)]
    parts.append(RequestColumns.of([objects[i] for i in order[source[order] == len(sources)].tolist()]))
    out = RequestColumns.concat(parts)
    if cut is not None:
        in_cut = slice(0, len(parts[0]))
        out.last_version[in_cut], out.natural_len[in_cut], out.natural_reward[in_cut] = version, -1, np.nan
        out.context_at_start[in_cut] = out.prompt_len[in_cut]
    place = np.empty(n, np.int64)
    place[order] = np.arange(n)
    return out, place
