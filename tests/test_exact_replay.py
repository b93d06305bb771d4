"""Traces shaped like real runs replay exactly under the baseline, and every policy runs on them.

The generated traces have text prompt ids, rewards of +5/-5 or unbounded floats, a variable number of
groups per step and of samples per group, per-response max_tokens, truncations at the cap, aborted and
policy-stopped responses, groups generated but not trained (DAPO-style filtering), prompts sampled twice
in one step (group_id), and steps that start anywhere and skip numbers."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lssim.loop.contracts import PromptSource
from lssim.loop.controller import RunConfig
from lssim.loop.policy import available_policies
from lssim.analysis.replay import SimSetup, simulate
from lssim.traces.trace import TraceError, validate_trace
from lssim.traces.signal_trace import measure_response
from lssim.traces.workload import Workload

SETUP = SimSetup(model="qwen2.5-1.5b", n_instances=2, max_num_seqs=8)
REWARDS = ("pm5", "unbounded", "binary")


def real_like_trace(seed: int, rewards: str = "pm5", n_steps: int = 4) -> pd.DataFrame:
    """A trace in the grown schema, in no particular row order (validation sorts it)."""
    rng = np.random.default_rng(seed)
    step_numbers = int(rng.integers(0, 1000)) + np.cumsum(rng.integers(1, 4, n_steps))  # starts anywhere, skips
    names = [f"uid-{rng.integers(1 << 30):x}" for _ in range(6)]
    prompt_len = {p: int(rng.integers(1, 40)) for p in names}
    rows = []
    for step in step_numbers.tolist():
        prompts = rng.choice(names, size=int(rng.integers(1, 6)))  # with replacement: a prompt may recur
        samples: dict[str, int] = {}
        for g, pid in enumerate(prompts.tolist()):
            size, filtered = int(rng.integers(1, 5)), bool(rng.random() < 0.3)
            first = samples.get(pid, 0)
            samples[pid] = first + size
            for k in range(size):
                rows.append(_response(rng, step, pid, first + k, g, prompt_len[pid], filtered, rewards))
    return pd.DataFrame(rows).sample(frac=1.0, random_state=seed % 997).reset_index(drop=True)


def _response(rng, step, pid, sample_idx, group, prompt_len, filtered, rewards) -> dict:
    budget = int(rng.choice([16, 40, 96]))
    natural = int(rng.integers(0, 120))
    kind = rng.random()
    if natural >= budget:
        length, reason = budget, "length"  # truncated at its cap
    elif kind < 0.1:
        length, reason = natural, "abort"
    elif kind < 0.15:
        length, reason = natural, "policy_stop"
    else:
        length, reason = natural, "stop"
    reward = {"pm5": float(rng.choice([5.0, -5.0])), "unbounded": float(rng.normal(0.0, 1e3)),
              "binary": float(rng.integers(0, 2))}[rewards]
    trained = not filtered and not (reason == "abort" and rng.random() < 0.5)  # a group may train in part
    tokens = rng.integers(0, 5 if rng.random() < 0.2 else 1000, length).tolist()  # a few repetitive ones
    return {"step": step, "prompt_id": pid, "sample_idx": sample_idx, "group_id": group, "prompt_len": prompt_len,
            "response_len": length, "reward": reward, "finish_reason": reason, "max_tokens": budget, "trained": trained,
            # the early-exit signals measured from its tokens and log-probs, as an importer with tokens writes them
            **measure_response(tokens, (-rng.exponential(1.0, length)).tolist(), stride=16)}


def baseline(trace: pd.DataFrame, seed: int = 0):
    return simulate(Workload(validate_trace(trace), seed=seed), "baseline", SETUP, seed=seed)


RECORD = ["prompt_id", "response_len", "max_tokens", "finish_reason", "reward", "trained"]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31), rewards=st.sampled_from(REWARDS), n_steps=st.integers(1, 5))
def test_baseline_replays_any_trace_exactly(seed, rewards, n_steps):
    trace = validate_trace(real_like_trace(seed, rewards, n_steps))
    res = baseline(trace)
    steps, responses = res.steps, res.responses
    trace_steps = np.unique(trace["step"])
    assert len(steps) == len(trace_steps)  # every step, none more
    # per step: the trace's tokens, and every response as recorded
    assert steps["tokens"].tolist() == trace.groupby("step")["response_len"].sum().tolist()
    assert responses["exact"].all() and res.meta["sources"]["exact"] == len(trace)
    got = responses.assign(step=trace_steps[responses["step"]])
    key = ["step"] + RECORD
    pd.testing.assert_frame_equal(got[key].sort_values(key, ignore_index=True),
                                  trace[key].sort_values(key, ignore_index=True), check_dtype=False)
    # a group trains if any member of it did, as recorded; the books balance
    trained_groups = trace[trace["trained"]].groupby(["step", "prompt_id", "group_id"]).ngroups
    assert steps["groups_trained"].sum() == trained_groups
    assert (steps["responses_in"] == steps["finished"] + steps["truncated"] + steps["policy_stopped"]
            + steps["dropped"] + steps["carried_out"]).all()


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31), rewards=st.sampled_from(REWARDS))
def test_replay_is_deterministic_under_a_seed(seed, rewards):
    trace = real_like_trace(seed, rewards)
    a, b = baseline(trace, seed=3), baseline(trace, seed=3)
    pd.testing.assert_frame_equal(a.responses, b.responses)
    pd.testing.assert_frame_equal(a.steps, b.steps)


POLICIES = [p for p in available_policies() if p != "baseline"] + ["vade+april+breaker", "april+vade+breaker",
                                                                    "hadb+lpt", "segment+dapo"]


@pytest.mark.parametrize("policy", POLICIES)
@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**31), rewards=st.sampled_from(REWARDS))
def test_every_policy_runs_on_a_real_like_trace(policy, seed, rewards):
    trace = validate_trace(real_like_trace(seed, rewards, n_steps=5))
    res = simulate(Workload(trace, seed=seed), policy, SETUP, seed=seed)
    r, s = res.responses, res.steps
    assert len(r) and set(r["prompt_id"]) <= set(trace["prompt_id"])  # the trace's ids, as written
    assert (s["responses_in"] == s["finished"] + s["truncated"] + s["policy_stopped"] + s["dropped"]
            + s["carried_out"]).all()
    assert 0.0 <= r["exact"].mean() <= 1.0


BREAKS = [  # (column, bad value, what the message says)
    ("response_len", -1, "must be >= 0"),
    ("reward", np.inf, "infinite value"),
    ("reward", np.nan, "NaN not allowed"),
    ("prompt_id", "", "empty identifier"),
    ("trained", 2, "expected a bool"),
    ("max_tokens", 0, "must be >= 1"),
]


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31), which=st.integers(0, len(BREAKS) - 1), at=st.integers(0, 10**6))
def test_a_bad_cell_is_named_by_file_column_and_row(seed, which, at):
    trace = real_like_trace(seed, "unbounded")
    col, value, problem = BREAKS[which]
    row = at % len(trace)
    trace[col] = trace[col].astype(object)
    trace.loc[row, col] = value
    with pytest.raises(TraceError) as e:
        validate_trace(trace, source="run.parquet")
    assert str(e.value).startswith(f"run.parquet: column {col!r}: row {row}: {problem}"), str(e.value)


class Stream(PromptSource):
    """A data loader that is a cursor (as real_backend's TaskPrompts): batch k holds prompts 100k..100k+n-1,
    whatever step asks. It counts what is fetched."""

    def __init__(self, trace):
        from lssim.loop.core import PromptPool

        self.fetched: list[int] = []
        ids = np.arange(100 * 60)
        self.pool = PromptPool(ids, np.full(len(ids), 8))

    def default_groups(self, step, n_groups, group_size, max_tokens):
        from lssim.loop.core import GroupSpec

        k = len(self.fetched)
        self.fetched.append(step)
        return [GroupSpec(100 * k + i, group_size, max_tokens) for i in range(n_groups)]

    def prompt_len(self, prompt_id):
        return 8


@pytest.mark.parametrize("policy", ["baseline", "april", "segment(window=32)", "dapo", "hadb"])
def test_a_cursor_source_is_fetched_only_for_batches_that_are_used(policy):
    """The proposal takes a recorded batch whole (DataLoader.proposal_size), but never fetches a batch from a
    source of equal batches that the step does not draw from (carried groups fill it): such a source sees the
    same stream as before. (rollpacker is left out: it drops part of a proposal by design.)"""
    from lssim.loop.controller import RunConfig

    trace = validate_trace(real_like_trace(4, "binary", n_steps=5))
    source = Stream(trace)
    config = RunConfig(steps=12, groups_per_step=4, group_size=2, max_tokens=64, total_groups=24)
    res = simulate(Workload(trace), policy, SETUP, config=config, prompts=source)
    used = set((res.responses["prompt_id"] // 100).tolist())
    assert used == set(range(len(source.fetched))), (source.fetched, sorted(used))
    assert source.fetched == sorted(source.fetched)


def _own_trace(res) -> pd.DataFrame:
    """A run's own trace as the real backend's recorder writes one (real_backend/recorder.py::to_trace): each response
    at the step it was submitted in, with the loader batch its group came from."""
    r = res.responses
    return pd.DataFrame({"step": r["step"], "prompt_id": r["prompt_id"], "sample_idx": r["sample_idx"],
                         "group_id": r["group_id"], "prompt_len": r["prompt_len"], "response_len": r["response_len"],
                         "reward": r["reward"].fillna(0.0), "finish_reason": r["finish_reason"], "max_tokens": r["max_tokens"],
                         "trained": r["trained"], "batch": r["batch"], "loop_start": -1,
                         "entropy_mean": 0.6})


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31), policy=st.sampled_from(["april", "april+breaker", "oracle+april"]),
       batch_route=st.booleans())
def test_a_twin_replaying_a_run_that_draws_groups_ahead_answers_every_response_from_its_own_trace(seed, policy, batch_route):
    """april submits batch k + 1's groups in step k, and its trace records them there. The twin of that run (its own
    trace, the same data loader) asks for a loader group by its batch; the trace's `batch` column tells it where the
    run recorded it, so every response is answered exactly, as it was. Without the column they are modelled."""
    rng = np.random.default_rng(seed)
    lengths = np.minimum(rng.lognormal(3.5, 1.0, size=(12, 4, 4)).astype(int) + 1, 200)
    s, p, k = np.meshgrid(np.arange(12), np.arange(4), np.arange(4), indexing="ij")
    source = validate_trace(pd.DataFrame({
        "step": s.ravel(), "prompt_id": (s * 4 + p).ravel(), "sample_idx": k.ravel(), "prompt_len": 12,
        "response_len": lengths.ravel(), "reward": (lengths.ravel() % 2).astype(float),
        "finish_reason": np.where(lengths.ravel() >= 200, "length", "stop"), "max_tokens": 200, "loop_start": -1,
        "entropy_mean": 0.6}))
    # 6 steps' groups of the trace's 12: what april draws ahead is still in the trace, so the first run is exact too
    config = RunConfig(steps=12, groups_per_step=4, group_size=4, max_tokens=200, total_groups=24, seed=1)
    first = simulate(Workload(source), policy, SETUP, config=config, batch_route=batch_route)
    assert first.responses["exact"].all()
    own = validate_trace(_own_trace(first))
    assert (own["batch"] != own["step"]).any()  # it did draw ahead
    key = ["step", "prompt_id", "sample_idx", "response_len"]
    again = simulate(Workload(own), policy, SETUP, config=config, batch_route=batch_route, prompts=Workload(source))
    assert again.responses["exact"].all()
    pd.testing.assert_frame_equal(again.responses[key].sort_values(key, ignore_index=True),
                                  first.responses[key].sort_values(key, ignore_index=True))
    blind = simulate(Workload(own.drop(columns="batch")), policy, SETUP, config=config, batch_route=batch_route,
                     prompts=Workload(source))
    assert not blind.responses["exact"].all()  # asked by batch, the groups drawn ahead are modelled
