"""The batch route for policies with rollout hooks, against the event engine: stops at progress checkpoints
(breaker, early_exit: Policy.progress_stops, lssim.sim.event_kernels), top-ups (dapo) and on_finish's array form
(lpt, breaker: Policy.on_finishes). Each run is made twice, batch route allowed and event engine alone, on generated
traces with loops, collapses and confident stretches, small KV caches (preemption), several steps and instances; the
steps, the responses and the engine's counters must agree (tests/test_fastpath.py's assert_same_run), and the runs
must stop what they say they stop.
"""

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lssim.cost import ProfiledCostModel
from lssim.loop.policy import make_policy
from lssim.sim.checkpoints import Checkpoints
from lssim.loop.signals import SignalSpec, signals_from_trace, signals_from_trace_many
from lssim.traces.workload import Workload
from test_fastpath import PROFILED, ROOFLINE, assert_same_run, make_trace, run

STOPPING = ["breaker(check_every=16, min_tokens=32, patience=2)", "breaker(check_every=7, min_tokens=0, patience=1, stop_reward=None)",
            "early_exit(check_every=8, min_tokens=16, patience=2)", "breaker(check_every=16, min_tokens=32)+lpt",
            "lpt+early_exit(check_every=8, min_tokens=16, patience=2)+dapo"]
ROUTED = STOPPING + ["dapo", "dapo(gen_batch_factor=0.5, max_gen_batches=3)", "lpt", "lpt+dapo"]


def labelled_trace(rng: np.random.Generator, steps: int, prompts: int, group: int, max_len: int) -> pd.DataFrame:
    """make_trace's with the synthesizer's labels varied: loops, entropy collapses, low and high entropy."""
    trace = make_trace(rng, steps, prompts, group, max_len)
    n, length = len(trace), trace["response_len"].to_numpy()
    marked = lambda p: np.where(rng.random(n) < p, (rng.random(n) * length).astype(np.int64), -1)  # noqa: E731
    return trace.assign(loop_start=marked(0.3), entropy_collapse_start=marked(0.2),
                        entropy_mean=rng.choice([0.02, 0.05, 0.6, 1.2, 3.0], n))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31), steps=st.integers(1, 3), prompts=st.integers(1, 6), group=st.integers(1, 4),
       max_len=st.integers(1, 300), n_instances=st.integers(1, 3), max_num_seqs=st.integers(1, 8),
       slack=st.integers(0, 400), policy=st.sampled_from(ROUTED), cost=st.sampled_from([PROFILED, ROOFLINE]),
       mode=st.sampled_from(["collocated", "disaggregated", "hybrid"]))
def test_rollout_hooks_on_the_batch_route_equal_the_event_engine(seed, steps, prompts, group, max_len, n_instances,
                                                                  max_num_seqs, slack, policy, cost, mode):
    trace = labelled_trace(np.random.default_rng(seed), steps, prompts, group, max_len)
    kv = int(trace["prompt_len"].max() + trace["max_tokens"].max()) + slack  # a request may ask the run's budget  # small: most runs preempt
    assert_same_run(trace, policy, cost, n_instances, max_num_seqs, kv, mode)


@pytest.mark.parametrize("policy", STOPPING[:3])
def test_stops_on_the_batch_route_happen_and_agree(policy):
    """Long responses in a small cache: many stops, some at boundaries that also finish, admit and preempt."""
    trace = labelled_trace(np.random.default_rng(11), steps=3, prompts=12, group=6, max_len=600)
    fast, engine = assert_same_run(trace, policy, ROOFLINE, 2, 16, 2500, "collocated")
    stopped = fast.responses["finish_reason"] == "policy_stop"
    assert engine._batch and stopped.sum() > 20 and engine.preemptions > 0
    assert fast.responses.loc[stopped, "finish_time"].isna().all()  # as the event route leaves a stopped response


def test_an_engine_whose_aborts_cost_time_keeps_stops_on_the_event_engine():
    """An abort blocks the caller (cost.abort_time > 0): the clock moves under the other instances, which the batch
    route does not model, so a stopping policy runs on the event engine; one that never stops keeps the batch route."""
    trace = labelled_trace(np.random.default_rng(2), steps=2, prompts=4, group=4, max_len=100)
    slow_aborts = ProfiledCostModel(c0=1e-3, c1=1e-5, c2=1e-9, p0=1e-4, p1=1e-6, abort_seconds=1e-3)
    _, engine = run(trace, "breaker(check_every=16, min_tokens=32)", slow_aborts, 2, 8, 10**6, "collocated", batch_route=True)
    assert not engine._batch
    _, engine = run(trace, "lpt", slow_aborts, 2, 8, 10**6, "collocated", batch_route=True)
    assert engine._batch


def test_policies_that_steer_single_events_keep_the_event_engine():
    """april's end of rollout, segment's carries, seer's requeues, rollpacker's finishes read mid-rollout, two
    policies' stops side by side: the event engine."""
    for policy in ("april", "segment", "seer", "rollpacker", "breaker+early_exit", "april+breaker"):
        assert make_policy(policy).reacts_to_events(), policy
    for policy in ("dapo", "lpt", "breaker", "early_exit", "lpt+dapo+breaker"):
        assert not make_policy(policy).reacts_to_events(), policy


@settings(max_examples=200, deadline=None)
@given(generated=st.lists(st.integers(0, 3000), min_size=1, max_size=30), seed=st.integers(0, 2**31),
       text=st.sampled_from([float("nan"), 0.7]), budget=st.integers(2, 4000))
def test_the_signal_model_over_arrays_equals_the_scalar_one_bit_for_bit(generated, seed, text, budget):
    rng = np.random.default_rng(seed)
    n = len(generated)
    g = np.array(generated)
    loop, collapse = rng.integers(-1, 2000, n), rng.integers(-1, 2000, n)
    entropy = rng.choice([float("nan"), 0.01, 0.5, 3.0], n)
    window = SignalSpec().windows_for(np.full(n, budget))
    many = signals_from_trace_many(g, loop, collapse, entropy, text, window)
    for j in range(n):
        one = signals_from_trace(int(g[j]), int(loop[j]), int(collapse[j]), float(entropy[j]), text, int(window[j]))
        for name, value in one.items():
            assert many[name][j] == value or (np.isnan(value) and np.isnan(many[name][j])), (name, j)


def _random_checkpoints(seed: int, interval: int):
    """12 responses of a generated world's Workload, each with a length, the tokens it had before, a trace row and a
    budget, and their Checkpoints every `interval` tokens: (wl, n, length, start, rows, budget, points)."""
    rng = np.random.default_rng(seed)
    wl = Workload(labelled_trace(rng, steps=2, prompts=3, group=3, max_len=200))
    n = 12
    length, start = rng.integers(0, 200, n), rng.integers(0, 60, n)
    rows, budget = rng.integers(0, len(wl.signals.source), n), rng.integers(2, 400, n)
    return wl, n, length, start, rows, budget, Checkpoints(length, start, interval, budget, rows, wl.signals, SignalSpec())


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31), interval=st.integers(1, 50))
def test_checkpoints_are_the_event_engines(seed, interval):
    """Every multiple of the interval strictly inside a response, after what it had generated, in order; and the
    windows there are the Workload's scalar answers."""
    wl, n, length, start, rows, budget, points = _random_checkpoints(seed, interval)
    seen = {j: [] for j in range(n)}
    for live, generated, signals, has in points:
        for k, (j, g) in enumerate(zip(live.tolist(), generated.tolist())):
            seen[j].append(g)
            want = wl.signals.window(int(rows[j]), g, SignalSpec(), int(budget[j]))
            assert has[k] == (want is not None)
            for name, value in (want or {}).items():
                assert signals[name][k] == value or (np.isnan(value) and np.isnan(signals[name][k]))
    for j in range(n):
        first = (start[j] // interval + 1) * interval
        assert seen[j] == list(range(first, length[j], interval))


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31), interval=st.integers(1, 50), patience=st.integers(1, 3))
def test_all_checkpoints_at_once_are_the_iterations_and_count_as_a_rule_does(seed, interval, patience):
    """Checkpoints.flat: the iteration's checkpoints and signals, response by response; its counters of checks in a
    row (streaks) are the ones a rule keeps checkpoint by checkpoint, and first_hits the first checkpoint that hits."""
    wl, n, length, start, rows, budget, points = _random_checkpoints(seed, interval)
    flat = points.flat()
    by_row = {j: [] for j in range(n)}
    for live, generated, signals, has in points:
        for k, j in enumerate(live.tolist()):
            by_row[j].append((generated[k], has[k], *(signals[name][k] for name in sorted(signals))))
    signals, has = flat.signals()
    flat_rows = [(flat.generated[k], has[k], *(signals[name][k] for name in sorted(signals))) for k in range(len(flat.rows))]
    rng = np.random.default_rng(seed)
    at = rng.permutation(len(flat.rows))[:5]
    some, some_has = flat.signals_at(at)
    assert some_has.tolist() == has[at].tolist()
    assert all(np.array_equal(some[name], signals[name][at], equal_nan=True) for name in signals)
    stride = 1 + seed % 3
    every, every_rows = flat.every(stride)
    assert every.tolist() == [k for k in range(len(flat.rows)) if (k - flat.starts[flat.rows[k]]) % stride == stride - 1]
    assert every_rows.tolist() == flat.rows[every].tolist()
    columns = 2 + len(signals)
    assert np.array_equal(np.array([x for j in range(n) for x in by_row[j]], float).reshape(-1, columns),
                          np.array(flat_rows, float).reshape(-1, columns), equal_nan=True)
    assert flat.rows.tolist() == [j for j in range(n) for _ in by_row[j]]
    state = rng.integers(0, 3, len(flat.rows))  # 0 unchanged, 1 counted, 2 reset
    counted, reset = state == 1, state == 2
    want, run, last = [], 0, -1
    for k, j in enumerate(flat.rows.tolist()):
        run = 0 if j != last else run
        last = j
        run = run + 1 if counted[k] else 0 if reset[k] else run
        want.append(run)
    runs = flat.streaks(counted, reset)
    assert runs.tolist() == want
    index, tokens = flat.first_hits(runs >= patience)
    for j in range(n):
        hits = [k for k in range(len(flat.rows)) if flat.rows[k] == j and runs[k] >= patience]
        assert index[j] == (hits[0] if hits else -1)
        assert tokens[j] == (flat.generated[hits[0]] if hits else -1)


@pytest.mark.parametrize("interval", [1, 7, 32, 100])
def test_checkpoints_read_measured_signals_as_the_event_engine(interval):
    """A trace with signals measured from tokens (lssim.traces.signal_trace): the windows over arrays are the scalar ones."""
    from test_early_exit import LENGTHS, measured_trace

    wl = Workload(measured_trace([True, False, True, False], [1.0, 1.0, 0.0, 1.0]))
    rows = np.arange(len(LENGTHS))
    budget = np.full(len(rows), 1024)
    points = Checkpoints(np.array(LENGTHS) + 5, np.zeros(len(rows), np.int64), interval, budget, rows, wl.signals, SignalSpec())
    checked = 0
    for live, generated, signals, has in points:
        for k, (j, g) in enumerate(zip(live.tolist(), generated.tolist())):
            want = wl.signals.window(j, g, SignalSpec(), 1024)
            assert has[k] and want is not None
            for name, value in want.items():
                assert signals[name][k] == value or (np.isnan(value) and np.isnan(signals[name][k])), (name, g)
            checked += 1
    assert checked == sum(len(range(interval, n + 5, interval)) for n in LENGTHS)


@pytest.mark.parametrize("policy", ["early_exit(check_every=32, min_tokens=64, patience=3)", "breaker(check_every=40, min_tokens=64)"])
def test_stops_on_measured_signals_agree(policy):
    from test_early_exit import measured_trace

    trace = measured_trace([True, False, True, False], [1.0, 1.0, 0.0, 1.0])
    fast, _ = assert_same_run(trace, policy, ROOFLINE, 2, 2, 1400, "collocated")
    assert policy.startswith("breaker") or (fast.responses["finish_reason"] == "policy_stop").sum() == 2


def test_checkpoints_split_spans_as_the_event_engine_so_ties_between_instances_pop_alike():
    """One prompt's samples on three instances run in step: their events tie in time to the last bit. Every
    checkpoint splits a span on the event engine (a few ulps apart from the span whole), so the batch route splits
    it too; with only the stopped responses' checkpoints, a finish and a stop at the same time popped the other way."""
    trace = labelled_trace(np.random.default_rng(1249345870), steps=3, prompts=1, group=4, max_len=370)
    kv = int((trace["prompt_len"] + trace["max_tokens"]).max()) + 203
    for cost in (PROFILED, ROOFLINE):
        assert_same_run(trace, "early_exit(check_every=8, min_tokens=16, patience=2)+dapo", cost, 3, 3, kv, "collocated")


def test_a_rollout_with_stops_that_outgrows_its_first_room_is_run_again_with_more(monkeypatch):
    import lssim.sim.fastsim as fastsim

    calls = []
    schedule = fastsim.schedule_stops

    def counted(*args):
        calls.append(args[7])  # its room
        return schedule(*args)

    monkeypatch.setattr(fastsim, "records_room", lambda n_requests, n_instances: 2)
    monkeypatch.setattr(fastsim, "checkpoint_room", lambda length, gen, interval: 0)
    monkeypatch.setattr(fastsim, "schedule_stops", counted)
    trace = labelled_trace(np.random.default_rng(5), steps=2, prompts=8, group=4, max_len=600)
    fast, engine = assert_same_run(trace, "breaker(check_every=16, min_tokens=32, patience=2)", ROOFLINE, 2, 16, 2000, "collocated")
    assert 2 in calls and max(calls) >= 128 and engine.preemptions > 0
    assert (fast.responses["finish_reason"] == "policy_stop").any()


def _mixed_sources(trace: pd.DataFrame, rng: np.random.Generator, stride: int = 8) -> pd.DataFrame:
    """Some rows' signals measured (random values every `stride` tokens), the others modelled from their labels."""
    measured = rng.random(len(trace)) < 0.5
    counts = np.where(measured, trace["response_len"].to_numpy(np.int64) // stride, 0)
    return trace.assign(signal_source=np.where(measured, "measured", "synthetic"), signal_window=64, signal_ngram=4,
                        signal_stride=stride, signal_repetition=[rng.random(k).astype(np.float32) for k in counts],
                        signal_entropy=[rng.choice([0.01, 0.5, 2.0], k).astype(np.float32) for k in counts])


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31), interval=st.integers(1, 50),
       names=st.sets(st.sampled_from(["repetition", "entropy", "tokens", "window"]), min_size=1))
def test_checkpoint_windows_of_some_fields_are_those_of_all(seed, interval, names):
    """A rule that asks for fewer window fields (early_exit: entropy) gets exactly those, bit for bit, on modelled
    and measured rows alike."""
    rng = np.random.default_rng(seed)
    wl = Workload(_mixed_sources(labelled_trace(rng, steps=2, prompts=3, group=3, max_len=200), rng))
    n = 12
    length, start = rng.integers(0, 200, n), rng.integers(0, 60, n)
    rows, budget = rng.integers(0, len(wl.signals.source), n), rng.integers(2, 400, n)
    flat = Checkpoints(length, start, interval, budget, rows, wl.signals, SignalSpec()).flat()
    every = np.arange(flat.starts[-1])
    full, has = flat.signals_at(every)
    some, some_has = flat.signals_at(every, names=tuple(names))
    assert set(some) == names and np.array_equal(some_has, has)
    assert all(np.array_equal(some[name], full[name], equal_nan=True) for name in names)


def test_checkpoint_windows_refuse_a_field_they_do_not_have():
    wl = Workload(labelled_trace(np.random.default_rng(0), steps=1, prompts=2, group=2, max_len=50))
    points = Checkpoints(np.array([40]), np.array([0]), 8, np.array([64]), np.array([0]), wl.signals, SignalSpec())
    with pytest.raises(ValueError, match="no window field named \\['perplexity'\\]"):
        points.windows(np.array([0]), np.array([8]), ("entropy", "perplexity"))
