"""The array forms the batch-route policies keep their state in (lssim.loop.history, lssim.loop.difficulty, ebs's
batches and slots, the simulator's GRPO advantages, plans passed on as columns) must answer, to the last bit, what
the per-prompt and per-request code they replaced answers. The references below are that code."""

from collections import deque

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from lssim.loop.columns import stable_smallest
from lssim.loop.core import InstanceLoad, LENGTH, STOP, GroupSpec, GroupSpecs, PromptPool, StepContext, spec_columns
from lssim.loop.decisions import StepOutcome
from lssim.loop.difficulty import PromptPosterior
from lssim.loop.history import LengthHistory
from lssim.loop.policy import make_policy
from lssim.loop.rewards import RewardScale
from lssim.sim.train_policy import group_advantages, grpo_advantages


class DequeHistory:  # the per-prompt reference: a deque of the latest `keep` lengths per prompt
    def __init__(self, keep):
        self.keep, self.q, self.total, self.total_sq, self.count = keep, {}, 0.0, 0.0, 0

    def update(self, outcome):
        natural = np.isin(outcome.finish_reason.astype(str), (STOP, LENGTH))
        lens = outcome.response_len[natural].tolist()
        for pid, n in zip(outcome.prompt_id[natural].tolist(), lens):
            self.q.setdefault(pid, deque(maxlen=self.keep)).append(n)
        self.total += float(sum(lens))
        self.total_sq += float(sum(n * n for n in lens))
        self.count += len(lens)

    def mean(self, pid):
        q = self.q.get(pid)
        return sum(q) / len(q) if q else None

    def mean_square(self, pid):
        q = self.q.get(pid)
        return sum(n * n for n in q) / len(q) if q else None

    def remaining(self, pid, generated):
        q = self.q.get(pid)
        longer = [n for n in q if n > generated] if q else []
        return sum(longer) / len(longer) - generated if longer else None


def outcome(step, pids, lens, reasons, rewards=None):
    pids = np.asarray(pids, np.int64)
    rewards = np.ones(len(pids)) if rewards is None else np.asarray(rewards, float)
    reasons = np.array(reasons, dtype=object)
    return StepOutcome(step, pids, np.zeros(len(pids), np.int64), np.asarray(lens, np.int64),
                       np.full(len(pids), 10**6), rewards, reasons, 1.0, np.unique(pids))


responses = st.lists(st.tuples(st.integers(0, 7), st.integers(0, 3000), st.sampled_from([STOP, LENGTH, "abort", "policy_stop"])),
                     max_size=40)


def _same(a, b):
    return (a is None and b is None) or (a is not None and b is not None and float(a).hex() == float(b).hex())


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 5), st.lists(responses, max_size=6), st.integers(0, 3000))
def test_length_history_answers_what_a_deque_per_prompt_answers(keep, steps, generated):
    h, ref = LengthHistory(keep), DequeHistory(keep)
    for step, rows in enumerate(steps):
        o = outcome(step, [p for p, _, _ in rows], [n for _, n, _ in rows], [r for _, _, r in rows])
        h.update(o)
        ref.update(o)
    pids = np.arange(-1, 9)
    assert len(h) == len(ref.q) and all(h.known(p) == (p in ref.q) for p in pids.tolist())
    for p in pids.tolist():
        assert _same(h.mean(p), ref.mean(p)) and _same(h.mean_square(p), ref.mean_square(p))
        assert _same(h.remaining(p, generated), ref.remaining(p, generated))
    expected = [np.nan if ref.mean(p) is None else ref.mean(p) for p in pids.tolist()]
    np.testing.assert_array_equal(h.means(pids), expected, strict=True)
    expected = [np.nan if ref.mean_square(p) is None else ref.mean_square(p) for p in pids.tolist()]
    np.testing.assert_array_equal(h.mean_squares(pids), expected, strict=True)
    assert _same(h.global_mean(), ref.total / ref.count if ref.count else None)
    assert _same(h.global_mean_square(), ref.total_sq / ref.count if ref.count else None)


class DictPosterior:  # the per-prompt reference: a dict of (a, b, step decayed to)
    def __init__(self, a0=1.0, b0=1.0, step_decay=0.98, visit_decay=0.7):
        self.a0, self.b0, self.step_decay, self.visit_decay, self.e = a0, b0, step_decay, visit_decay, {}

    def decayed(self, pid, step):
        a, b, t = self.e.get(pid, (0.0, 0.0, step))
        if step > t and self.step_decay < 1.0:
            f = self.step_decay ** (step - t)
            a, b = a * f, b * f
        return a, b

    def update(self, step, pids, rewards, scale):
        counts = {}
        for pid, r in zip(pids.tolist(), scale.normalized(np.asarray(rewards, dtype=float)).tolist()):
            if r != r:
                continue
            x = min(1.0, max(0.0, r))
            c = counts.setdefault(pid, [0.0, 0.0])
            c[0] += x
            c[1] += 1.0 - x
        for pid, (s, f) in counts.items():
            a, b = self.decayed(pid, step)
            self.e[pid] = (self.visit_decay * a + s, self.visit_decay * b + f, step)

    def params(self, pids, step):
        ab = np.array([self.decayed(p, step) for p in pids.tolist()], dtype=float).reshape(-1, 2)
        return self.a0 + ab[:, 0], self.b0 + ab[:, 1]


rewards = st.one_of(st.floats(-3, 3, allow_nan=False), st.just(float("nan")), st.sampled_from([0.0, -0.0, 1.0]))


@settings(max_examples=150, deadline=None)
@given(st.sampled_from([1.0, 0.98, 0.5]), st.sampled_from([0.0, 0.7, 1.0]), st.sampled_from([RewardScale(), RewardScale(-1.0, 2.0)]),
       st.lists(st.tuples(st.integers(0, 12), st.lists(st.tuples(st.integers(0, 6), rewards), max_size=20)), max_size=6),
       st.integers(0, 14))
def test_prompt_posterior_answers_what_a_dict_per_prompt_answers(step_decay, visit_decay, scale, updates, read_at):
    post, ref = PromptPosterior(1.0, 2.0, step_decay, visit_decay), DictPosterior(1.0, 2.0, step_decay, visit_decay)
    for step, rows in updates:  # steps in any order: a read or update at an earlier step does not decay
        pids, r = np.array([p for p, _ in rows], np.int64), np.array([x for _, x in rows], float)
        post.update(step, pids, r, scale)
        ref.update(step, pids, r, scale)
    pids = np.arange(-1, 8)
    assert len(post) == len(ref.e)
    for got, expected in zip(post.params(pids, read_at), ref.params(pids, read_at)):
        assert got.tobytes() == expected.tobytes()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.one_of(st.floats(-1e6, 1e6), st.sampled_from([0.0, 1.0, float("nan"), float("inf")])), max_size=40),
                max_size=8))
def test_group_advantages_are_each_groups_grpo_advantages(groups):
    sizes = np.array([len(g) for g in groups], np.int64)
    rewards = np.array([x for g in groups for x in g], float)
    expected = np.concatenate([grpo_advantages(np.array(g, float)) for g in groups] + [np.zeros(0)])
    assert group_advantages(rewards, sizes).tobytes() == expected.tobytes()


def test_group_advantages_match_numpy_per_group_on_sums_where_the_order_matters():
    rng = np.random.default_rng(7)
    for n in (7, 8, 9, 16, 17, 33, 130):  # numpy sums 8 lanes from 8 on: rows must be summed as one group's array is
        rewards = rng.standard_normal(5 * n) * 10.0 ** rng.uniform(-8, 8, 5 * n)
        expected = np.concatenate([grpo_advantages(rewards[k * n:(k + 1) * n]) for k in range(5)])
        assert group_advantages(rewards, np.full(5, n)).tobytes() == expected.tobytes()


class Columns:  # what EBS's array hooks read of a submission
    def __init__(self, requests):
        self.prompt_id = np.array([r.prompt_id for r in requests], np.int64)
        self.max_tokens = np.array([r.max_tokens for r in requests], np.int64)
        self.generated = np.array([r.generated for r in requests], np.int64)

    def __len__(self):
        return len(self.prompt_id)


class R:
    def __init__(self, prompt_id, max_tokens, generated):
        self.prompt_id, self.max_tokens, self.generated = prompt_id, max_tokens, generated


def ctx(step=0, pool=64, max_tokens=1000):
    ids = np.arange(pool, dtype=np.int64)
    return StepContext(step, 4, 2, max_tokens, 100, 0, PromptPool(ids, np.full(pool, 10, np.int64)), np.random.default_rng(step))


history = st.lists(st.tuples(st.integers(0, 9), st.integers(0, 1200)), max_size=30)
plans = st.lists(st.tuples(st.integers(0, 11), st.integers(1, 5), st.sampled_from([300, 1000, 1024])), min_size=1, max_size=10)


@settings(max_examples=150, deadline=None)
@given(history, plans, st.lists(st.tuples(st.integers(0, 12), st.integers(0, 400)), max_size=30), st.integers(1, 5),
       st.sampled_from(["ebs", "ebs(batch_sizes=(3, 2, 1), keep=2)", "ebs(short_max=0.5, long_min=0.5)"]))
def test_ebs_array_hooks_answer_what_its_per_request_hooks_answer(past, plan, asked, n_instances, spec):
    a, b = make_policy(spec), make_policy(spec)
    seen = outcome(0, [p for p, _ in past], [n for _, n in past], [STOP] * len(past))
    proposal = [GroupSpec(p, n, m) for p, n, m in plan]
    for p in (a, b):
        p.end_step(seen)
        p.plan(ctx(), proposal)
    requests = [R(p, 1000, g) for p, g in asked]
    loads = [InstanceLoad(0, 0, 0)] * n_instances
    assert a.priorities(Columns(requests)).tolist() == [b.priority(r) for r in requests]
    assert a.placements(Columns(requests), loads).tolist() == [b.place(r, loads) for r in requests]
    assert not requests or a._load == b._load  # the loads the unplanned ones added, in the same order


@settings(max_examples=100, deadline=None)
@given(history, plans)
def test_ebs_batches_are_the_buckets_cut_in_plan_order(past, plan):
    p = make_policy("ebs(batch_sizes=(3, 2, 1))")
    p.end_step(outcome(0, [q for q, _ in past], [n for _, n in past], [STOP] * len(past)))
    p.plan(ctx(), [GroupSpec(q, n, m) for q, n, m in plan])
    members = [[], [], []]  # the per-group loop it replaces
    for q, n, m in plan:
        predicted = p.predicted(q, m)
        members[p.bucket(predicted, m)].extend([(predicted, p.load(q, m), q)] * n)
    expected = []
    for bucket, items in enumerate(members):
        items.sort(key=lambda item: -item[0])
        size = p.batch_sizes[bucket]
        for start in range(0, len(items), size):
            chunk = items[start:start + size]
            expected.append((chunk[0][0], sum(w for _, w, _ in chunk), bucket, [q for _, _, q in chunk]))
    assert p.batches == expected


def loader_batch(n=6):
    return GroupSpecs(np.arange(10, 10 + n, dtype=np.int64), np.full(n, 4, np.int64), np.full(n, 1000, np.int64),
                      np.full(n, 3, np.int64))


def test_spec_columns_read_a_loader_batch_without_making_its_groups():
    batch = loader_batch()
    ids, n, budget = spec_columns(batch)
    assert batch.untouched and ids.tolist() == list(range(10, 16)) and n.tolist() == [4] * 6 and budget.tolist() == [1000] * 6
    assert [c.tolist() for c in spec_columns(list(batch))] == [ids.tolist(), n.tolist(), budget.tolist()]
    assert [c.tolist() for c in spec_columns([])] == [[], [], []]


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(["ar3po", "vade", "vade(min_evidence=0.5)", "ar3po(max_samples=3)", "alc", "alc(start_fraction=1.0)"]),
       st.lists(st.tuples(st.integers(8, 16), st.sampled_from([0.0, 1.0, 0.5])), max_size=40), st.integers(0, 3))
def test_a_plan_from_columns_is_the_plan_from_groups(spec, past, step):
    a, b = make_policy(spec), make_policy(spec)
    seen = outcome(0, [p for p, _ in past], [10] * len(past), [STOP] * len(past), [r for _, r in past])
    for p in (a, b):
        p.end_step(seen)
    columns, groups = loader_batch(), list(loader_batch())  # untouched columns; the same groups as objects
    from_columns, from_groups = a.plan(ctx(step, pool=20), columns), b.plan(ctx(step, pool=20), groups)
    assert columns.untouched and list(from_columns) == list(from_groups)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.floats(-5, 5, allow_nan=False), st.sampled_from([0.0, -0.0, 1.0, -1.0])), max_size=60),
       st.integers(-1, 70))
def test_stable_smallest_is_the_head_of_a_stable_argsort(values, k):
    values = np.array(values, float)
    expected = np.argsort(values, kind="stable")[:max(k, 0)]
    assert stable_smallest(values, k).tolist() == expected.tolist()


def test_a_checkpoint_of_the_per_prompt_state_reads_back_into_the_arrays():
    import pickle

    ref, post = DequeHistory(3), DictPosterior()
    for step, rows in enumerate([[(1, 10), (2, 20), (1, 30)], [(1, 40), (1, 50), (3, 7)]]):
        o = outcome(step, [p for p, _ in rows], [n for _, n in rows], [STOP] * len(rows), [n % 2 for _, n in rows])
        ref.update(o)
        post.update(step, o.prompt_id, o.reward, RewardScale())
    old_history = {"keep": 3, "_lengths": ref.q, "_total": ref.total, "_total_sq": ref.total_sq, "_count": ref.count}
    h = LengthHistory.__new__(LengthHistory)
    h.__setstate__(dict(old_history))
    for p in (1, 2, 3, 4):
        assert _same(h.mean(p), ref.mean(p)) and _same(h.remaining(p, 15), ref.remaining(p, 15))
    o = outcome(2, [1, 1], [60, 70], [STOP, STOP])  # the oldest lengths leave first, as from the deque
    h.update(o)
    ref.update(o)
    assert _same(h.mean(1), ref.mean(1)) and _same(h.global_mean(), ref.total / ref.count)
    p = PromptPosterior.__new__(PromptPosterior)
    p.__setstate__({"prior_a": 1.0, "prior_b": 1.0, "step_decay": 0.98, "visit_decay": 0.7, "_evidence": dict(post.e)})
    ids = np.arange(5)
    assert all(x.tobytes() == y.tobytes() for x, y in zip(p.params(ids, 4), post.params(ids, 4)))
    again = pickle.loads(pickle.dumps(h))  # and the arrays' own state round-trips
    assert _same(again.mean(1), h.mean(1)) and len(again) == len(h)
    ebs = make_policy("ebs")
    old_ebs = {k: v for k, v in ebs.__dict__.items() if k not in ("_batches", "_slots")}
    restored = type(ebs).__new__(type(ebs))
    restored.__setstate__({**old_ebs, "batches": [(1.0, 0.5, 0, [7])], "_slots": {7: deque([0])}})
    restored.plan(ctx(), [GroupSpec(7, 2, 1000)])
    assert restored.batches == [(1000.0, 1000.0 ** 2, 2, [7, 7])]  # nothing known: the budget, in the long bucket


def test_a_subclass_that_changes_a_hook_and_not_its_array_form_runs_the_hook_event_by_event():
    from policies.april import APRIL
    from policies.breaker import Breaker
    from policies.segment import Segment

    class WatchedSegment(Segment):
        def on_progress(self, request, state):
            return super().on_progress(request, state)

    class WatchedBreaker(Breaker):
        def on_progress(self, request, state):
            return super().on_progress(request, state)

    class WatchedApril(APRIL):
        def end_rollout(self, state):
            return super().end_rollout(state)

    assert Segment().carries_in_batches() and not WatchedSegment().carries_in_batches()
    assert Breaker().progress_in_batches() and not WatchedBreaker().progress_in_batches()
    assert APRIL().cuts_in_batches() and not WatchedApril().cuts_in_batches()

    class BothChanged(Segment):  # a subclass that keeps its array form with its hook keeps the route
        def on_progress(self, request, state):
            return super().on_progress(request, state)

        def progress_carries(self, checkpoints):
            return super().progress_carries(checkpoints)

    assert BothChanged().carries_in_batches()
