"""The per-step lower bound (lssim.bounds): independent of the order of the step's responses, and the exact
maximum of the solo term over every response."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from lssim.bounds import make_lower_bound, solo_candidates
from lssim.cost import ProfiledCostModel, RooflineCostModel, solo_decode_time

COSTS = [RooflineCostModel("qwen2.5-7b", "H100"), ProfiledCostModel(4e-3, 2e-5, 3e-8, 1e-8, p0=2e-3, p1=3e-5)]

# (prompt_len, tokens this step, context already generated before it) per response. Few distinct lengths,
# so that many responses tie at the longest with different contexts, and sometimes more than 32 of them.
response = st.tuples(st.integers(1, 4000), st.sampled_from([0, 1, 7, 300, 2048]), st.integers(0, 3000))
many_tied = st.builds(
    lambda tied, rest: [(p, 5000, e) for p, e in tied] + rest,
    st.lists(st.tuples(st.integers(1, 4000), st.integers(0, 3000)), min_size=33, max_size=80),
    st.lists(response, max_size=40),
)
responses = st.one_of(st.lists(response, min_size=1, max_size=120), many_tied)


def columns(rows):
    prompt, tokens, extra = (np.array(col, dtype=np.int64) for col in zip(*rows))
    return prompt, prompt + extra, tokens  # a carried-over response resumes past its prompt


@settings(max_examples=150, deadline=None)
@given(responses, st.randoms(use_true_random=False), st.sampled_from(range(len(COSTS))), st.sampled_from([1, 4, 1024]))
def test_permuting_the_responses_never_changes_the_bound(rows, rnd, which, instances):
    bound = make_lower_bound(COSTS[which], instances, 256)
    shuffled = list(rows)
    rnd.shuffle(shuffled)
    assert bound(*columns(rows)) == bound(*columns(shuffled))


@settings(max_examples=100, deadline=None)
@given(responses, st.sampled_from(range(len(COSTS))))
def test_solo_term_is_the_maximum_over_every_response(rows, which):
    cost = COSTS[which]
    prompt, ctx0, tokens = columns(rows)
    ran = tokens > 0
    if not ran.any():
        assert make_lower_bound(cost, 1, 256)(prompt, ctx0, tokens) == 0.0
        return
    brute = max(solo_decode_time(cost, int(c), int(t)) for c, t in zip(ctx0[ran], tokens[ran]))
    cands = solo_candidates(ctx0[ran], tokens[ran])
    assert max(solo_decode_time(cost, int(c), int(t)) for c, t in zip(*cands)) == brute
    # the candidates are distinct and none dominates another
    pairs = list(zip(*cands))
    assert len(set(pairs)) == len(pairs)
    assert not any(a != b and a[0] >= b[0] and a[1] >= b[1] for a in pairs for b in pairs)
    assert make_lower_bound(cost, 1, 256)(prompt, ctx0, tokens) >= brute


def test_the_longest_response_with_the_largest_context_holds_the_solo_term():
    # 40 responses tie at the longest length; the one with the largest context is last, past any top-32 cut.
    tokens = np.array([5000] * 40 + [10], dtype=np.int64)
    ctx0 = np.array([100] * 39 + [9000, 20000], dtype=np.int64)
    cost = COSTS[0]
    bound = make_lower_bound(cost, 64, 256)(ctx0, ctx0, tokens)
    assert bound == solo_decode_time(cost, 9000, 5000)
    assert set(zip(*solo_candidates(ctx0, tokens))) == {(9000, 5000), (20000, 10)}
