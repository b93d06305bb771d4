"""lssim.loop.columns' lookups over a step's rows: rows_by_rid (a table over the rids' range, or a sort and a search) and
rows_of_one (groups that are rows of one step's columns), against what a dict and a loop answer."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from lssim.loop.columns import GroupBatch, RequestColumns, gather, rows_by_rid, rows_of_one
from lssim.loop.core import Group


@settings(max_examples=200, deadline=None)
@given(dense=st.booleans(), data=st.data())
def test_rows_by_rid_answers_what_a_dict_answers(dense, data):
    top = 60 if dense else 10**9  # rids about one range (a table over it), or spread out (a sort and a search)
    rids = data.draw(st.lists(st.integers(-3, top), unique=True, max_size=30))
    known = data.draw(st.lists(st.sampled_from(rids), max_size=30)) if rids else []
    wanted = np.array(known + data.draw(st.lists(st.integers(-10, top + 10), max_size=10)), np.int64)
    rows = np.arange(100, 100 + len(rids))
    paired = dict(zip(rids, rows.tolist()))
    assert rows_by_rid(np.array(rids, np.int64), rows, wanted).tolist() == [paired.get(r, -1) for r in wanted.tolist()]


def _columns(n):
    return RequestColumns.planned(rid=np.arange(n), prompt_len=np.full(n, 5))


def test_rows_of_one_reads_groups_over_one_columns_and_nothing_else():
    cols, other = _columns(6), _columns(6)
    groups = [Group(1, 0, columns=cols, rows=np.array([4, 2])), Group(2, 0, columns=cols, rows=np.array([0]))]
    columns, rows, sizes = rows_of_one(groups)
    assert columns is cols and rows.tolist() == [4, 2, 0] and sizes.tolist() == [2, 1]
    batch = GroupBatch(cols, np.array([5, 1, 3]), np.array([1, 2]))
    assert rows_of_one(batch)[1].tolist() == [5, 1, 3]
    assert rows_of_one([]) is None
    assert rows_of_one(groups + [Group(3, 0, columns=other, rows=np.array([1]))]) is None  # two columns
    assert rows_of_one(groups + [Group(3, 0, cols.to_requests(np.array([1])))]) is None  # objects only
    assert rows_of_one([Group(3, 0, columns=cols, rows=slice(0, 2))]) is None  # a slice
    mixed = groups + [Group(3, 0, other.to_requests(np.array([3, 1])))]
    assert gather(mixed, "rid")[0].tolist() == [4, 2, 0, 3, 1]  # gathered piece by piece instead
