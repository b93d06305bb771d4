"""The per-step lower bound (lssim.sim.bounds): independent of the order of the step's responses, and the exact
maximum of the solo term over every response."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from lssim.sim.bounds import make_lower_bound, solo_candidates
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


def _all_undominated(ctx0: np.ndarray, tokens: np.ndarray) -> set:
    """Every (context, tokens) pair no other pair matches or beats in both, by brute force."""
    pairs = set(zip(ctx0.tolist(), tokens.tolist()))
    return {(c, t) for c, t in pairs if not any(c2 >= c and t2 >= t and (c2, t2) != (c, t) for c2, t2 in pairs)}


@settings(max_examples=300, deadline=None)
@given(pairs=st.lists(st.tuples(st.integers(0, 40), st.integers(0, 40)), min_size=1, max_size=60))
def test_solo_candidates_are_exactly_the_undominated_pairs_each_once(pairs):
    ctx0, tokens = (np.array(c, dtype=np.int64) for c in zip(*pairs))
    c, t = solo_candidates(ctx0, tokens)
    got = list(zip(c.tolist(), t.tolist()))
    assert len(got) == len(set(got)) and set(got) == _all_undominated(ctx0, tokens)
    assert t.tolist() == sorted(t.tolist(), reverse=True)  # most tokens first


def _bound_as_it_was(cost, n_instances, max_num_seqs, prompt_lens, ctx0, tokens, running=None):
    """make_lower_bound's bound as written before its fast paths (every response through the same masks)."""
    ran = tokens > 0
    if not ran.any():
        return 0.0
    ctx0, tokens = ctx0[ran].astype(np.int64), tokens[ran].astype(np.int64)
    kept = np.zeros(len(tokens), dtype=bool) if running is None else np.asarray(running, dtype=bool)[ran]
    ctx0, tokens = ctx0 + kept, tokens - kept
    solo = 0.0
    for is_kept in (False, True):
        rows = kept == is_kept
        if rows.any():
            solo = max(solo, max(solo_decode_time(cost, int(c), int(t)) - (cost.prefill_time(int(c)) if is_kept else 0.0)
                                 for c, t in zip(ctx0[rows], tokens[rows])))
    reads = float((tokens * ctx0 + tokens * (tokens - 1) // 2).sum())
    work = (cost.work_time(float(tokens.sum()), reads, max_num_seqs) + cost.prefill_time(int(ctx0[~kept].sum()))) / n_instances
    return max(solo, work)


@settings(max_examples=150, deadline=None)
@given(responses, st.sampled_from(range(len(COSTS))), st.sampled_from([1, 4]), st.randoms(use_true_random=False))
def test_the_bound_is_the_brute_force_one_bit_for_bit(rows, which, instances, rnd):
    prompt, ctx0, tokens = columns(rows)
    for running in (None, np.array([rnd.random() < 0.3 for _ in rows])):
        got = make_lower_bound(COSTS[which], instances, 256)(prompt, ctx0, tokens, running)
        assert got == _bound_as_it_was(COSTS[which], instances, 256, prompt, ctx0, tokens, running)


@settings(max_examples=150, deadline=None)
@given(responses)
def test_the_one_pass_terms_are_solo_candidates_and_the_sums(rows):
    from lssim.sim.bounds import bound_terms

    _, ctx0, tokens = columns(rows)
    ran = tokens > 0
    n_ran, c, t, step_tokens, reads, prefilled = bound_terms(ctx0, tokens)
    assert n_ran == ran.sum() and step_tokens == tokens[ran].sum() and prefilled == ctx0[ran].sum()
    assert reads == (tokens * ctx0 + tokens * (tokens - 1) // 2)[ran].sum()
    if ran.any():
        want_c, want_t = solo_candidates(ctx0[ran], tokens[ran])
        assert c.tolist() == want_c.tolist() and t.tolist() == want_t.tolist()
