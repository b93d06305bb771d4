"""The data loader's groups taken across batches (lssim.loop.loader.DataLoader.take): columns where every batch is, the
same plan as the list of GroupSpec they stand for."""

from types import SimpleNamespace

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from lssim.loop.core import GroupSpec, GroupSpecs
from lssim.loop.loader import DataLoader
from test_groupspecs import _asdict, _equal, _plan


class Batches:
    """A PromptSource whose batch k holds `size` groups as columns, every third with recorded members."""

    def __init__(self, size: int, as_columns: bool = True):
        self.size, self.as_columns = size, as_columns

    def default_groups(self, k, groups_per_step, group_size, max_tokens):
        members = {j: ((5,) * 2, (j % 2 == 0, True)) for j in range(0, self.size, 3)}
        specs = GroupSpecs(100 * k + np.arange(self.size), np.full(self.size, 2), np.full(self.size, max_tokens), members=members)
        return specs if self.as_columns else list(specs)


def loader(size, as_columns=True):
    return DataLoader(Batches(size, as_columns), SimpleNamespace(groups_per_step=size, group_size=2, max_tokens=64))


@settings(max_examples=60, deadline=None)
@given(size=st.integers(1, 5), takes=st.lists(st.integers(0, 12), min_size=1, max_size=4))
def test_groups_taken_across_batches_are_the_groups_of_the_batches_one_after_another(size, takes):
    columns, objects = loader(size), loader(size, as_columns=False)
    for n in takes:
        got, expected = columns.take(n), objects.take(n)
        assert isinstance(got, GroupSpecs) or not len(got)
        assert [_asdict(g) for g in got] == [_asdict(g) for g in expected]
    columns.start_step(1)
    objects.start_step(1)
    got, expected = columns.take(2 * size), objects.take(2 * size)
    _equal(_plan(got), _plan([GroupSpec(**_asdict(g)) for g in expected]))


def test_a_batch_a_policy_read_is_joined_as_objects():
    source = loader(3)
    first = source.batch(0)
    first[1].max_tokens = 7  # read and changed: the objects are the truth
    taken = source.take(5)
    assert isinstance(taken, list) and [g.max_tokens for g in taken] == [64, 7, 64, 64, 64]
    assert [g.batch for g in taken] == [0, 0, 0, 1, 1]
