"""seer's rules, written once (policies/seer.py): its queue order on numbers and on arrays alike, its placement and its
requeue test through the hooks the controller asks, against the rules as its docstring states them. Replays that show
what seer does on the engine are in tests/test_policies_issue5.py."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from lssim.loop.core import LENGTH, STOP, InstanceLoad
from lssim.loop.policy import make_policy
from policies.seer import rank

TOKENS = st.integers(0, 1 << 20)


class R:  # what seer's hooks read of a request
    def __init__(self, rid, group_id, generated=0, prompt_id=0, max_tokens=1 << 20, finish_reason=STOP):
        self.rid, self.group_id, self.generated, self.prompt_id = rid, group_id, generated, prompt_id
        self.max_tokens, self.finish_reason = max_tokens, finish_reason


@given(st.lists(st.tuples(st.booleans(), TOKENS, TOKENS), min_size=1, max_size=40))
def test_rank_over_arrays_is_rank_of_each_request(rows):
    probe, generated, estimate = (np.array(c) for c in zip(*rows))
    assert rank(probe, generated, estimate).tolist() == [rank(*r) for r in rows]


@given(TOKENS, TOKENS, TOKENS, TOKENS, TOKENS)
def test_probes_run_before_started_requests_before_fresh_ones(probe_gen, started_gen, started_est, fresh_est, other):
    probe, started, fresh = rank(True, probe_gen, other), rank(False, started_gen + 1, started_est), rank(False, 0, fresh_est)
    assert probe < started < fresh
    assert (rank(True, probe_gen, 0) < rank(True, other, 0)) == (probe_gen < other)  # probes: shortest generated first
    # others: longest first by max(estimate, generated)
    assert (rank(False, 0, fresh_est) < rank(False, 0, other)) == (fresh_est > other)
    assert rank(False, started_gen + 1, started_est) == rank(False, 1, max(started_est, started_gen + 1))


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 6), st.lists(st.tuples(st.booleans(), st.integers(0, 5)), min_size=1, max_size=60), st.data())
def test_place_picks_the_instance_with_fewest_requests_then_the_least_busy(n_inst, moves, data):
    seer = make_policy("seer")
    seer.plan(None, [])
    placed, count, rid = {}, [0] * n_inst, 0
    for finish, load in moves:
        if finish and placed:  # one of the placed requests ends
            done = data.draw(st.sampled_from(sorted(placed)))
            count[placed.pop(done)] -= 1
            seer.on_finish(R(done, 0), None)
            continue
        loads = [InstanceLoad(load, data.draw(st.integers(0, 3)), 0) for _ in range(n_inst)]
        want = min(range(n_inst), key=lambda j: (count[j], loads[j].running + loads[j].waiting, j))
        assert seer.place(R(rid, rid), loads) == want
        placed[rid] = want
        count[want] += 1
        rid += 1


@settings(max_examples=50, deadline=None)
@given(st.integers(2, 4), st.lists(st.integers(0, 3), min_size=2, max_size=4), st.booleans())
def test_a_request_is_requeued_only_where_its_instance_holds_rebalance_more(rebalance, extra, every_chunk):
    seer = make_policy(f"seer(rebalance={rebalance},every_chunk={every_chunk})")
    seer.plan(None, [])
    loads = [InstanceLoad(0, 0, 0)] * len(extra)
    rid, on = 0, {}
    for _ in range(max(extra) + 1):  # round-robin placements, then ends that leave instance i with extra[i] more
        for i in range(len(extra)):
            on.setdefault(seer.place(R(rid, rid), loads), []).append(rid)
            rid += 1
    for i, e in enumerate(extra):
        for done in on[i][:max(extra) - e]:
            seer.on_finish(R(done, done, finish_reason=LENGTH), None)
            on[i].remove(done)
    for i, rids in on.items():
        action = seer.on_progress(R(rids[0], rids[0], generated=5), None)
        moves = every_chunk or extra[i] - min(extra) >= rebalance
        assert (action is not None) == moves
        if moves:
            assert action.kind == "requeue" and action.instance is None
            assert action.priority == rank(True, 5, 0)  # it is its group's probe: the first of its group asked
