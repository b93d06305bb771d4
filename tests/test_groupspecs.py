"""A loader batch as columns (lssim.loop.core.GroupSpecs): the same plan as the list of GroupSpec it stands for."""

import numpy as np
import pytest

from lssim.loop.plan_columns import plan_requests
from lssim.loop.core import GroupSpec, GroupSpecs
from lssim.traces.synth import get_preset, synthesize
from lssim.traces.workload import Workload, lookup_coded


def _specs():
    return GroupSpecs(np.array([7, 3, 9, 4]), np.array([2, 3, 1, 2]), np.array([64, 32, 16, 8]),
                      members={1: ((32, 8, 20), (True, False, True)), 3: (None, (False, True))})


def _plan(plan, **over):
    args = dict(step=5, first_rid=100, first_group=10, version=2, rng=np.random.default_rng(0),
                prompt_lens=lambda ids: np.asarray(ids) * 10, samples_planned={7: 1}, batch_samples={})
    args.update(over)
    return plan_requests(plan, **args)


def _equal(a, b):
    (ca, la), (cb, lb) = a, b
    assert la == lb
    for name in ("rid", "group_id", "prompt_id", "sample_idx", "prompt_len", "max_tokens", "priority", "instance", "seed",
                 "batch", "batch_sample"):
        np.testing.assert_array_equal(getattr(ca, name), getattr(cb, name), err_msg=name)


def test_columns_behave_as_the_list_of_specs_they_stand_for():
    as_list = [GroupSpec(7, 2, 64), GroupSpec(3, 3, 32, member_max_tokens=(32, 8, 20), member_trained=(True, False, True)),
               GroupSpec(9, 1, 16), GroupSpec(4, 2, 8, member_trained=(False, True))]
    specs = _specs()
    assert len(specs) == 4 and specs == as_list and specs[-1] == as_list[-1]
    assert _specs()[1:3] == as_list[1:3] and _specs()[::-1] == as_list[::-1]
    assert isinstance(_specs()[1:], GroupSpecs)  # a slice stays columns while nothing was read
    assert _specs() + [GroupSpec(1, 1, 1)] == as_list + [GroupSpec(1, 1, 1)]
    assert [GroupSpec(1, 1, 1)] + _specs() == [GroupSpec(1, 1, 1)] + as_list
    with pytest.raises(IndexError):
        _specs()[4]


def test_columns_added_to_columns_stay_columns():
    as_list = list(_specs())
    joined = _specs()[1:] + _specs()  # (a proposal and what a policy drew)
    assert isinstance(joined, GroupSpecs) and joined.untouched
    assert joined == as_list[1:] + as_list  # members' own budgets and training follow their groups
    empty = _specs()[:0]
    assert isinstance([] + _specs(), GroupSpecs) and isinstance(empty + _specs(), GroupSpecs)
    assert [] + _specs() == as_list and _specs() + [] == as_list
    read = _specs()
    read[0]  # a group read: the objects carry the plan from here on
    assert isinstance(read + _specs(), list) and read + _specs() == as_list + as_list


def test_plan_requests_reads_the_columns_as_it_reads_the_objects():
    _equal(_plan(_specs()), _plan(list(_specs())))
    _equal(_plan(_specs()[1:]), _plan(list(_specs())[1:]))
    _equal(_plan(_specs().from_batch(6)), _plan([GroupSpec(**{**_asdict(g), "batch": 6}) for g in _specs()]))
    cols, left_out = _plan(_specs())
    assert left_out == [100 + 2 + 1, 100 + 6]  # members the recorded groups did not train
    assert cols.max_tokens.tolist() == [64, 64, 32, 8, 20, 16, 8, 8]


def test_a_spec_read_and_changed_by_a_policy_changes_the_plan():
    specs = _specs()
    specs[2].max_tokens = 5  # read, then changed: the objects are the truth from now on
    assert not specs.untouched
    assert _plan(specs)[0].max_tokens[5] == 5


def _asdict(g):
    return {name: getattr(g, name) for name in GroupSpec.__slots__}


def test_a_question_kept_is_answered_from_its_answer_once_and_a_new_one_is_not():
    wl = Workload(synthesize(get_preset("math7b").replace(steps=2, prompts_per_step=8)))
    step, pid = np.zeros(4, np.int64), np.asarray(wl.default_groups(0, 8, 8, 0).prompt_id[:4])
    sample, budget = np.arange(4), np.full(4, 4096)
    first = lookup_coded(wl, step, pid, sample, budget, keep=True)
    assert not first[0].flags.writeable  # nobody changes an answer that is kept
    assert lookup_coded(wl, step.copy(), pid.copy(), sample.copy(), budget.copy()) is first
    again = lookup_coded(wl, step, pid, sample, budget)  # kept for one call only
    assert again is not first and again[0].tolist() == first[0].tolist()
    lookup_coded(wl, step, pid, sample, budget, keep=True)
    shorter = lookup_coded(wl, step, pid, sample, np.full(4, 8))  # another question: asked of the index
    assert (shorter[0] <= 8).all() and "_kept_lookup" not in wl.__dict__
