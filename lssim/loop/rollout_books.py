"""A step's rollout in its books, as functions of the step's state (lssim.loop.records.StepState) that the controller
(lssim.loop.controller) calls: new requests registered on the event route, a response ended there, the batch route's
whole rollout closed at once, and the policy's priorities and placements asked before a submission (the cut and carry
routes' rollouts: lssim.loop.cut_books).
"""

from __future__ import annotations

import itertools
from typing import Callable

import numpy as np

from lssim.loop.columns import RequestColumns, TakenRows, rids_of, runs, stable_argsort, with_signal
from lssim.loop.contracts import Engine, ModeHooks
from lssim.loop.core import ABORT, Request, field_of
from lssim.loop.policy import Policy
from lssim.loop.records import StepState
from lssim.loop.row_requests import GroupRows


def register(fresh: RequestColumns, s: StepState) -> list[Request]:
    """The event route's books for new requests: Request objects, each group's members, open counts (each starts
    the step at its prompt: StepState.context_at_start)."""
    requests = fresh.to_requests()
    starts, sizes = runs(fresh.group_id)
    groups = fresh.group_id[starts].tolist()
    # the plan's usual requests: new groups, each group's members consecutive (made group after group)
    if len(set(groups)) == len(groups) and s.members.keys().isdisjoint(groups):
        starts, sizes = starts.tolist(), sizes.tolist()
        s.members.update((g, requests[a:a + n]) for g, a, n in zip(groups, starts, sizes))
        s.open_members.update(zip(groups, sizes))
        return requests
    for r in requests:
        members = s.members.get(r.group_id)
        if members is None:
            members = s.members[r.group_id] = []
        members.append(r)
    for gid in np.unique(fresh.group_id).tolist():
        s.open_members[gid] = len(s.members[gid])
    return requests


def end_response(r: Request, s: StepState) -> None:
    """The event route's books for a response that ended in the rollout (finished, stopped or aborted)."""
    state = s.rollout
    del s.in_flight[r.rid]
    state.requests_in_flight -= 1
    state.responses_done += 1
    s.ended.append(r)
    members_ended(r.group_id, 1, s)


def carry_out(r: Request, s: StepState, reason: str) -> None:
    """The event route's books for a response carried mid-rollout (Action.carry): paused with its tokens, resumed next
    step; its group stays open."""
    del s.in_flight[r.rid]
    s.rollout.requests_in_flight -= 1
    r.stop_reason = reason
    s.carried_out.append(r)


def end_responses(ended: list[Request], s: StepState) -> None:
    """`end_response` of each of `ended` in turn, at once: the same books once the last is booked."""
    in_flight = s.in_flight
    for rid in rids_of(ended).tolist():
        del in_flight[rid]
    s.ended.extend(ended)
    count_ended(field_of(ended, "group_id"), s)


def count_ended(group_ids: np.ndarray, s: StepState) -> None:
    """The rollout's counters once responses of these groups (`group_ids`, one per response) ended: in flight, done,
    and each group's members (members_ended)."""
    s.rollout.requests_in_flight -= len(group_ids)
    s.rollout.responses_done += len(group_ids)
    gids, counts = np.unique(group_ids, return_counts=True)
    gids, open_members = gids.tolist(), s.open_members
    left = [open_members[gid] - n for gid, n in zip(gids, counts.tolist())]
    open_members.update(zip(gids, left))
    done = list(itertools.compress(gids, [n == 0 for n in left]))
    if done:
        _groups_done(done, s)


def members_ended(gid: int, n: int, s: StepState) -> None:
    """`n` more members of group `gid` ended: the group is done once none is open, effective if its rewards differ."""
    s.open_members[gid] -= n
    if s.open_members[gid] == 0:
        _group_done(gid, s)


def _group_done(gid: int, s: StepState) -> None:
    """Group `gid`'s last member ended: one more group done, and effective if its rewards differ."""
    s.rollout.groups_done += 1
    members = s.members[gid]
    rewards = members.rewards() if isinstance(members, GroupRows) else [m.reward for m in members]
    if len(rewards) > 1 and max(rewards) - min(rewards) > 0:  # NaN-safe: a NaN comparison is False
        s.rollout.groups_effective += 1


def _groups_done(gids: list[int], s: StepState) -> None:
    """`_group_done` of each of groups `gids` at once: the rewards of those held as GroupRows read as arrays, a
    submission's at a time (a Python list per group cost more than the rest of a cut rollout's books of them)."""
    s.rollout.groups_done += len(gids)
    as_rows: dict[tuple[int, int], list[GroupRows]] = {}  # by submission: its groups' GroupRows
    for members in map(s.members.__getitem__, gids):
        if isinstance(members, GroupRows):
            as_rows.setdefault((id(members.requests), id(members.columns)), []).append(members)
        else:
            rewards = [m.reward for m in members]
            s.rollout.groups_effective += len(rewards) > 1 and max(rewards) - min(rewards) > 0
    for groups in as_rows.values():
        sizes = np.fromiter(map(len, groups), np.int64, len(groups))
        rewards = groups[0].requests.reward_array(np.concatenate([g.rows for g in groups]), groups[0].columns)
        s.rollout.groups_effective += count_effective(rewards, sizes)


def count_effective(rewards: np.ndarray, sizes: np.ndarray) -> int:
    """How many groups (members consecutive, `sizes` each) have rewards that differ, as `_group_done` judges each: with
    Python's max and min, which a NaN reward answers by its place in the group (with_signal's arrays where none is
    NaN)."""
    if not np.isnan(rewards).any():
        return int(with_signal(rewards, sizes).sum())
    out, at = 0, 0
    for k in sizes.tolist():
        group = rewards[at:at + k].tolist()
        out += len(group) > 1 and max(group) - min(group) > 0
        at += k
    return out


def defer_last_completed(done: list, limit: int, waiting: dict) -> list:
    """Of a step's completed groups (`done`, each its members), the `limit` that completed first, in their order; the
    others wait, whole, in `waiting` (group id -> members) for the next step, whose rollout counts them done from its
    start (lssim.loop.contracts.ModeHooks.groups_to_train: async's trainer takes batches of B)."""
    completed = [max(r.finish_time for r in members) for members in done]
    order = sorted(range(len(done)), key=completed.__getitem__)  # stable: ties in the step's group order
    keep = set(order[:limit])
    for i in order[limit:]:
        waiting[done[i][0].group_id] = done[i]
    return [members for i, members in enumerate(done) if i in keep]


def drop_stale(s: StepState, engine: Engine, mode: ModeHooks) -> int:
    """Groups the mode says would train too many versions late (async, ROLL's variant) are cancelled: their
    unfinished members end as aborted ("stale") and the group never trains; so does a group that completed whole in
    an earlier step and waited (ModeHooks.groups_to_train). Returns how many groups were dropped (no longer
    admitted)."""
    stale = [(gid, [r for r in members if not r.done]) for gid, members in s.members.items()
             if mode.is_stale(s.step, min(r.first_version for r in members))]
    waited = sum(1 for _, open_members in stale if not open_members)  # counted done from the step's start
    counters = s.rollout.groups_done - waited, s.rollout.groups_effective  # a dropped group is not a done one
    running = {r.rid for r in s.kept_in}  # generating in the engine since an earlier step
    # one call for every abort (a real engine's call into vLLM costs milliseconds; abort_many is abort in turn)
    aborted = [r for _, open_members in stale for r in open_members if r.rid in running]
    if aborted:
        engine.abort_many(aborted)
    for gid, open_members in stale:
        for r in open_members:
            r.finish_reason, r.stop_reason = ABORT, "stale"
            end_response(r, s)
        s.dropped_groups.add(gid)
    s.rollout.groups_done, s.rollout.groups_effective = counters
    return len(stale)


def rollout_batch(fresh: RequestColumns, s: StepState, engine: Engine, policy: Policy, asks: dict[str, bool],
                  top_up: Callable[[], RequestColumns | None] | None = None) -> None:
    """The batch route: the step's requests in priority order on their instances (the policy's priority and place
    hooks asked as on the event route; `asks`: which hooks the policy overrides), run to their end by the engine in
    one call, the books closed at once as `end_response` closes them one by one. `top_up`: the next requests once the
    engine has drained (None: the rollout ends), asked after every run as the event route asks the policy's top_up
    when it has no event left; each such batch runs to its end in turn (DAPO's generation batches), and the step's
    columns are their concatenation. A policy with an array form of on_finish (Policy.on_finishes) hears of each
    batch's ended responses, in the order they ended, once that batch has run."""
    state, parts, ended, offset = s.rollout, [], [], 0
    while True:
        if len(fresh):
            ended.append(_run_part(fresh, s, engine, policy, asks) + offset)
            offset += len(fresh)
        parts.append(fresh)
        state.now = engine.now()
        fresh = top_up() if top_up is not None else None
        if fresh is None:
            break
    s.batch = RequestColumns.concat(parts)
    s.groups_done = groups = s.batch_groups()
    s.batch_ended = np.concatenate(ended) if ended else np.zeros(0, np.int64)
    s.batch_signal = with_signal(s.batch.reward[groups.rows], groups.sizes)


def _run_part(fresh: RequestColumns, s: StepState, engine: Engine, policy: Policy, asks: dict[str, bool]) -> np.ndarray:
    """One submission of the batch route run to its end, its counters added to the rollout's state: the rows it
    ended, in that order."""
    queue = None  # the rows stay in plan order; the engine is told the order they are queued in
    if asks["priority"]:  # queued in priority order, as `order` submits them
        fresh.priority[:] = policy.priorities(fresh)
        queue = stable_argsort(fresh.priority)
    if asks["place"]:  # placed in the order they are queued, as `order` places them
        if queue is None:
            fresh.instance[:] = policy.placements(fresh, engine.loads())
        else:
            fresh.instance[queue] = policy.placements(TakenRows(fresh, queue), engine.loads())
    state = s.rollout
    s.batch = fresh
    groups = s.batch_groups()
    progress = None if not asks["on_progress"] else \
        policy.progress_requeues if policy.requeues_in_batches() else policy.progress_stops
    rows = engine.run_batch(fresh, queue, progress)
    state.responses_done += len(fresh)
    state.groups_submitted += len(groups)
    state.groups_done += len(groups)
    state.groups_effective += int(with_signal(fresh.reward[groups.rows], groups.sizes).sum())
    if asks["on_finish"]:
        policy.on_finishes(fresh.take(rows), state)
    return rows


def order(requests: list[Request], engine: Engine, policy: Policy, asks: dict[str, bool]) -> list[Request]:
    """The policy's priorities and placements (where it has an opinion; `asks`: which hooks it overrides); the
    requests in priority order."""
    if asks["priority"]:
        for r in requests:
            choice = policy.priority(r)
            if choice is not None:
                r.priority = choice
        requests = sorted(requests, key=lambda r: r.priority)  # placed and queued in priority order
    if asks["place"]:
        loads = engine.loads()
        for r in requests:
            choice = policy.place(r, loads)
            if choice is not None:
                r.instance = choice
    return requests
