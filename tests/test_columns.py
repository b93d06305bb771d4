"""Requests as columns (lssim.loop.columns) and the controller's array bookkeeping: they must say what the per-object
code says. The batch route's results as a whole are checked against the event route in tests/test_fastpath.py."""

from dataclasses import fields

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from lssim.loop.plan_columns import count_on
from lssim.loop.columns import (GroupBatch, RequestColumns, TakenRows, gather, prompt_ids, rid_order, runs, stable_argsort,
                           with_signal)
from lssim.loop.core import Group, Request, off_policy_tokens, token_lags


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.integers(0, 5), st.integers(0, 9), max_size=4),
       st.lists(st.tuples(st.integers(0, 5), st.integers(1, 4)), max_size=12))
def test_count_on_numbers_samples_as_a_loop_over_the_groups_does(counts, entries):
    keys = np.array([k for k, _ in entries], np.int64)
    n = np.array([m for _, m in entries], np.int64)
    expected_counts, expected = dict(counts), []
    for k, m in entries:  # the loop it replaces
        expected.append(expected_counts.get(k, 0))
        expected_counts[k] = expected[-1] + m
    got = count_on(counts, keys, n)
    assert got.tolist() == expected and counts == expected_counts


def _requests(draw_versions: list[tuple[int, int, list | None]]) -> list[Request]:
    out = []
    for i, (generated, first_version, resumes) in enumerate(draw_versions):
        r = Request(rid=i, group_id=i // 2, step=1, prompt_id=10 + i // 2, sample_idx=i % 2, prompt_len=5 + i, max_tokens=100,
                    instance=None if i % 3 else i % 2, generated=generated, first_version=first_version,
                    last_version=first_version + 1, reward=float(i % 2), finish_reason="stop" if i % 2 else "length")
        if resumes:
            r.resumes = [(v, g) for v, g in resumes if 0 < g < generated] or None
            r.tokens_before_resume = r.resumes[-1][1] if r.resumes else 0
        out.append(r)
    return out


def _every_field(r: Request) -> tuple:
    """Every field the columns hold, with its type (NaN as a word: NaN equals nothing)."""
    values = (getattr(r, f.name) for f in fields(Request) if f.name not in ("tokens", "signals"))
    return tuple(("nan" if v != v else v, type(v)) for v in values)


versions = st.lists(st.tuples(st.integers(0, 50), st.integers(-1, 3), st.none() | st.lists(
    st.tuples(st.integers(0, 4), st.integers(1, 49)), max_size=2)), min_size=1, max_size=8)


@settings(max_examples=100, deadline=None)
@given(versions, st.integers(0, 5))
def test_columns_answer_what_the_requests_answer(spec, train_step):
    requests = _requests(spec)
    for r in requests:  # resumes in increasing order of tokens, as note_resume appends them
        if r.resumes:
            r.resumes = sorted(r.resumes, key=lambda x: x[1])
    cols = RequestColumns.of(requests)
    back = cols.to_requests()
    assert [_every_field(r) for r in back] == [_every_field(r) for r in requests]
    assert [_every_field(r) for r in back[1::2]] == [_every_field(r) for r in cols.to_requests(slice(1, None, 2))]
    assert cols.off_policy_tokens(train_step).tolist() == [off_policy_tokens(r, train_step) for r in requests]
    lags: dict[int, int] = {}
    for r in requests:
        if r.resumes is None:
            if r.generated > 0:
                lags[train_step - r.first_version] = lags.get(train_step - r.first_version, 0) + r.generated
            continue
        for lag, k in token_lags(r, train_step):
            lags[lag] = lags.get(lag, 0) + k
    assert cols.token_lags(train_step) == lags
    spans = cols.version_spans()  # read once, answered alike
    assert cols.token_lags(train_step, spans) == lags
    assert cols.off_policy_tokens(train_step, spans).tolist() == cols.off_policy_tokens(train_step).tolist()


@settings(max_examples=100, deadline=None)
@given(versions, st.integers(0, 5), st.randoms(use_true_random=False))
def test_taken_rows_answer_the_version_questions_as_the_rows_taken(spec, train_step, rnd):
    cols = RequestColumns.of(_requests(spec))
    rows = np.array([rnd.randrange(len(cols)) for _ in range(rnd.randint(0, 2 * len(cols)))], np.int64)
    view, taken = TakenRows(cols, rows), cols.take(rows)
    assert [a.tolist() for a in view.version_spans()] == [a.tolist() for a in taken.version_spans()]
    assert view.off_policy_tokens(train_step).tolist() == taken.off_policy_tokens(train_step).tolist()
    assert view.token_lags(train_step) == taken.token_lags(train_step)
    assert view._whole is None  # read column by column: nothing took every column


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(1, 4), min_size=1, max_size=6), st.integers(0, 2**31))
def test_groups_over_columns_gather_as_groups_of_requests(sizes, seed):
    rng = np.random.default_rng(seed)
    total = sum(sizes)
    requests = [Request(rid=i, group_id=g, step=0, prompt_id=100 + g, sample_idx=0, prompt_len=3, max_tokens=9,
                        generated=int(rng.integers(0, 9)), reward=float(rng.integers(0, 2)))
                for g, size in enumerate(sizes) for i in [sum(sizes[:g]) + k for k in range(size)]]
    cols = RequestColumns.of(requests)
    starts = np.cumsum(sizes) - sizes
    batch = GroupBatch(cols, np.arange(total), np.array(sizes))
    objects = [Group(100 + g, 0, requests[a:a + n]) for g, (a, n) in enumerate(zip(starts, sizes))]
    for groups in (batch, list(batch), objects, objects[:1] + list(batch)[1:]):
        members, got_sizes = gather(groups)
        assert members.rid.tolist() == list(range(total)) and got_sizes.tolist() == sizes
        assert gather(groups, "generated")[0].tolist() == [r.generated for r in requests]
        assert prompt_ids(groups).tolist() == [100 + g for g in range(len(sizes))]
        assert with_signal(members.reward, got_sizes).tolist() == [g.has_signal for g in objects]
    assert [g.requests[0].rid for g in batch] == starts.tolist()  # made on demand, rows of the columns


@settings(max_examples=100, deadline=None)
@given(sizes=st.lists(st.integers(1, 5), max_size=12), made_in_order=st.booleans(), seed=st.integers(0, 2**31))
def test_a_batch_steps_groups_are_its_members_by_group_then_rid(sizes, made_in_order, seed):
    """StepState.batch_groups: rows ordered by (group, rid) and each group's size, whatever order the rows are in
    (a priority hook reorders them), for rids made group after group (plan_requests) or not."""
    from lssim.loop.core import RolloutState
    from lssim.loop.records import StepState

    rng = np.random.default_rng(seed)
    group = np.repeat(np.arange(len(sizes)) * 3 + 7, sizes)
    rid = np.arange(len(group)) + 100 if made_in_order else rng.permutation(len(group)) * 2 + 5
    shuffle = rng.permutation(len(group))
    cols = RequestColumns.planned(rid=rid[shuffle], group_id=group[shuffle], prompt_len=np.ones(len(group), np.int64))
    state = StepState(step=0, started=0.0, busy_at_start=(0.0, 0.0), rollout=RolloutState(step=0, started=0.0, now=0.0),
                      carried_in=[], batch=cols)
    groups = state.batch_groups()
    want = np.lexsort((cols.rid, cols.group_id))
    assert groups.rows.tolist() == want.tolist()
    assert groups.sizes.tolist() == np.unique(cols.group_id, return_counts=True)[1].tolist()


@settings(max_examples=300, deadline=None)
@given(n=st.integers(0, 60), first=st.integers(-5, 10**12), shape=st.sampled_from(["sorted", "permuted", "gap", "repeat"]),
       seed=st.integers(0, 2**31 - 1))
def test_rid_order_is_a_stable_argsort(n, first, shape, seed):
    """rid_order's scatter (rids that cover one range, in any order) and its fall-backs give np.argsort's stable
    order, for rids sorted, permuted, with a gap, or repeated."""
    rng = np.random.default_rng(seed)
    rid = first + np.arange(n, dtype=np.int64)
    if shape != "sorted":
        rid = rng.permutation(rid)
    if shape == "gap" and n:
        rid[rng.integers(n)] += n  # one range no more: sorted the usual way
    if shape == "repeat" and n > 1:
        rid[rng.integers(n)] = rid[rng.integers(n)]  # a hole and a repeat: every place no longer filled once
    np.testing.assert_array_equal(rid_order(rid), np.argsort(rid, kind="stable"))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(-2**40, 2**40), max_size=60), st.sampled_from([1, 3, 70_000, 2**41]))
def test_stable_argsort_and_runs_are_numpys(values, span):
    v = np.array(values, np.int64) % span  # small ranges take the radix sort, large ones numpy's own
    assert stable_argsort(v).tolist() == np.argsort(v, kind="stable").tolist()
    ordered = np.sort(v)
    starts, sizes = runs(ordered)
    want = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]]) if len(v) else np.zeros(0, np.int64)
    assert starts.tolist() == want.tolist() and sizes.tolist() == np.diff(np.r_[want, len(v)]).astype(int).tolist()


def test_taken_rows_read_as_the_take_they_stand_for():
    cols = RequestColumns.planned(rid=np.arange(5), group_id=np.arange(5), prompt_id=np.arange(10, 15), prompt_len=np.full(5, 3))
    rows = np.array([4, 0, 2])
    view, taken = TakenRows(cols, rows), cols.take(rows)
    assert len(view) == 3 and view.rid.tolist() == [4, 0, 2] and view.prompt_id.tolist() == taken.prompt_id.tolist()
    assert [r.rid for r in view.to_requests()] == [4, 0, 2]  # a method takes every column first


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(versions, st.none() | st.lists(st.integers(0, 7), max_size=6), st.booleans()), min_size=1, max_size=4))
def test_concat_taken_is_the_concatenation_of_the_takes(parts_spec):
    parts = []
    for spec, rows, planned in parts_spec:  # some parts made as planned (no resumes, other dtypes where empty)
        cols = RequestColumns.of(_requests(spec)) if not planned else RequestColumns.planned(
            rid=np.arange(len(spec)), prompt_len=np.full(len(spec), 4))
        parts.append((cols, None if rows is None else np.array([r % len(cols) for r in rows], np.int64)))
    got = RequestColumns.concat_taken(parts)
    want = RequestColumns.concat([c if rows is None else c.take(rows) for c, rows in parts])
    for f in fields(RequestColumns):
        a, b = getattr(got, f.name), getattr(want, f.name)
        assert (a is None) == (b is None), f.name
        if a is not None:
            assert a.dtype == b.dtype and [_same(x) for x in a.tolist()] == [_same(x) for x in b.tolist()], f.name


def _same(value):
    return "nan" if value != value else value
