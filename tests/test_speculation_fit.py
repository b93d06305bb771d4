"""The measured speculation model (lssim.cost.speculative: SpecFit, fit_speculation, the live switch) and the tlt
policy's decisions, without vLLM: synthetic measurements with known parameters, hypothesis for the invariants."""

import json
import pickle

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lssim.loop.core import Speculation
from lssim.cost import ProfiledCostModel, SpeculativeCost
from lssim.cost.speculative import (MeasuredSpeculation, SpecFit, SpeculationSwitch, accepted_per_draft,
                                    fit_speculation, load_spec_fit, predicted_speedup)
from lssim.loop.policy import make_policy
from test_sim import make_trace, run

FAST = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# the shape of this CPU's profiled engine (real_backend/data/profile_cpu.json): a fixed cost, then ~linear in n
BASE = ProfiledCostModel(c0=2.2e-3, c1=5e-5, c2=3e-7, c3=1e-7, p0=3.6e-3, p1=2.7e-5)
FIT = SpecFit(overhead=0.15, verify_weight=0.5, draft_rate=0.9, draft_len=3.9)


def spec(alpha=0.2, max_batch=32, fit=FIT, switch=None):
    return MeasuredSpeculation(alpha=alpha, gamma=4, max_batch=max_batch, fit=fit, switch=switch)


# -- the measured factor -------------------------------------------------------------------------------------------

def test_measured_factor_is_the_fitted_step_cost_over_the_tokens_it_yields():
    cost = SpeculativeCost(BASE, spec())
    a = accepted_per_draft(0.2, 4)
    for n in (1, 2, 7, 32):
        m = n * (1 + 0.5 * 0.9 * 3.9)
        lo = int(m)
        t_m = BASE.decode_time(lo, 0, 1) + (m - lo) * (BASE.decode_time(lo + 1, 0, 1) - BASE.decode_time(lo, 0, 1))
        expected = 1.15 * t_m / ((1 + 0.9 * a) * BASE.decode_time(n, 0, 1))
        assert cost._raw_factor(n) == pytest.approx(expected)
    # not capped at 1: at low acceptance speculation is slower, and vLLM speculates anyway
    assert cost.factor(32) > 1.0 and cost.decode_time(32, 0, 10) > BASE.decode_time(32, 0, 10)
    # the idealized model (no fit) is capped: it never prices a slow-down
    assert SpeculativeCost(BASE, Speculation(alpha=0.2, gamma=4)).factor(32) <= 1.0


@FAST
@given(alpha=st.floats(0.0, 1.0), overhead=st.floats(0.0, 2.0), weight=st.floats(0.0, 3.0),
       rate=st.floats(0.05, 1.0), length=st.floats(0.5, 4.0), n=st.integers(1, 40), ctx=st.floats(0, 1e5),
       seconds=st.floats(1e-4, 5.0))
def test_measured_cost_is_monotone_in_the_batch_and_inverts_exactly(alpha, overhead, weight, rate, length, n, ctx, seconds):
    fit = SpecFit(overhead=overhead, verify_weight=weight, draft_rate=rate, draft_len=length)
    cost = SpeculativeCost(BASE, spec(alpha=alpha, fit=fit))
    factors = [cost.factor(k) for k in range(1, 33)]
    assert all(b >= a for a, b in zip(factors, factors[1:]))  # non-decreasing below the threshold
    k = cost.iterations_within(n, ctx, seconds)
    assert cost.decode_time(n, ctx, k) <= seconds < cost.decode_time(n, ctx, k + 1)
    assert cost.decode_time(n, ctx, 3) <= cost.decode_time(n + 1, ctx, 3) * (1 + 1e-12) or n == 32


def test_the_live_switch_turns_speculation_off_above_its_batch():
    switch = SpeculationSwitch(4)
    cost = SpeculativeCost(BASE, spec(alpha=0.9, switch=switch))
    assert cost.factor(4) < 1.0 and cost.factor(5) == 1.0
    switch.max_batch = 0
    assert cost.factor(1) == 1.0 and cost.decode_time(1, 0, 5) == BASE.decode_time(1, 0, 5)
    # the switch is live state, not part of what the engine is asked for; it pickles without its engine
    assert spec(switch=switch) == spec(switch=SpeculationSwitch(9)) == spec()
    switch.counters = lambda: {"drafts": 1}
    assert pickle.loads(pickle.dumps(switch)).counters is None


def test_spec_fit_and_its_profile_are_checked(tmp_path):
    for bad in (dict(overhead=-0.1, verify_weight=1), dict(overhead=0, verify_weight=float("nan")),
                dict(overhead=0, verify_weight=1, draft_rate=0.0)):
        with pytest.raises(ValueError, match="SpecFit"):
            SpecFit(**bad)
    with pytest.raises(ValueError, match="unknown keys"):
        SpecFit.from_dict({"overhead": 0, "verify_weight": 1, "speed": 2})
    with pytest.raises(ValueError, match="layer_skip"):
        MeasuredSpeculation(method="layer_skip", fit=FIT)
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"kind": "engine"}))
    with pytest.raises(ValueError, match=str(path)):
        load_spec_fit(path)


# -- fitting: synthetic measurements with known parameters --------------------------------------------------------

def synthetic(fit: SpecFit, alpha: float, cells_per_batch=2, batches=(1, 2, 4, 8, 16), seed=0):
    """measure_speculation.py's frames, made by the model itself: alt cells' steps at exactly the model's costs, and
    on/off cells whose makespans are the simulator's pricing of the same lengths."""
    rng = np.random.default_rng(seed)
    cost = SpeculativeCost(BASE, spec(alpha=alpha, fit=fit))
    a = accepted_per_draft(alpha, 4)
    steps, cells, cell = [], [], 0
    for rep in range(cells_per_batch):
        for b in batches:
            lengths = rng.integers(20, 200, size=b).tolist()
            plain_t = 1.0
            cells += [{"cell": cell, "repeat": rep, "batch": b, "mode": "on", "lengths": lengths,
                       "seconds": plain_t / predicted_speedup(cost, lengths)},
                      {"cell": cell, "repeat": rep, "batch": b, "mode": "off", "lengths": lengths, "seconds": plain_t}]
            for i in range(1, 40):
                n = int(rng.integers(1, b + 1))
                drafting = i % 2 == 0
                seconds = BASE.decode_time(n, 0, 1) * (cost._raw_factor(n) * (1 + fit.draft_rate * a) if drafting else 1.0)
                drafts = n * fit.draft_rate if drafting else 0
                steps.append({"cell": cell, "mode": "alt", "step_index": i, "prompt_tokens": 0, "running": n,
                              "seconds": seconds, "drafts": drafts, "draft_tokens": drafts * fit.draft_len,
                              "accepted_tokens": drafts * a})
                steps.append({"cell": cell, "mode": "on", "step_index": i, "prompt_tokens": 0, "running": n,
                              "seconds": seconds, "drafts": n * fit.draft_rate, "draft_tokens": n * fit.draft_rate * fit.draft_len,
                              "accepted_tokens": n * fit.draft_rate * a})
            cell += 1
    return pd.DataFrame(cells), pd.DataFrame(steps)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(overhead=st.floats(0.0, 0.5), weight=st.sampled_from([0.0, 0.3, 1.0, 2.0]), alpha=st.floats(0.05, 0.8))
def test_fit_recovers_known_parameters_and_predicts_held_out_speedups(overhead, weight, alpha):
    truth = SpecFit(overhead=overhead, verify_weight=weight, draft_rate=0.9, draft_len=3.9)
    cells, steps = synthetic(truth, alpha)
    fit, info = fit_speculation(cells, steps, BASE, 4, train=cells.loc[cells["repeat"] == 0, "cell"].unique())
    assert fit.draft_rate == pytest.approx(0.9) and fit.draft_len == pytest.approx(3.9)
    assert info["alpha"] == pytest.approx(alpha, abs=1e-3)
    assert fit.verify_weight == pytest.approx(weight, abs=0.011) and fit.overhead == pytest.approx(overhead, abs=0.01)
    assert info["cells"] and all(c["batch"] in (1, 2, 4, 8, 16) for c in info["cells"])
    assert info["speedup_error_points"]["max_abs"] < 1.0  # held-out cells: within a point


def test_fit_refuses_measurements_without_drafts():
    cells, steps = synthetic(FIT, 0.3)
    steps["drafts"] = 0
    with pytest.raises(ValueError, match="no drafts"):
        fit_speculation(cells, steps, BASE, 4)


# -- the tlt policy ---------------------------------------------------------------------------------------------------

def write_profile(path, fit=FIT, alpha=0.2):
    path.write_text(json.dumps({"kind": "speculation_profile", "fit": {"params": fit.__dict__, "alpha": alpha}}))
    return str(path)


def cost_profile(path):
    BASE.to_json(path)
    return str(path)


@pytest.fixture
def profiles(tmp_path):
    return write_profile(tmp_path / "spec.json"), cost_profile(tmp_path / "cost.json")


@FAST
@given(a=st.floats(0.0, 1.0), b=st.floats(0.0, 1.0))
def test_tlt_speculates_at_more_batch_sizes_the_better_the_acceptance(a, b):
    tlt = TLT_CACHE.setdefault("tlt", make_policy(f"tlt(profile={PROFILES[0]!r}, cost_profile={PROFILES[1]!r})"))
    lo, hi = sorted((a, b))
    assert 0 <= tlt.threshold(lo) <= tlt.threshold(hi) <= 32
    n = tlt.threshold(lo)  # where it speculates, the measured model says it pays
    cost = SpeculativeCost(tlt.base, spec(alpha=lo, fit=tlt.fit))
    assert all(cost._raw_factor(k) < 1.0 for k in range(1, n + 1))
    assert n == 32 or cost._raw_factor(n + 1) >= 1.0 - tlt.margin


TLT_CACHE: dict = {}
PROFILES: list = []


@pytest.fixture(autouse=True)
def _profiles_for_hypothesis(tmp_path_factory):
    if not PROFILES:
        d = tmp_path_factory.mktemp("tlt")
        PROFILES.extend([write_profile(d / "spec.json"), cost_profile(d / "cost.json")])


def test_tlt_follows_the_engines_counters_and_records_each_decision(profiles):
    tlt = make_policy(f"tlt(profile={profiles[0]!r}, cost_profile={profiles[1]!r}, prior_drafts=10)")
    assert tlt.needs().speculation.switch is tlt.switch and tlt.needs().speculation.fit == FIT
    low = tlt.threshold(0.2)
    counts = {"drafts": 0, "accepted_tokens": 0}
    tlt.switch.counters = lambda: dict(counts)
    ctx = type("Ctx", (), {"step": 0})()
    assert tlt.plan(ctx, ["g"]) == ["g"] and tlt.switch.max_batch == low
    counts.update(drafts=5000, accepted_tokens=5000 * accepted_per_draft(0.8, 4))  # the drafts turn out good
    ctx.step = 1
    tlt.plan(ctx, [])
    assert tlt.decisions[-1]["alpha"] == pytest.approx(0.8, abs=0.01) and tlt.switch.max_batch > low
    counts.update(drafts=10**6, accepted_tokens=0)  # ... then useless: off everywhere
    ctx.step = 2
    tlt.plan(ctx, [])
    assert tlt.switch.max_batch == 0
    assert [d["step"] for d in tlt.decisions] == [0, 1, 2] and tlt.decisions[2]["drafts"] == 10**6
    probing = make_policy(f"tlt(profile={profiles[0]!r}, cost_profile={profiles[1]!r}, probe_every=2)")
    probing.switch.counters = lambda: {"drafts": 10**6, "accepted_tokens": 0}
    ctx.step = 4
    probing.plan(ctx, [])
    assert probing.switch.max_batch == 1  # off, but every second step a lone survivor speculates to keep measuring


def test_tlt_in_the_simulator_is_the_baseline_where_speculation_never_pays(profiles, tmp_path):
    trace = make_trace([[[300, 40, 40]], [[200, 50, 10]]])
    plain, _ = run(trace, "baseline", n_instances=1)
    useless = write_profile(tmp_path / "bad.json", alpha=0.0)
    off, engine = run(trace, f"tlt(profile={useless!r}, cost_profile={profiles[1]!r})", n_instances=1)
    assert engine.speculated_tokens == 0
    assert off.steps["rollout_seconds"].tolist() == pytest.approx(plain.steps["rollout_seconds"].tolist())
    good = write_profile(tmp_path / "good.json", fit=SpecFit(overhead=0.0, verify_weight=0.1, draft_rate=1.0, draft_len=4.0), alpha=0.8)
    fast, engine = run(trace, f"tlt(profile={good!r}, cost_profile={profiles[1]!r})", n_instances=1)
    assert engine.speculated_tokens > 0
    assert fast.steps["rollout_seconds"].sum() < plain.steps["rollout_seconds"].sum()


def test_spec_tail_with_a_profile_prices_the_measured_slow_down(tmp_path):
    slow_fit = SpecFit(overhead=0.5, verify_weight=0.5, draft_rate=0.9, draft_len=3.9)  # as on this CPU, and worse
    tail = make_policy(f"spec_tail(profile={write_profile(tmp_path / 'slow.json', fit=slow_fit)!r})")
    s = tail.needs().speculation
    assert isinstance(s, MeasuredSpeculation) and s.fit == slow_fit and s.alpha == pytest.approx(0.2)
    trace = make_trace([[[300, 200, 100]]])
    plain, _ = run(trace, "baseline", n_instances=1)
    slow, engine = run(trace, tail, n_instances=1)
    assert all(engine.cost.factor(n) > 1.0 for n in (1, 2, 3))  # slower at every batch the response runs at
    assert slow.steps["rollout_seconds"].iloc[0] > plain.steps["rollout_seconds"].iloc[0]
    assert make_policy("spec_tail").needs().speculation == Speculation()  # without a profile: as before
