"""lssim.loop.cut_books: the cut and carry routes' books make a Request object only where one is read.

RowRequests hands the engine each row's object, made once from the columns as submitted (the engine fills the columns
in place) or the one given; the books then keep a group whose every member ended in the rollout as rows of the
submission, and its frames equal the event engine's (tests/test_fastpath_carry.py, test_fastpath_segment.py).
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lssim.loop.cut_books as cut_books
from lssim.loop.columns import RequestColumns
from lssim.loop.core import STOP, Request
from test_fastpath import ROOFLINE, make_trace
from test_fastpath_segment import assert_same_carried_run
from test_fastpath_carry import assert_same_cut_run

ROWS = ("rid", "group_id", "prompt_id", "prompt_len", "max_tokens", "generated", "seed")


def planned(n: int, seed: int) -> RequestColumns:
    rng = np.random.default_rng(seed)
    return RequestColumns.planned(rid=np.arange(100, 100 + n), group_id=np.arange(n) // 3, step=np.zeros(n, np.int64),
                                  prompt_id=rng.integers(0, 50, n), sample_idx=np.arange(n) % 3,
                                  prompt_len=rng.integers(1, 90, n), max_tokens=np.full(n, 300),
                                  seed=rng.integers(0, 99, n))


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 12), given_count=st.integers(0, 12), seed=st.integers(0, 2**16), data=st.data())
def test_each_row_has_one_object_made_from_the_columns_as_submitted(n, given_count, seed, data):
    columns = planned(n, seed)
    k = min(given_count, n)
    given_objects = columns.to_requests(np.arange(k))
    requests = cut_books.RowRequests(columns.take(np.arange(n)), given_objects)
    columns.generated[:], columns.finish_reason[:] = 77, STOP  # the engine fills the columns in place afterwards
    rows = np.array(data.draw(st.lists(st.integers(0, n - 1), max_size=2 * n)), np.int64)
    made = requests.make(rows)
    assert all(r is given_objects[i] for r, i in zip(made, rows.tolist()) if i < k)
    for r, i in zip(made, rows.tolist()):
        assert [getattr(r, name) for name in ROWS] == [int(getattr(columns, name)[i]) if name != "generated" else 0
                                                       for name in ROWS]
        assert r.finish_reason == ""  # as submitted, not as filled
    again = requests.make(rows)
    assert all(a is b for a, b in zip(made, again))  # made once
    have, objects = requests.made()
    assert have.tolist() == sorted(set(range(k)) | set(rows.tolist()))
    assert [r.rid for r in objects] == (100 + have).tolist()
    if objects:
        objects[0].finish_reason = STOP  # ended: no longer open
    assert requests.open(np.arange(n)).tolist() == [i in set(have.tolist()[1:]) for i in range(n)]


def test_rows_given_without_columns_for_them_are_refused():
    columns = planned(2, 0)
    with pytest.raises(ValueError, match="3 requests given for 2 rows"):
        cut_books.RowRequests(columns, columns.to_requests() + [Request(0, 0, 0, 0, 0, 1, 1)])


@pytest.mark.parametrize("policy", ["segment(window=128, extend=0.5)", "april(max_carry_steps=2)"])
def test_groups_that_end_whole_in_the_rollout_are_booked_as_rows(monkeypatch, policy):
    """Most of a step's groups end whole in its rollout and get no object, nor do the carried responses (rows across
    steps: segment's carried mid-rollout, april's running at the cut and carried by on_unfinished's array form); the
    frames equal the event engine's."""
    made, rows_only = [], []
    book = cut_books._book_rows

    def counted(left, requests, columns, n_carried, s, policy_, asks):
        book(left, requests, columns, n_carried, s, policy_, asks)
        made.append(len(requests.made()[0]))
        rows_only.append(s.fresh_rows_only)

    monkeypatch.setattr(cut_books, "_book_rows", counted)
    trace = make_trace(np.random.default_rng(5), 4, 6, 4, 300)
    if policy.startswith("segment"):
        assert_same_carried_run(trace, policy, ROOFLINE, 2, 4, 100_000)
    else:
        assert_same_cut_run(trace, policy, ROOFLINE, 2, 4, 100_000)
    assert len(made) >= 3 and sum(rows_only) > 0 and sum(made) == 0


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 12), seed=st.integers(0, 2**16), data=st.data())
def test_a_group_held_as_rows_reads_its_open_members_objects_and_the_others_rows(n, seed, data):
    columns = planned(n, seed)
    requests = cut_books.RowRequests(columns.take(np.arange(n)), [])
    columns.reward[:] = np.random.default_rng(seed).random(n)  # the engine fills the columns in place
    columns.finish_reason[:] = STOP
    open_rows = np.array(sorted(data.draw(st.sets(st.integers(0, n - 1)))), np.int64)
    for r in requests.make(open_rows):  # an open member's object, filled as it runs on in a later step
        r.reward = -1.0 - r.rid
    members = np.array(data.draw(st.permutations(range(n))), np.int64)[:data.draw(st.integers(1, n))]
    group = cut_books.GroupRows(requests, columns, members)
    expected = [-1.0 - int(columns.rid[i]) if i in set(open_rows.tolist()) else float(columns.reward[i]) for i in members]
    assert group.rewards() == expected
    assert group.rids().tolist() == columns.rid[members].tolist()
    objects = list(group)  # made when read: from the filled columns where no object was made before
    assert [r.reward for r in objects] == expected and [r.rid for r in objects] == group.rids().tolist()
    assert all(a is b for a, b in zip(objects, group))  # made once
    assert group[-1] is objects[-1] and group[0:2] == objects[0:2]


@pytest.mark.parametrize("policy", ["segment", "april", "rollpacker"])
def test_the_rows_left_open_hold_what_their_objects_hold(monkeypatch, policy):
    """The cut and carry routes close the rows still open when the rollout left them (running at the cut, carried) from
    their rows (RowRequests.left_open): what RequestColumns.of reads of their objects once the step's last version is
    set (aborted, carried or dropped by then)."""
    import dataclasses

    import lssim.loop.controller as controller
    from lssim.analysis.replay import SimSetup, simulate
    from lssim.traces.synth import get_preset, synthesize
    from lssim.traces.workload import Workload

    checked = []
    real = controller.close_step

    def compared(s, done, version, earlier=None):
        if s.open_cut is not None and len(s.open_cut[1]):
            requests, rows = s.open_cut
            left = requests.left_open(rows, s.cut[0])
            left = dataclasses.replace(left, last_version=np.full(len(left), version))
            objects = requests.make(rows)
            of = RequestColumns.of(objects)
            for name in [f.name for f in dataclasses.fields(RequestColumns) if f.name != "resumes"]:
                assert np.array_equal(getattr(left, name), getattr(of, name),
                                      equal_nan=getattr(left, name).dtype.kind == "f"), name
            listed = [None if x is None else list(x) for x in (left.resumes if left.resumes is not None else [None] * len(left))]
            assert listed == [r.resumes for r in objects]
            checked.append(len(rows))
        return real(s, done, version, earlier)

    monkeypatch.setattr(controller, "close_step", compared)
    preset = get_preset("math7b")
    simulate(Workload(synthesize(preset.replace(steps=4))), policy, SimSetup())
    assert len(checked) >= 2  # steps that left rows open (a later one resuming what an earlier one left)
