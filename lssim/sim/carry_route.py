"""The carry route: a rollout whose only reaction to single events is carrying responses at progress checkpoints
(segment's window), scheduled whole on the batch route's kernels.

A carry is, to the engine, exactly what a stop is: the controller aborts the response right after the checkpoint's
boundary was handled (SimEngine.abort), and it leaves with the tokens it has. Where the rule reads only each response's
own tokens and a state that moves between rollouts (Policy.progress_carries), where each response is carried is
known before the rollout is scheduled, so lssim.sim.event_kernels.schedule_stops schedules the submission with the
carries as its stops (every checkpoint a boundary, as in the event engine). What differs is the books, which the
controller keeps as on the event route (lssim.loop.cut_books): a carried response is paused, not
ended; its group stays open; it is resubmitted first next step with its tokens, re-prefilled (the same schedule then
starts its checkpoints after what it had, at multiples of its total tokens). Nothing runs on after the last response
ended or was carried, so the engine is left idle, as the batch route leaves it.

Left to the event engine (nothing ran): an engine that speculates, and aborts that cost the caller time
(cost.abort_time > 0: the clock moves under the other instances). A schedule that preempts is exact here (the stops'
kernel follows preemption; no engine is rebuilt mid-rollout, unlike the cut route).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from lssim.loop.columns import RequestColumns
from lssim.sim.cut_route import fill_requests, remember_answers
from lssim.sim.fastsim import commit, fill, schedule


def run_carried(engine, requests, columns: RequestColumns, carry_at) -> np.ndarray | None:
    """Run the submission (`columns`, in the order it is queued, filled here as the batch route fills them; `requests`:
    its lssim.loop.cut_books.RowRequests) on the idle engine, each carried where `carry_at` (Policy.progress_carries,
    asked with the submission's lssim.sim.checkpoints.Checkpoints) says, until every one ended or was carried. Returns
    the rows in the order the event engine's rollout sees them leave; a carried one is not ended: its row (and its
    object, where one was made) holds the tokens it has and the carry's reason as its stop_reason (and every object
    made before is filled as the event engine fills it). None: left to the event engine."""
    if len(columns) != len(requests):
        raise ValueError(f"run_carried: {len(requests)} requests but {len(columns)} rows of columns")
    if engine._spec_batch or not len(requests) or engine.cost.abort_time(1) != 0.0:
        return None
    plan = schedule(engine, columns, None, carry_at)
    remember_answers(engine, columns, plan)
    commit(engine, plan)
    carries = plan.stops
    rows = fill(engine, columns, replace(plan, stops=None))[0]  # a carry is no stop in the books: filled below
    carried = np.flatnonzero(np.zeros(len(requests), bool) if carries is None else carries.at >= 0)
    fill_requests(requests, columns, plan, rows[~np.isin(rows, carried)], np.ones(len(requests), bool))
    if len(carried):
        _note_carries(requests, columns, plan, carried, carries.reason[carried])
    return rows


def _note_carries(requests, columns: RequestColumns, plan, carried: np.ndarray, reasons: np.ndarray) -> None:
    """The `carried` rows as the event engine leaves a carried response (paused with the tokens it has, the carry's
    reason as its stop_reason, not ended): their filled columns hold it (fill wrote their tokens and first token, as
    of a stop; what it wrote of an end put back as submitted), and so does each object made before; no object is made
    (RowRequests.carry)."""
    submitted = requests.submitted
    for name in ("finish_reason", "reward", "finish_time"):
        getattr(columns, name)[carried] = getattr(submitted, name)[carried]
    columns.stop_reason[carried] = reasons
    for r, generated, reason in zip(requests.objects_of(carried), columns.generated[carried].tolist(), reasons.tolist()):
        if r is not None:
            r.generated, r.stop_reason = generated, reason
    requests.carry(carried)
