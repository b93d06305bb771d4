"""on_unfinished's array form (Policy.on_unfinished_rows): the responses still running at a cut settled as rows
(lssim.loop.cut_books.settle_rows), or one by one as objects where a policy judges them so; the frames equal the event
engine's either way."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import test_fastpath
from lssim.loop.columns import RequestColumns
from lssim.loop.core import Request
from lssim.loop.decisions import CARRY
from lssim.loop.policy import make_policy
from lssim.loop.row_requests import LeftOpenRows, RowRequests
from policies.april import APRIL
from test_fastpath import ROOFLINE, make_trace, run
from test_fastpath_carry import assert_same_cut_run


class CountingAPRIL(APRIL):
    """april with an on_unfinished of its own (and no array form of it): judged one by one."""

    calls = 0

    def on_unfinished(self, request):
        CountingAPRIL.calls += 1
        return super().on_unfinished(request)


def rows_of(rids: list[int]) -> RequestColumns:
    n = len(rids)
    return RequestColumns.planned(rid=np.array(rids, np.int64), group_id=np.arange(n), step=np.zeros(n, np.int64),
                                  prompt_id=np.zeros(n, np.int64), sample_idx=np.zeros(n, np.int64),
                                  prompt_len=np.ones(n, np.int64), max_tokens=np.full(n, 9), seed=np.zeros(n, np.int64))


def test_a_policy_answers_on_unfinished_as_rows_only_where_its_own_class_gives_the_array_form():
    assert make_policy("april").unfinished_in_batches()
    assert make_policy("rollpacker+april").unfinished_in_batches()
    assert not CountingAPRIL().unfinished_in_batches()
    assert make_policy("rollpacker").unfinished_in_batches()  # (no on_unfinished: every one dropped)


@settings(max_examples=80, deadline=None)
@given(rounds=st.lists(st.lists(st.integers(0, 30), unique=True), max_size=6), max_carry=st.sampled_from([None, 1, 2, 3]),
       finished=st.lists(st.integers(0, 30), unique=True))
def test_april_carries_rows_as_it_carries_each_object(rounds, max_carry, finished):
    by_rows, one_by_one = APRIL(max_carry_steps=max_carry), APRIL(max_carry_steps=max_carry)
    for rids in rounds:
        assert by_rows.on_unfinished_rows(rows_of(rids)).tolist() == [True] * len(rids)
        assert [one_by_one.on_unfinished(Request(rid, 0, 0, 0, 0, 1, 9)) for rid in rids] == [CARRY] * len(rids)
    by_rows.on_finishes(rows_of(finished), None)
    for rid in finished:
        one_by_one.on_finish(Request(rid, 0, 0, 0, 0, 1, 9), None)
    assert list(by_rows._carries.items()) == list(one_by_one._carries.items())
    assert by_rows._must_finish == one_by_one._must_finish


def test_the_rows_left_open_are_read_only_where_the_policy_reads_them(monkeypatch):
    columns = rows_of([3, 5, 8])
    requests = RowRequests(columns.copy(), [], filled=columns)
    rows, read = np.array([0, 2], np.int64), []
    left_open = RowRequests.left_open
    monkeypatch.setattr(RowRequests, "left_open", lambda self, *args: read.append(args) or left_open(self, *args))
    assert APRIL().on_unfinished_rows(LeftOpenRows(requests, rows, columns)).tolist() == [True, True]
    assert read == []  # unbounded: it asks how many, never a column
    view = LeftOpenRows(requests, rows, columns)
    assert APRIL(max_carry_steps=2).on_unfinished_rows(view).tolist() == [True, True]
    assert view.rid.tolist() == [3, 8] and view.generated.tolist() == left_open(requests, rows, columns).generated.tolist()
    assert len(read) == 1  # read once, when first asked


def test_april_settles_the_cut_as_rows_and_a_policy_that_judges_each_as_objects(monkeypatch):
    """april's on_unfinished is never asked on the cut route (its array form is); a subclass's own on_unfinished is
    asked of each response running at a cut; both runs equal the event engine's."""
    trace = make_trace(np.random.default_rng(11), 4, 6, 4, 300)
    asked = []
    monkeypatch.setattr(APRIL, "on_unfinished", lambda self, r: asked.append(r.rid) or CARRY)
    run(trace, "april(max_carry_steps=2)", ROOFLINE, 2, 4, 100_000, "collocated", batch_route=True)
    assert asked == []
    monkeypatch.undo()
    assert_same_cut_run(trace, "april(max_carry_steps=2)", ROOFLINE, 2, 4, 100_000)

    monkeypatch.setattr(test_fastpath, "make_policy", lambda spec: CountingAPRIL(max_carry_steps=2))
    CountingAPRIL.calls = 0
    run(trace, "counting", ROOFLINE, 2, 4, 100_000, "collocated", batch_route=True)
    assert CountingAPRIL.calls > 0
    assert_same_cut_run(trace, "counting", ROOFLINE, 2, 4, 100_000)


@pytest.mark.parametrize("policy", ["rollpacker", "rollpacker(ratio=2.0)"])
def test_a_policy_without_on_unfinished_drops_the_cut_rows_as_the_event_engine_does(policy):
    trace = make_trace(np.random.default_rng(12), 4, 6, 4, 300)
    assert_same_cut_run(trace, policy, ROOFLINE, 2, 4, 100_000)
