"""The cut and carry routes' books (lssim.sim.cut_route, lssim.sim.carry_route), as functions of the step's state
(lssim.loop.records.StepState) that the controller (lssim.loop.controller) calls.

The engine schedules a step's submission whole from its columns and fills them; the books keep the columns and make a
`Request` object only for a response something reads as one: a carried response (it resumes next step), one still
running when the rollout is cut (the engine aborts it, `on_unfinished` judges it), every member of their groups (the
group stays open, or may: its members are held as objects between steps), and every response where the policy hears of
each ending one by one (`on_finish` without its array form). A group whose every member ended in the rollout is
booked as rows of the submission (`StepState.members` holds its rows), and the step's responses that ended in the
rollout are rows of the submission's columns (`StepState.cut`), ahead of those that end later (aborted at the cut).
Where a hook reads the requests before the submission (priority, placement), every object is made first, as on the
event route, and booked the same way.
"""

from __future__ import annotations

import itertools
import operator

import numpy as np

from lssim.loop.columns import RequestColumns, TakenRows, _resumes, rids_of, runs
from lssim.loop.contracts import Engine
from lssim.loop.core import ABORT, Request, note_resume
from lssim.loop.policy import Policy
from lssim.loop.records import StepState
from lssim.loop.rollout_books import (carry_out, count_effective, count_ended, end_response, end_responses,
                                     members_ended)
from lssim.loop.row_requests import CarriedRows, GroupRows, LeftOpenRows, RowRequests


def rollout_cut(fresh: RequestColumns, s: StepState, engine: Engine, policy: Policy, asks: dict[str, bool],
                submission: list[Request] | None = None) -> bool:
    """The rollout of a policy whose end_rollout has an array form, scheduled whole and cut where it ends
    (Engine.run_cut, lssim.sim.cut_route), or whose on_progress carries, as an array, run whole with the carries
    (lssim.sim.carry_route), booked as the event route books it (on_finish told of each ended response, the carried
    ones carried, in the order they left); False if the engine left it to the event route (nothing booked).
    `fresh`: the plan's requests as columns; `submission`: where a hook ordered or placed them, the requests in the
    order queued, registered and launched (Controller._launch); None: the carried responses first, then `fresh`,
    booked here (registered as they leave the rollout)."""
    if submission is not None:
        columns = RequestColumns.of(submission)
        requests = RowRequests(columns, submission)
        n_carried = 0
    else:
        carried, given = _carried_rows(s)
        n_carried = len(given)
        columns = RequestColumns.concat([carried, fresh]) if n_carried else fresh
        requests = RowRequests(columns.copy(), given, filled=columns)
    carries = asks["on_progress"]  # Controller._cut_rollout: carries, or an end_rollout rule (never both)
    left = engine.run_cut(requests, columns, carry_at=policy.progress_carries) if carries else \
        engine.run_cut(requests, columns, policy.end_rollout_at)
    if left is None:
        return False
    if isinstance(s.carried_in, CarriedRows):  # their objects made here from now on, their rewards written back
        s.carried_in.requests.forward(s.carried_in.rows, requests, np.arange(n_carried))
        requests.write_back()
    if submission is not None:
        _book_objects(requests.make(left), columns, s, policy, asks)
    else:
        _book_rows(left, requests, columns, n_carried, s, policy, asks)
    if len(left):
        # the last boundary's time (a carried response has no finish time; the clock nothing reads after the rollout)
        last = int(left[-1])
        s.rollout.now = engine.now() if requests.open(left[-1:])[0] else float(columns.finish_time[last])
    return True


def _carried_rows(s: StepState) -> tuple[RequestColumns | None, list[Request | None]]:
    """The carried responses as the submission's first rows (None: none), and the object of each given to it (None:
    none made, the row is the response). Carried as objects: RequestColumns.of them, read as they resumed
    (Controller._start_step); carried as rows (CarriedRows): the rows the last step closed them into, resumed here
    (note_resume of the rows and of the objects made)."""
    carried = s.carried_in
    if not isinstance(carried, CarriedRows):
        objects = [r for r in carried if not r.done]
        return (_carried_columns(s, objects) if objects else None), objects
    columns = s.carried_rows  # (checked against them when the step started: StepState.open_carried_rows)
    objects = carried.objects()
    for r in objects:
        if r is not None:
            note_resume(r, s.version)
    resume_rows(columns, s.version)
    return columns, objects


def resume_rows(columns: RequestColumns, version: int) -> None:
    """lssim.loop.core.note_resume of every row of `columns`, in place: they resume under weights `version`."""
    generated, first, n = columns.generated, columns.first_version, len(columns)
    resumes = [None] * n if columns.resumes is None else columns.resumes.tolist()
    # one that never started gets its first token from these weights; one that ran under others resumes here
    resumes = [None if gen == 0 else
               (spans if spans[-1][0] == version else spans + [(version, gen)]) if spans is not None else
               (None if first_v == version else [(version, gen)])
               for gen, spans, first_v in zip(generated.tolist(), resumes, first.tolist())]
    first[generated == 0] = version
    columns.tokens_before_resume[:] = generated
    columns.resumes = _resumes(resumes)


def _carried_columns(s: StepState, carried: list[Request]) -> RequestColumns:
    """RequestColumns.of(carried): the rows the last step closed them into (`s.carried_rows`), with the fields resuming
    changed (lssim.loop.core.note_resume) read from the objects."""
    columns = s.carried_rows
    if columns is None or len(columns) != len(carried) or not np.array_equal(columns.rid, rids_of(carried)):
        return RequestColumns.of(carried)
    first, before, resumes = zip(*map(_resumed, carried))
    columns.first_version[:], columns.tokens_before_resume[:] = first, before
    columns.resumes = _resumes(resumes)
    return columns


_resumed = operator.attrgetter("first_version", "tokens_before_resume", "resumes")


def _book_objects(left: list[Request], columns: RequestColumns, s: StepState, policy: Policy, asks: dict[str, bool]) -> None:
    """The books of the responses that left a cut or carried rollout whose every request was registered and launched
    (`left`, in the order they left; `columns`: the submission's, filled by the engine): each carried one as `carry_out`
    carries it (no hook hears of a carry), the ended ones as `end_response` books them, on_finish told of each in turn,
    or, where the policy has on_finish's array form, all booked at once and told once. The ended ones are then the
    cut's rows (`s.cut`), not in `s.ended`."""
    ended = [r for r in left if r.finish_reason]
    for r in left:
        if not r.finish_reason:  # carried: the engine left its carry's reason in stop_reason
            carry_out(r, s, r.stop_reason)
    row_of = dict(zip(columns.rid.tolist(), range(len(columns))))  # (a submission's rids are distinct)
    rows = np.fromiter(map(row_of.__getitem__, rids_of(ended).tolist()), np.int64, len(ended))
    state, tell = s.rollout, asks["on_finish"]
    if tell and not policy.finishes_in_batches():  # on_finish told of each as it is booked, as the event route does
        for r in ended:
            end_response(r, s)
            policy.on_finish(r, state)
    else:  # nobody reads the books between two of them: all booked at once, then on_finish's array form
        end_responses(ended, s)
        if tell:
            policy.on_finishes(columns.take(rows), state)
    s.cut, s.cut_objects, s.ended = (columns, rows), s.ended, []


def _book_rows(left: np.ndarray, requests: RowRequests, columns: RequestColumns, n_carried: int, s: StepState,
               policy: Policy, asks: dict[str, bool]) -> None:
    """The books of a cut or carried rollout of the carried responses (the first `n_carried` rows) and the plan's
    (the rest, group after group), none registered yet: `left`, the rows that left, in that order (a carried one has
    its object, not ended). What `register`, `Controller._launch`, `carry_out` and `end_response` keep, with objects
    only where they are read (the module's docstring)."""
    n, state = len(columns), s.rollout
    is_open = requests.open(left)
    ended, carried = left[~is_open], left[is_open]
    running = np.ones(n, bool)
    running[left] = False
    tell = asks["on_finish"]
    one_by_one = tell and not policy.finishes_in_batches()
    starts, sizes = runs(columns.group_id[n_carried:])
    starts += n_carried
    # a plan's group is booked as rows where every member ended (else as GroupRows), as objects where on_finish hears
    # of each
    still_open = running.copy()
    still_open[carried] = True
    has_open = (np.logical_or.reduceat(still_open[n_carried:], starts - n_carried) if len(starts) else
                np.zeros(0, bool))
    as_rows = np.zeros(len(starts), bool) if one_by_one else ~has_open
    _register_groups(requests, columns, n_carried, starts, sizes, as_rows, one_by_one, s)
    s.in_flight_rows = (requests, np.flatnonzero(running))  # (their objects made if settled as objects: settle_rows)
    state.requests_in_flight = n - len(carried)
    if len(carried):  # as `carry_out` carries them (the engine left each carry's reason), as rows
        s.carried_out = CarriedRows(requests, carried)
    s.open_cut = (requests, np.flatnonzero(still_open))
    s.cut = (columns, ended)
    if one_by_one:  # on_finish told of each as it is booked, as the event route does
        s.cut_objects = requests.make(ended, source=columns)
        for r in s.cut_objects:
            state.requests_in_flight -= 1
            state.responses_done += 1
            members_ended(r.group_id, 1, s)
            policy.on_finish(r, state)
    else:
        s.cut_objects = requests.made_of(ended[ended < n_carried])  # the carried responses' given
        booked_as_rows = np.zeros(n, bool)
        booked_as_rows[n_carried:] = np.repeat(as_rows, sizes)
        count_ended(columns.group_id[ended[~booked_as_rows[ended]]], s)
    _end_groups_as_rows(as_rows, starts, sizes, columns, s)
    if tell and not one_by_one:
        policy.on_finishes(TakenRows(columns, ended), state)  # (a hook reads a column or two of the 26)


def _register_groups(requests: RowRequests, columns: RequestColumns, n_carried: int, starts: np.ndarray,
                     sizes: np.ndarray, as_rows: np.ndarray, as_objects: bool, s: StepState) -> None:
    """`register`'s books of the plan's groups (starting at rows `starts`, `sizes` long): every group's members as
    objects where `as_objects` (those that ended made from the filled columns, as the engine would have filled them),
    else each group as its rows of the submission where `as_rows` (every member ended), or as GroupRows (the objects
    of its open members, the rows of all); every member open until booked ended."""
    if as_objects:
        object_rows = np.arange(n_carried, len(columns))
    else:  # the open members' objects, made already by the engine where it runs them (a carried one is a row)
        open_rows = np.flatnonzero(requests.open(np.arange(n_carried, len(columns))))
        object_rows = open_rows + n_carried
        object_rows = object_rows[requests.has(object_rows)]
    s.fresh = fresh_objects = requests.make(object_rows, source=columns)
    s.fresh_rows_only = len(columns) - n_carried - len(object_rows)
    members, every_row = s.members, np.arange(len(columns))
    gids, counts = columns.group_id[starts].tolist(), sizes.tolist()
    if as_objects:
        for gid, at, k in zip(gids, itertools.accumulate(counts, initial=0), counts):
            members[gid] = fresh_objects[at:at + k]
    else:  # as rows of the submission where every member ended in the rollout, else as GroupRows
        for gid, a, k, rows_only in zip(gids, starts.tolist(), counts, as_rows.tolist()):
            members[gid] = every_row[a:a + k] if rows_only else GroupRows(requests, columns, every_row[a:a + k])
    s.open_members.update(zip(gids, counts))
    s.rollout.groups_submitted = len(members)


def _end_groups_as_rows(as_rows: np.ndarray, starts: np.ndarray, sizes: np.ndarray, columns: RequestColumns,
                        s: StepState) -> None:
    """The books of the plan's groups whose every member ended in the rollout (`as_rows`, of the groups starting at
    `starts`, `sizes` long): members ended, each group done, effective where its rewards differ (members_ended's)."""
    if not as_rows.any():
        return
    state = s.rollout
    firsts, counts = starts[as_rows], sizes[as_rows]
    rows = np.repeat(firsts - (np.cumsum(counts) - counts), counts) + np.arange(counts.sum())  # each group's rows in turn
    state.requests_in_flight -= len(rows)
    state.responses_done += len(rows)
    state.groups_done += int(as_rows.sum())
    state.groups_effective += count_effective(columns.reward[rows], sizes[as_rows])
    s.open_members.update(zip(columns.group_id[starts[as_rows]].tolist(), itertools.repeat(0)))


def settle_rows(s: StepState, engine: Engine, policy: Policy, asks: dict[str, bool], keeps_generating: bool) -> None:
    """Controller._settle_unfinished of the responses a cut left running (`s.in_flight_rows`), kept as rows where it
    can: aborted (Engine.abort_many), judged by on_unfinished's array form, the carried ones carried as rows
    (CarriedRows), the dropped ones ended as objects. Where the policy judges them one by one, the mode keeps them
    generating or some were carried as objects already, their objects are put in `s.in_flight` instead, for the
    controller to settle as objects."""
    held, s.in_flight_rows = s.in_flight_rows, None
    if held is None:
        return
    requests, rows = held
    if keeps_generating or not policy.unfinished_in_batches() or not isinstance(s.carried_out, list) or s.carried_out:
        s.in_flight.update(zip(requests.filled.rid[rows].tolist(), requests.make(rows)))
        return
    engine.abort_many(CarriedRows(requests, rows))  # (an aborted response's fields are final: judged after all)
    # (as their objects hold them where made: an engine that built its heaps aborted those)
    unfinished = LeftOpenRows(requests, rows, requests.filled) if asks["on_unfinished"] else None
    carry = policy.on_unfinished_rows(unfinished) if unfinished is not None else np.zeros(len(rows), bool)
    carried, dropped = rows[carry], rows[~carry]
    if len(carried):
        requests.carry(carried)
        s.rollout.requests_in_flight -= len(carried)
        s.carried_out = CarriedRows(requests, carried)
    objects = requests.make(dropped)
    s.in_flight.update(zip(rids_of(objects).tolist(), objects))
    for r in objects:
        r.finish_reason, r.stop_reason = ABORT, r.stop_reason or "rollout ended"
        end_response(r, s)
