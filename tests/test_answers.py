"""lssim.sim.answers.Answers: remembered rows read as a dict of the same assignments reads them."""

import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lssim.sim.answers import Answers

RIDS = st.integers(0, 40)
ANSWER = st.tuples(st.integers(0, 500), st.sampled_from(["stop", "length"]), st.floats(-1, 1), st.integers(0, 99))
# an operation: write one answer into the dict, remember a batch of distinct rids, or read a rid
OPS = st.lists(st.one_of(st.tuples(st.just("set"), RIDS, ANSWER),
                         st.tuples(st.just("remember"), st.lists(st.tuples(RIDS, ANSWER), unique_by=lambda x: x[0])),
                         st.tuples(st.just("read"), RIDS)), max_size=30)


@settings(max_examples=200, deadline=None)
@given(OPS)
def test_answers_read_as_a_dict_of_the_same_assignments(ops):
    answers, plain = Answers(), {}
    for op in ops:
        if op[0] == "set":
            if op[1] not in answers:  # (SimEngine.submit writes only what it does not know)
                answers[op[1]] = plain[op[1]] = op[2]
        elif op[0] == "remember":
            rids = np.array([rid for rid, _ in op[1]], np.int64)
            fields = list(zip(*[a for _, a in op[1]])) or [(), (), (), ()]
            answers.remember(rids, np.array(fields[0], np.int64), np.array(fields[1], object),
                             np.array(fields[2], float), np.array(fields[3], np.int64))
            plain.update((rid, a) for rid, a in op[1])
        else:
            assert (op[1] in answers) == (op[1] in plain)
            if op[1] in plain:
                got = answers[op[1]]
                assert got == plain[op[1]] and list(map(type, got)) == list(map(type, plain[op[1]]))
    probe = np.arange(-2, 45)
    assert answers.known(probe).tolist() == [int(rid) in plain for rid in probe]
    copy = pickle.loads(pickle.dumps(answers))
    assert all(copy[rid] == a for rid, a in plain.items())


def test_an_unknown_rid_is_a_key_error_and_a_negative_rid_is_refused():
    answers = Answers()
    with pytest.raises(KeyError):
        answers[3]
    with pytest.raises(ValueError, match="rids must be >= 0"):
        answers.remember(np.array([-1]), np.array([1]), np.array(["stop"], object), np.array([0.0]), np.array([0]))
