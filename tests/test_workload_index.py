"""The Workload's index is built from arrays over all rows at once (and its scalar lists and dicts only on the first
scalar ask): it answers every question as the row-by-row index it replaced (tests/workload_reference.py) did."""

import math

import numpy as np
import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

import workload_reference as ref
from lssim.traces.workload import Workload, lookup_many

REASONS = ["stop", "stop", "length", "abort", "policy_stop"]


@st.composite
def traces(draw):
    """Traces as importers and real runs make them: steps that skip and need not start at 0, integer or text ids,
    prompts drawn twice in a step (two groups, samples numbered across them), per-member budgets, responses cut
    short, aborted or stopped, members not trained, optional columns present or not, samples missing (holes),
    rows in any order."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    steps = np.cumsum(rng.integers(1, 4, draw(st.integers(1, 4)))) + draw(st.integers(0, 5))
    n_prompts = draw(st.integers(1, 5))
    rows = []
    for step in steps.tolist():
        for pid in rng.choice(n_prompts, size=rng.integers(1, n_prompts + 1), replace=False).tolist():
            sample = 0
            for group in range(int(rng.integers(1, 3))):
                for _ in range(int(rng.integers(1, 4))):
                    budget = int(rng.choice([64, 64, 32, 100]))
                    reason = REASONS[int(rng.integers(len(REASONS)))]
                    length = budget if reason == "length" else int(rng.integers(0, budget + 1))
                    rows.append((step, pid, group, sample, length, reason, float(rng.choice([0.0, 1.0, 5.0])), budget,
                                 bool(rng.random() < 0.85), int(rng.integers(1, 40)),
                                 int(rng.choice([-1, -1, 0])), float(rng.choice([np.nan, 0.5, 1.5]))))
                    sample += 1
    df = pd.DataFrame(rows, columns=["step", "prompt_id", "group_id", "sample_idx", "response_len", "finish_reason",
                                     "reward", "max_tokens", "trained", "prompt_len", "loop_start", "entropy_mean"])
    df["prompt_len"] = df.groupby("prompt_id")["prompt_len"].transform("first")
    if draw(st.booleans()):
        df["prompt_id"] = df["prompt_id"].map(lambda p: f"uid-{p:03d}")
    optional = ["group_id", "trained", "loop_start", "entropy_mean"]
    df = df.drop(columns=[c for c in optional if draw(st.booleans())])
    if "group_id" not in df:  # without group ids a prompt has one group per step
        df = df.drop_duplicates(["step", "prompt_id", "sample_idx"])
    if draw(st.booleans()):  # members that never ended, or filtered rows: samples numbered with holes
        kept = rng.random(len(df)) < 0.8
        kept[0] = True
        df = df[kept]
    if draw(st.booleans()):
        df = df.sample(frac=1.0, random_state=int(rng.integers(2**31)))
    return df.reset_index(drop=True)


def same(a, b) -> bool:
    return all(x == y or (isinstance(x, float) and math.isnan(x) and math.isnan(y)) for x, y in zip(a, b))


@settings(max_examples=120, deadline=None)
@given(trace=traces(), seed=st.integers(0, 3), queries=st.integers(0, 2**32 - 1))
def test_the_array_built_index_answers_as_the_row_by_row_one(trace, seed, queries):
    new, old = Workload(trace, seed=seed), ref.Workload(trace, seed=seed)
    for name in ("n_rows", "steps", "group_size", "groups_per_step", "max_tokens", "reward_scale"):
        assert getattr(new, name) == getattr(old, name), name
    assert new.trace_steps.tolist() == old.trace_steps.tolist()
    assert same([new.text_entropy], [old.text_entropy])
    assert new.pool.prompt_id.tolist() == old.pool.prompt_id.tolist()
    assert new.pool.prompt_len.tolist() == old.pool.prompt_len.tolist()
    assert (new.prompt_names is None) == (old.prompt_names is None)
    if new.prompt_names is not None:
        assert new.prompt_names.tolist() == old.prompt_names.tolist()
    for p in new.pool.prompt_id.tolist():
        assert new.prompt_len(p) == old.prompt_len(p)
    for k in range(len(new.steps) + 2):  # past the end the batches start over
        assert new.default_groups(k, 3, 2, 64) == old.default_groups(k, 3, 2, 64)
        assert new.groups_in(k) == old.groups_in(k)
    rng = np.random.default_rng(queries)
    n = 60
    codes = new.pool.prompt_id
    step, sample = rng.integers(0, len(new.steps) + 3, n), rng.integers(0, 6, n)
    pid = np.where(rng.random(n) < 0.85, rng.choice(codes, n), rng.integers(-2, 9, n))
    budget = np.where(rng.random(n) < 0.5, rng.choice([32, 64, 100], n), rng.integers(1, 200, n))
    got = lookup_many(new, step, pid, sample, budget)
    want = ref.lookup_many(old, step, pid, sample, budget)
    for j in range(n):
        q = (int(step[j]), int(pid[j]), int(sample[j]), int(budget[j]))
        answer = old.lookup(*q)
        assert same(new.lookup(*q), answer), q
        assert new.length(*q) == answer.length, q
        assert same([a[j] for a in got], [a[j] for a in want]), q
        assert same([a[j] for a in got], [answer.length, answer.finish_reason, answer.reward, answer.source, answer.row]), q
    for row in rng.integers(0, new.n_rows, 5).tolist():
        assert same(new.signal_columns(row), old.signal_columns(row))


def test_the_scalar_index_is_built_only_when_asked():
    trace = pd.DataFrame({"step": [0, 0, 1], "prompt_id": [3, 3, 3], "sample_idx": [0, 1, 0], "prompt_len": 5,
                          "response_len": [4, 9, 2], "reward": [1.0, 0.0, 1.0], "finish_reason": "stop", "max_tokens": 16})
    w = Workload(trace)
    lookup_many(w, [0, 1], [3, 3], [1, 0], [16, 16])
    w.default_groups(0, 1, 2, 16)
    assert not {"_groups", "_len", "_entropy"} & set(w.__dict__)  # the batch route and the loader need none
    assert w.length(0, 3, 1, 16) == 9 and "_groups" in w.__dict__ and "_entropy" not in w.__dict__


def test_a_workload_pickles_after_its_lazy_parts_are_built():
    import pickle

    trace = pd.DataFrame({"step": [0, 0, 1], "prompt_id": [3, 3, 3], "sample_idx": [0, 1, 0], "prompt_len": 5,
                          "response_len": [4, 9, 2], "reward": [1.0, 0.0, 1.0], "finish_reason": "stop", "max_tokens": 16})
    w = Workload(trace)
    assert w.length(0, 3, 1, 16) == 9 and w.lookup(1, 3, 0, 1).length == 1
    copy = pickle.loads(pickle.dumps(w))
    assert copy.length(0, 3, 1, 16) == 9 and copy.lookup(1, 3, 0, 1) == w.lookup(1, 3, 0, 1)


@given(st.integers(-2**63, 2**63 - 1), st.lists(st.lists(st.integers(-2**63, 2**63 - 1), min_size=3, max_size=3),
                                                  min_size=1, max_size=4))
@settings(max_examples=60, deadline=None)
def test_hash01_over_arrays_is_the_scalar_hash_bit_for_bit(seed, parts):
    from lssim.traces.workload_index import hash01, hash01_many

    arrays = [np.array(p, np.int64) for p in parts]
    got = hash01_many(seed, *arrays)
    assert [float(v) for v in got] == [hash01(seed, *column) for column in zip(*parts)]
