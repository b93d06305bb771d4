"""rollpacker's array forms (policies/rollpacker.py) against its per-response hooks and its rule.

on_finishes, told of a rollout's finished responses in chunks, must leave the policy as on_finish told of each in
turn does; end_rollout_at must name the boundary where end_rollout first says the round ends; and select, over rows of
a step's columns (the cut route's closed columns) or over Request objects, must train what the rule says: each group
with n finished responses on its first n to finish, the target's first groups to complete, the others' prompts queued.
"""

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from lssim.loop.columns import GroupBatch, RequestColumns
from lssim.loop.core import ABORT, LENGTH, POLICY_STOP, STOP, Group, GroupSpec, PromptPool, RolloutState, StepContext
from lssim.loop.rollout_cut import RolloutProgress
from policies.rollpacker import RollPacker

FINISHED = (STOP, LENGTH, POLICY_STOP)


@st.composite
def rounds(draw):
    """A short round: its proposal (prompt, n) and ratio, each planned row's ending (a finish reason; None: still
    running when the round is settled), the order they end in, the finish times' steps and the boundaries."""
    proposal = draw(st.lists(st.tuples(st.integers(0, 7), st.integers(1, 4)), min_size=1, max_size=6))
    ratio = draw(st.sampled_from([1.0, 1.25, 2.0]))
    rows = sum(math.ceil(ratio * n) for _, n in proposal)
    reasons = draw(st.lists(st.sampled_from(FINISHED + (ABORT, None)), min_size=rows, max_size=rows))
    order = draw(st.permutations(range(rows)))
    steps = draw(st.lists(st.sampled_from([0.0, 0.5, 1.0]), min_size=rows, max_size=rows))  # 0: a tie
    cuts = draw(st.lists(st.integers(1, rows), max_size=4))
    rid_base = draw(st.sampled_from([0, 1000]))
    return proposal, ratio, reasons, order, steps, cuts, rid_base


def planned_round(proposal, ratio, reasons, order, steps, rid_base):
    """A policy that planned the round, the round's rows as columns (every row ended: the unfinished aborted), and
    the rows that ended in the rollout, in the order they ended."""
    policy = RollPacker(ratio)
    ctx = StepContext(0, len(proposal), 4, 1000, 10**6, 0, PromptPool(np.arange(8), np.full(8, 10, np.int64)),
                      np.random.default_rng(0))
    plan = policy.plan(ctx, [GroupSpec(p, n, 1000) for p, n in proposal])
    sizes = np.array([g.n_samples for g in plan])
    n = int(sizes.sum())
    columns = RequestColumns.planned(rid=rid_base + np.arange(n)[::-1], group_id=np.repeat(np.arange(len(plan)) + 10, sizes),
                                     step=np.zeros(n, np.int64), prompt_id=np.repeat([g.prompt_id for g in plan], sizes),
                                     prompt_len=np.full(n, 10), max_tokens=np.full(n, 1000))
    ended = np.array([i for i in order if reasons[i] is not None], np.int64)
    columns.finish_reason[:] = [ABORT if r is None else r for r in reasons]
    columns.finish_time[ended] = np.cumsum(np.asarray(steps, float)[:len(ended)])
    columns.generated[:] = 5
    return policy, columns, ended, sizes


def group_rows(sizes):
    starts = np.cumsum(sizes) - sizes
    return [np.arange(a, a + k) for a, k in zip(starts.tolist(), sizes.tolist())]


def expected_selection(proposal, columns, ended, sizes, target=-1):
    """The rule, written out: (rids of each trained group, in finishing order; the prompts queued, in group order).
    `target`: groups trained at most (-1: the proposal's; None: every complete one)."""
    needed = dict(proposal)  # (a prompt planned twice: its last n, as plan keeps it)
    finished = [i for i in ended.tolist() if columns.finish_reason[i] in FINISHED]
    complete, queued = [], []
    for rows in group_rows(sizes):
        pid = int(columns.prompt_id[rows[0]])
        done = [i for i in finished if i in set(rows.tolist())]
        n = needed[pid]
        if len(done) >= n:
            complete.append((columns.finish_time[done[n - 1]], columns.rid[done[:n]].tolist()))
        elif pid not in queued:
            queued.append(pid)
    complete.sort(key=lambda item: item[0])
    return [rids for _, rids in complete[:len(proposal) if target == -1 else target]], queued


def chunks(ended, cuts):
    bounds = sorted({c for c in cuts if c < len(ended)} | {len(ended)})
    return [ended[a:b] for a, b in zip([0] + bounds[:-1], bounds)] if len(ended) else []


@settings(max_examples=300, deadline=None)
@given(rounds())
def test_on_finishes_in_chunks_leaves_the_policy_as_on_finish_one_by_one(case):
    proposal, ratio, reasons, order, steps, cuts, rid_base = case
    one, columns, ended, sizes = planned_round(proposal, ratio, reasons, order, steps, rid_base)
    many, both = (planned_round(proposal, ratio, reasons, order, steps, rid_base)[0] for _ in range(2))
    objects = columns.to_requests()
    state, heard = RolloutState(0, 0.0), []
    for part in chunks(ended, cuts):
        for i in part.tolist():
            one.on_finish(objects[i], state)
        many.on_finishes(columns.take(part), state)
        both.on_finishes(columns.take(part), state)
        heard += part.tolist()
        ends = len(expected_selection(proposal, columns, np.array(heard, np.int64), sizes, target=None)[0]) >= len(proposal)
        assert many.end_rollout(state) == one.end_rollout(state) == ends  # the target's groups complete
    by_objects = one.select([Group(int(columns.prompt_id[r[0]]), 0, [objects[i] for i in r.tolist()])
                             for r in group_rows(sizes)], 0)
    by_rows = many.select([Group(int(columns.prompt_id[r[0]]), 0, columns=columns, rows=r) for r in group_rows(sizes)], 0)
    trained, queued = expected_selection(proposal, columns, ended, sizes)
    assert [g.column("rid").tolist() for g in by_objects] == trained
    assert [g.column("rid").tolist() for g in by_rows] == trained
    assert isinstance(by_rows, GroupBatch) and by_rows.columns is columns  # over the rows: no object made
    assert all(g.held is None for g in by_rows)
    # groups of objects and rows (the event route's, a real engine's): over the rows, each holding its objects still
    by_both = both.select([Group(int(columns.prompt_id[r[0]]), 0, [objects[i] for i in r.tolist()], columns=columns, rows=r)
                           for r in group_rows(sizes)], 0)
    assert isinstance(by_both, GroupBatch) and [g.column("rid").tolist() for g in by_both] == trained
    assert all(r is objects[i] for g in by_both for r, i in zip(g.held, g.rows.tolist()))
    assert one.long_queue == many.long_queue == queued
    assert one.deferred == many.deferred == [(0, p) for p in queued]


@settings(max_examples=300, deadline=None)
@given(rounds())
def test_end_rollout_at_is_the_first_boundary_where_end_rollout_says_the_round_ends(case):
    proposal, ratio, reasons, order, steps, cuts, rid_base = case
    one, columns, ended, _ = planned_round(proposal, ratio, reasons, order, steps, rid_base)
    whole = planned_round(proposal, ratio, reasons, order, steps, rid_base)[0]
    objects, state = columns.to_requests(), RolloutState(0, 0.0)
    parts = chunks(ended, cuts)
    expected = -1
    for b, part in enumerate(parts):
        for i in part.tolist():
            one.on_finish(objects[i], state)
        if one.end_rollout(state):
            expected = b
            break
    boundary_end = np.cumsum([len(p) for p in parts]).astype(np.int64)
    progress = RolloutProgress(columns.take(ended), boundary_end, np.zeros(len(parts), np.int64),
                               columns.finish_time[boundary_end - 1] if len(parts) else np.zeros(0))
    assert whole.end_rollout_at(progress) == expected


def test_a_long_round_trains_its_groups_as_given_and_hears_nothing():
    policy = RollPacker()
    policy.long_queue = [3, 4]
    ctx = StepContext(5, 2, 4, 1000, 10**6, 0, PromptPool(np.arange(8), np.full(8, 10, np.int64)), np.random.default_rng(0))
    assert [(g.prompt_id, g.n_samples) for g in policy.plan(ctx, [GroupSpec(1, 4, 1000)] * 2)] == [(3, 4), (4, 4)]
    columns = RequestColumns.planned(rid=np.arange(8), group_id=np.repeat([0, 1], 4), prompt_id=np.repeat([3, 4], 4),
                                     prompt_len=np.full(8, 10))
    columns.finish_reason[:] = STOP
    policy.on_finishes(columns, RolloutState(5, 0.0))
    assert not policy.end_rollout(RolloutState(5, 0.0))  # a long round waits for all of its responses
    groups = [Group(3, 5, columns=columns, rows=np.arange(4)), Group(4, 5, columns=columns, rows=np.arange(4, 8))]
    assert policy.select(groups, 5) is groups and policy.long_rounds == [(5, [3, 4])]
