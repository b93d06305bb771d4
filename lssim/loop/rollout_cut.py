"""Where a rollout with an end_rollout rule ends, read from a submission's whole schedule (the batch route's first
half for april and rollpacker).

The event route asks `end_rollout` after each boundary at which responses ended (one instance's finishes at one
time, lssim.sim.world.SimEngine.next_events), with the rollout's counters as they stand then. Run to its end on the
batch route (lssim.sim.fastsim.run_batch_boundaries), a submission's rows come back in the order the event engine
ends them, each with the boundary that ended it and the engine's clock then, and the counters after each boundary are
a cumulative count. `RolloutProgress` holds them; a policy's array form of end_rollout
(`Policy.end_rollout_at`) answers the first boundary at which its rule holds, and the rollout is cut there.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lssim.loop.columns import RequestColumns, TakenRows


@dataclass(frozen=True, slots=True)
class RolloutProgress:
    """The rollout's counters after each boundary at which responses ended, in the order the event engine pops them.

    `ended`: the responses that ended, in that order (their columns, each read when a rule first asks:
    lssim.loop.columns.TakenRows); `boundary_end[b]`: how many of them had ended after boundary b (so boundary b ended
    `ended[boundary_end[b - 1]:boundary_end[b]]`); `groups_done[b]`: groups whose every member had ended then
    (RolloutState.groups_done); `time[b]`: the boundary's time (RolloutState.now)."""

    ended: RequestColumns | TakenRows
    boundary_end: np.ndarray
    groups_done: np.ndarray
    time: np.ndarray

    def __len__(self) -> int:
        return len(self.boundary_end)

    def ended_by(self, rids: np.ndarray) -> np.ndarray:
        """How many of `rids` had ended after each boundary."""
        at = np.flatnonzero(np.isin(self.ended.rid, rids))
        return np.searchsorted(at, self.boundary_end, side="left")


def rollout_progress(requests: RequestColumns, ended_rows: np.ndarray, boundary: np.ndarray, clock: np.ndarray,
                     groups_done_before: int = 0) -> RolloutProgress:
    """The counters of a submission run to its end (lssim.sim.fastsim.run_batch_boundaries: its rows in the order they
    ended, the boundary that ended each, in popping order, and the engine's clock then). A group is done once every one
    of its rows in the submission has ended (a carried group's members that ended in an earlier step are not
    resubmitted); `groups_done_before`: groups done before it."""
    if len(ended_rows) == 0:
        empty = np.zeros(0, np.int64)
        return RolloutProgress(requests.take(ended_rows), empty, empty, np.zeros(0))
    position = np.full(len(requests), len(requests), np.int64)  # past every finish: never ended
    position[ended_rows] = np.arange(len(ended_rows))
    _, group = np.unique(requests.group_id, return_inverse=True)
    last = np.full(group.max() + 1, -1, np.int64)
    np.maximum.at(last, group, position)
    completed = np.sort(last[last < len(requests)])  # each done group's last finish
    starts = np.flatnonzero(np.r_[True, boundary[1:] != boundary[:-1]])
    boundary_end = np.r_[starts[1:], len(ended_rows)]
    groups_done = groups_done_before + np.searchsorted(completed, boundary_end, side="left")
    return RolloutProgress(TakenRows(requests, ended_rows), boundary_end, groups_done, clock[starts])
