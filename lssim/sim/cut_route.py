"""The cut route: a rollout that an end_rollout rule ends early (april, rollpacker), scheduled whole and cut.

The controller keeps the event route's books (lssim.loop.cut_books: on_finish per response, on_unfinished and the
engine's aborts for what still runs), with Request objects only where they are read; only the engine's work changes.
Its submission is scheduled whole on the
batch route's kernels (lssim.sim.fastsim.schedule), the policy's array form of end_rollout (Policy.end_rollout_at)
reads the schedule's boundaries (lssim.loop.rollout_cut) and names the one the event route would end at, and the engine
is held as the event engine stands right after that boundary (lssim.sim.cut_aborts.HeldCut, arrays): each instance's
clocks summed over the records it had popped by then (the batch route's own kernel, over those records only), its
running sequences with the iteration and tokens they were admitted at, its queue. The controller then aborts what
still runs (SimEngine.abort_many): on those arrays in one kernel, operation for operation as the event engine aborts
(catch-up, departures, admissions of the queue, their prefill and first tokens), or, for any other command, on the
event engine's heaps built from them. A schedule that preempts, or an engine that speculates, is left to the event
engine (nothing was run).
"""

from __future__ import annotations

import numpy as np

from lssim.loop.columns import RequestColumns
from lssim.loop.rollout_cut import rollout_progress
from lssim.sim.cut_aborts import HeldCut
from lssim.sim.fastsim import Schedule, commit, count_sources, fill, schedule
from lssim.sim.fastsim_kernels import _START, instance_clocks


def run_cut(engine, requests, columns: RequestColumns, cut_at) -> np.ndarray | None:
    """Run the submission (`columns`, in the order it is queued, filled here as the batch route fills them; `requests`:
    its lssim.loop.cut_books.RowRequests, each object made when the engine needs it) on the idle engine until the
    boundary `cut_at` (Policy.end_rollout_at, asked with the schedule's lssim.loop.rollout_cut.RolloutProgress) names,
    or to their end; the rows ended by then, in the order the event engine ends them. The others are in flight in the
    engine, as in the event engine at that boundary, their objects made and filled as it fills them (and every object
    made before). None: left to the event engine (nothing ran)."""
    if len(columns) != len(requests):
        raise ValueError(f"run_cut: {len(requests)} requests but {len(columns)} rows of columns")
    if engine._spec_batch or not len(requests):
        return None
    plan = schedule(engine, columns)
    if plan.preemptions:
        return None
    rows, boundary, clock = fill(engine, columns, plan)
    progress = rollout_progress(columns, rows, boundary, clock)
    cut = cut_at(progress)
    remember_answers(engine, columns, plan)
    if cut < 0 or progress.boundary_end[cut] == len(requests):  # the event route asks only while some still run
        commit(engine, plan)
        fill_requests(requests, columns, plan, rows, np.ones(len(requests), bool))
        return rows
    ended = rows[:progress.boundary_end[cut]]
    _hold_at(engine, requests, columns, plan, ended, int(boundary[len(ended) - 1]))
    engine.clock = max(plan.now, float(progress.time[cut]))
    return ended


def remember_answers(engine, columns: RequestColumns, plan: Schedule) -> None:
    """The Workload's answers where SimEngine.submit keeps them (its aborts and re-admissions, the books' counterfactual
    and score_partial read them), by the rids of the submission's columns, as arrays (lssim.sim.answers.Answers); the
    sources of those asked for the first time counted as SimEngine.submit counts them (a carried response was asked
    when first submitted)."""
    first_asked = ~engine._target.known(columns.rid)
    count_sources(engine, plan.answers[5][first_asked])
    length, reason, reward, _, trace_row = plan.answers[:5]
    engine._target.remember(columns.rid, length, reason, reward, trace_row)


def fill_requests(requests, columns: RequestColumns, plan: Schedule, ended: np.ndarray, admitted: np.ndarray) -> None:
    """The Request objects made so far (lssim.loop.cut_books.RowRequests.made) as the event engine leaves them: every
    one submitted (instance, submit time, exact, first token if admitted), the ended ones finished (tokens, reason,
    reward, finish time). (An object made later from the filled columns holds the same.)"""
    rows, objects = requests.made()
    first_token = np.full(len(rows), np.nan)
    first_token[admitted[rows]] = plan.clocks[2][plan.records[15][rows[admitted[rows]]]]
    now = plan.now
    for r, inst, exact, first in zip(objects, plan.inst[rows].tolist(), columns.exact[rows].tolist(), first_token.tolist()):
        r.ran_on, r.submit_time, r.exact, r.first_token_time = inst, now, exact, first
    done = np.zeros(len(columns), bool)
    done[ended] = True
    finished = rows[done[rows]]
    for r, generated, reason, reward, finish in zip(requests.make(finished), columns.generated[finished].tolist(),
                                                    columns.finish_reason[finished].tolist(), columns.reward[finished].tolist(),
                                                    columns.finish_time[finished].tolist()):
        r.generated, r.finish_reason, r.reward, r.finish_time = generated, reason, reward, finish


def _hold_at(engine, requests, columns: RequestColumns, plan: Schedule, ended: np.ndarray, last_popped: int) -> None:
    """Every instance the submission reached as the event engine leaves it right after popping boundary number
    `last_popped` (`ended`: the rows ended by then), held as arrays until the controller aborts what is in flight
    (SimEngine.hold_cut, HeldCut); the objects made before filled (fill_requests), those in flight made filled."""
    kind, rinst, rn, rctx, rk, rleft, rbefore, rnafter, rpf, ran, ractx = plan.records[:11]
    fin_rec, first_rec = plan.records[14], plan.records[15]
    processed = kind == _START  # each instance's first admission, at submission
    processed[plan.popped[:last_popped + 1]] = True
    sel = np.flatnonzero(processed)
    span, prefill, first_decode, departure = plan.priced
    t0 = np.array([max(x.t, plan.now) for x in engine.instances])
    busy0 = np.array([x.busy for x in engine.instances])
    seqs0 = np.array([x.seq_seconds for x in engine.instances])
    _, _, _, t, busy, seqs, owed = instance_clocks(kind[sel], rinst[sel], rn[sel], rk[sel], rleft[sel], rnafter[sel],
                                                   rpf[sel], span[sel], prefill[sel], first_decode[sel], departure[sel],
                                                   t0, busy0, seqs0)
    iterations = np.cumsum(np.maximum(rk, 0))  # records are grouped by instance, each group opened by its _START
    block = np.maximum.accumulate(np.where(kind == _START, np.arange(len(kind)), 0))
    at_it = iterations - iterations[block]
    last = np.full(engine.n_instances, -1, np.int64)
    np.maximum.at(last, rinst[sel], sel)
    admitted = first_rec <= last[plan.inst]
    running = admitted & (fin_rec > last[plan.inst])
    reached = np.flatnonzero(last >= 0)
    rec = last[reached]
    ints = np.zeros((engine.n_instances, 5), np.int64)
    departed = (rleft[rec] > 0) & (rnafter[rec] > 0)
    ints[reached] = np.stack([at_it[rec], ran[rec], ractx[rec], np.where(departed, at_it[rec], -1),
                              np.where(departed, rbefore[rec] + rleft[rec], 0)], axis=1)
    fill_requests(requests, columns, plan, ended, admitted)
    in_flight = plan.order[(running | ~admitted)[plan.order]]  # by instance, in the order each admits them
    admit_it = np.where(running[in_flight], at_it[first_rec[in_flight]], -1)
    _hold_rows(requests, columns, plan, in_flight[~requests.has(in_flight)], admitted)
    submitted = requests.submitted
    held = HeldCut(reached, np.stack([t, busy, seqs, owed], axis=1), ints,
                   np.searchsorted(plan.inst[in_flight], np.arange(engine.n_instances + 1)), requests, in_flight,
                   submitted.rid[in_flight], submitted.prompt_len[in_flight], plan.answers[0][in_flight],
                   plan.start_gen[in_flight], admit_it)
    engine.hold_cut(held)


def _hold_rows(requests, columns: RequestColumns, plan: Schedule, rows: np.ndarray, admitted: np.ndarray) -> None:
    """`rows` (in flight at the cut, no object made) filled back to what fill_requests fills in an object that did
    not end: as submitted, with its instance, submit time, exactness (as filled) and first token (NaN where not
    admitted); their objects are made from there (RowRequests.hold)."""
    submitted = requests.submitted
    for name in ("generated", "reward", "finish_time", "finish_reason", "stop_reason"):
        getattr(columns, name)[rows] = getattr(submitted, name)[rows]
    first_token = np.full(len(rows), np.nan)
    ran = admitted[rows]
    first_token[ran] = plan.clocks[2][plan.records[15][rows[ran]]]
    columns.first_token_time[rows] = first_token
    requests.hold(rows)
