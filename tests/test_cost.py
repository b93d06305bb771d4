"""Tests for lssim.cost: closed-form exactness, monotonicity, inverse, roofline sanity, profiled fit."""

import json
import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lssim.cost import (
    HARDWARE,
    MODELS,
    CostModel,
    Hardware,
    ModelSpec,
    ProfiledCostModel,
    RooflineCostModel,
    SpeculativeCost,
    kv_capacity_tokens,
    peak_tokens_per_second,
    solo_decode_time,
)

COST_MODELS = {
    "roofline-7b-h100": RooflineCostModel("qwen2.5-7b", "H100"),
    # A100 has a low FLOP/byte ratio, so spans often cross from compute- to memory-bound.
    "roofline-32b-a100-tp2": RooflineCostModel("qwen2.5-32b", "A100", tp=2, mfu=0.3, iteration_overhead_s=0.0),
    "profiled-linear": ProfiledCostModel(4e-3, 2e-5, 3e-8, p0=2e-3, p1=3e-5),
    "profiled-quadratic": ProfiledCostModel(4e-3, 2e-5, 3e-8, 1e-8, p0=2e-3, p1=3e-5),
}
model_names = st.sampled_from(sorted(COST_MODELS))
n_seqs = st.integers(1, 1024)
per_seq_ctx = st.floats(1.0, 32768.0)
iters = st.integers(0, 3000)


def rel_close(a, b, rel=1e-9):
    return abs(a - b) <= rel * max(abs(a), abs(b), 1e-300)


def test_protocol_and_describe():
    for model in COST_MODELS.values():
        assert isinstance(model, CostModel)
        assert isinstance(model.name, str) and model.name
        json.dumps(model.describe())  # reports must be serialisable


@settings(max_examples=150, deadline=None)
@given(model_names, n_seqs, per_seq_ctx, iters)
def test_span_equals_sum_of_single_iterations(name, n, c, k):
    cost = COST_MODELS[name]
    ctx = n * c
    singles = math.fsum(cost.decode_time(n, ctx + n * i, 1) for i in range(k))
    assert rel_close(cost.decode_time(n, ctx, k), singles)


@settings(max_examples=200, deadline=None)
@given(model_names, n_seqs, per_seq_ctx, iters, iters)
def test_additivity(name, n, c, a, b):
    cost = COST_MODELS[name]
    ctx = n * c
    whole = cost.decode_time(n, ctx, a + b)
    assert rel_close(whole, cost.decode_time(n, ctx, a) + cost.decode_time(n, ctx + n * a, b))


@settings(max_examples=200, deadline=None)
@given(model_names, n_seqs, per_seq_ctx, iters, st.integers(0, 64), st.floats(0, 5000), st.integers(0, 100))
def test_monotone_in_every_argument(name, n, c, k, dn, dctx, dk):
    cost = COST_MODELS[name]
    ctx = n * c
    base = cost.decode_time(n, ctx, k)
    assert cost.decode_time(n + dn, ctx, k) >= base
    assert cost.decode_time(n, ctx + dctx, k) >= base
    assert cost.decode_time(n, ctx, k + dk) >= base
    tok = int(c)
    assert cost.prefill_time(tok + dn) >= cost.prefill_time(tok) >= 0


@settings(max_examples=200, deadline=None)
@given(model_names, st.integers(0, 100_000), st.integers(0, 100_000))
def test_prefill_is_subadditive(name, a, b):
    """Pricing several prompts as one prefill call never overstates their prefill."""
    cost = COST_MODELS[name]
    assert cost.prefill_time(a + b) <= cost.prefill_time(a) + cost.prefill_time(b) * (1 + 1e-12)


def test_zero_cases():
    for cost in COST_MODELS.values():
        assert cost.decode_time(8, 1000.0, 0) == 0.0
        assert cost.decode_time(0, 0.0, 10) == 0.0
        assert cost.prefill_time(0) == 0.0
        assert cost.iterations_within(8, 1000.0, 0.0) == 0
        assert cost.iterations_within(8, 1000.0, -1.0) == 0
        with pytest.raises(ValueError):
            cost.iterations_within(0, 0.0, 1.0)
        with pytest.raises(ValueError):
            cost.iterations_within(1, 0.0, float("inf"))


@settings(max_examples=300, deadline=None)
@given(model_names, n_seqs, per_seq_ctx, st.integers(0, 20000), st.floats(0.0, 1.0))
def test_iterations_within_is_exact_inverse(name, n, c, k_ref, frac):
    cost = COST_MODELS[name]
    ctx = n * c
    seconds = cost.decode_time(n, ctx, k_ref) * frac if frac < 1.0 else cost.decode_time(n, ctx, k_ref)
    k = cost.iterations_within(n, ctx, seconds)
    assert cost.decode_time(n, ctx, k) <= seconds < cost.decode_time(n, ctx, k + 1)
    if frac == 1.0:
        assert k == k_ref  # an exact span time maps back to its own length


def test_roofline_span_crosses_regimes():
    """A big batch with short contexts starts compute-bound and turns memory-bound as KV grows;
    the closed form must match the per-iteration sum across the switch."""
    cost = COST_MODELS["roofline-32b-a100-tp2"]
    n, ctx, k = 512, 512 * 100.0, 8000
    assert cost.iteration_breakdown(n, ctx)["bound"] == "compute"
    assert cost.iteration_breakdown(n, ctx + n * k)["bound"] == "memory"
    singles = math.fsum(cost.decode_time(n, ctx + n * i, 1) for i in range(k))
    assert rel_close(cost.decode_time(n, ctx, k), singles)


def test_roofline_7b_h100_sanity():
    cost = RooflineCostModel(MODELS["qwen2.5-7b"], HARDWARE["H100"])
    # Batch 1: memory-bound on the ~15 GB weight read, ~4-6 ms per token.
    one = cost.decode_time(1, 1000.0, 1)
    assert 4e-3 <= one <= 6e-3
    assert cost.iteration_breakdown(1, 1000.0)["bound"] == "memory"
    # Batch 256 with 4k-token contexts: bandwidth-bound, dominated by the KV read.
    b = cost.iteration_breakdown(256, 256 * 4096.0)
    assert b["bound"] == "memory" and b["kv_read_s"] > b["weight_read_s"]
    tput_1 = 1 / one
    tput_256 = 256 / cost.decode_time(256, 256 * 4096.0, 1)
    assert tput_256 > 20 * tput_1
    # Faster memory helps a memory-bound decode; more GPUs help too.
    assert RooflineCostModel("qwen2.5-7b", "H200").decode_time(1, 1000.0, 1) < one
    assert RooflineCostModel("qwen2.5-7b", "H100", tp=2).decode_time(1, 1000.0, 1) < one
    # Prefill of 1000 tokens: tens of ms (compute-bound).
    assert 0.01 < cost.prefill_time(1000) < 0.1


def test_kv_capacity():
    cap = kv_capacity_tokens("qwen2.5-7b", "H100")
    assert 3e5 <= cap <= 1.5e6  # vLLM reports ~1M tokens for Qwen2.5-7B on one 80 GB GPU at 0.9
    assert kv_capacity_tokens("qwen2.5-7b", "H200") > cap
    assert kv_capacity_tokens("qwen2.5-7b", "H100", gpu_memory_utilization=0.5) < cap
    assert kv_capacity_tokens("qwen2.5-32b", "H100", tp=2) > kv_capacity_tokens("qwen2.5-32b", "H100", tp=1)
    assert kv_capacity_tokens("qwen2.5-32b", "A100", gpu_memory_utilization=0.3) == 0  # weights do not fit


def test_model_specs_match_published_configs():
    # (vocab, intermediate, tied embeddings, qkv bias) from each model's config.json
    extra = {
        "qwen2.5-7b": (152064, 18944, False, True),
        "qwen2.5-1.5b": (151936, 8960, True, True),
        "qwen2.5-32b": (152064, 27648, False, True),
        "llama3-8b": (128256, 14336, False, False),
        "tiny-ref": (64, 512, True, False),
    }
    for key, (vocab, inter, tied, bias) in extra.items():
        m = MODELS[key]
        h, q, kv = m.hidden, m.n_heads * m.head_dim, m.n_kv_heads * m.head_dim
        attn = h * q + 2 * h * kv + q * h + ((q + 2 * kv) if bias else 0)
        params = vocab * h * (1 if tied else 2) + m.n_layers * (attn + 3 * h * inter + 2 * h) + h
        assert m.params == params, key
    assert MODELS["qwen2.5-7b"].kv_bytes_per_token == 2 * 28 * 4 * 128 * 2
    assert MODELS["llama3-8b"].weight_bytes == 2 * 8_030_261_248
    assert MODELS["tiny-ref"].n_layers == 2 and MODELS["tiny-ref"].hidden == 128


def test_spec_validation():
    with pytest.raises(ValueError, match="n_layers"):
        ModelSpec(1000, 0, 128, 4, 4, 32)
    with pytest.raises(ValueError, match="multiple of n_kv_heads"):
        ModelSpec(1000, 2, 128, 4, 3, 32)
    with pytest.raises(ValueError, match="bandwidth"):
        Hardware("x", 1e9, -1.0, 1e12)
    with pytest.raises(ValueError, match="unknown model"):
        RooflineCostModel("nope", "H100")
    with pytest.raises(ValueError, match="mfu"):
        RooflineCostModel("qwen2.5-7b", "H100", mfu=1.5)


def test_lower_bound_helpers():
    cost = COST_MODELS["roofline-7b-h100"]
    solo = solo_decode_time(cost, 500, 1000)
    assert solo == pytest.approx(cost.prefill_time(500) + cost.decode_time(1, 500, 1000))
    # Sharing the engine can only be slower than decoding alone.
    assert cost.decode_time(64, 64 * 500.0, 1000) >= cost.decode_time(1, 500.0, 1000)
    peak = peak_tokens_per_second(cost, 256, 1000.0)
    assert peak == pytest.approx(256 / cost.decode_time(256, 256 * 1000.0, 1))  # sub-linear: max at the top
    # Superlinear batch cost: the peak is at an interior batch size, not at max_num_seqs.
    quad = ProfiledCostModel(4e-3, 0.0, 0.0, 1e-6)
    peak_q = peak_tokens_per_second(quad, 1024, 0.0)
    assert peak_q > 1024 / quad.decode_time(1024, 0.0, 1)
    assert peak_q == pytest.approx(max(n / quad.decode_time(n, 0.0, 1) for n in range(1, 1025)))


# -- profiled model -----------------------------------------------------------------------------

TRUE = dict(c0=3e-3, c1=4e-5, c2=2e-8, p0=5e-3, p1=6e-5)


def synthetic(seed=0, noise=0.02, rows=400):
    rng = np.random.default_rng(seed)
    n = rng.integers(1, 257, rows)
    ctx = n * rng.uniform(100, 8000, rows)
    t = TRUE["c0"] + TRUE["c1"] * n + TRUE["c2"] * ctx
    decode = pd.DataFrame({"n_seqs": n, "ctx_tokens": ctx, "seconds": t * rng.lognormal(0, noise, rows)})
    tok = rng.integers(16, 4096, 100)
    prefill = pd.DataFrame({"prefill_tokens": tok,
                            "seconds": (TRUE["p0"] + TRUE["p1"] * tok) * rng.lognormal(0, noise, 100)})
    return decode, prefill


def test_profiled_fit_recovers_coefficients():
    decode, prefill = synthetic()
    model = ProfiledCostModel.fit(decode, prefill)
    for key, value in TRUE.items():
        assert getattr(model, key) == pytest.approx(value, rel=0.05), key
    assert model.c3 == 0.0
    err = model.fit_error(decode)
    assert set(err) == {"median_ape_pct", "p90_ape_pct", "max_ape_pct", "n_points"}
    assert err["median_ape_pct"] < 3 and err["n_points"] == len(decode)
    assert model.fit_stats == err
    # Noise-free data is fitted (near) exactly; the quadratic form finds c3 ~ 0.
    exact = ProfiledCostModel.fit(synthetic(noise=0.0)[0], quadratic_n=True)
    assert exact.fit_error(decode.assign(seconds=TRUE["c0"] + TRUE["c1"] * decode.n_seqs
                                         + TRUE["c2"] * decode.ctx_tokens))["max_ape_pct"] < 1e-4
    assert exact.c3 < 1e-12


def test_profiled_json_roundtrip(tmp_path):
    decode, prefill = synthetic()
    model = ProfiledCostModel.fit(decode, prefill, name="vllm-h100")
    path = tmp_path / "cost.json"
    model.to_json(path)
    payload = json.loads(path.read_text())
    assert "c0" in payload["decode_form"] and payload["fit_error"]["n_points"] == len(decode)
    again = ProfiledCostModel.from_json(path)
    assert again.describe() == model.describe()
    assert again.decode_time(32, 32 * 1000.0, 77) == model.decode_time(32, 32 * 1000.0, 77)


def test_profiled_fit_from_file_and_bad_input(tmp_path):
    decode, prefill = synthetic()
    csv = tmp_path / "decode.csv"
    decode.to_csv(csv, index=False)
    assert ProfiledCostModel.fit(str(csv)).c2 == pytest.approx(TRUE["c2"], rel=0.05)

    bad = tmp_path / "bad.csv"
    decode.drop(columns="ctx_tokens").to_csv(bad, index=False)
    with pytest.raises(ValueError, match=r"bad\.csv.*ctx_tokens"):
        ProfiledCostModel.fit(bad)
    with pytest.raises(ValueError, match="seconds"):
        ProfiledCostModel.fit(decode.assign(seconds=-decode.seconds))
    with pytest.raises(ValueError, match="prefill_tokens"):
        ProfiledCostModel.fit(decode, prefill.rename(columns={"prefill_tokens": "tokens"}))
    with pytest.raises(ValueError, match="too few"):
        ProfiledCostModel.fit(decode.head(1))
    with pytest.raises(ValueError, match="too few"):
        ProfiledCostModel.fit(decode.assign(n_seqs=8))
    with pytest.raises(ValueError, match="non-numeric"):
        ProfiledCostModel.fit(decode.assign(n_seqs="x"))
    with pytest.raises(ValueError, match="not found"):
        ProfiledCostModel.fit(tmp_path / "missing.csv")
    with pytest.raises(ValueError, match="must be finite and >= 0"):
        ProfiledCostModel(-1.0, 0.0, 0.0)
    junk = tmp_path / "junk.json"
    junk.write_text('{"kind": "ProfiledCostModel", "decode_coefficients": {"c0": 1}}')
    with pytest.raises(ValueError, match=r"junk\.json.*c1"):
        ProfiledCostModel.from_json(junk)


def test_fit_makespans_recovers_coefficients():
    from lssim.cost import batch_features

    truth = ProfiledCostModel(c0=2e-3, c1=3e-5, c2=3e-7, c3=2e-7, p0=3e-3, p1=2e-5, f0=1e-3, f1=2e-4)
    rng = np.random.default_rng(0)
    rows = []
    for n in (1, 4, 16, 48, 96):
        for p in (8, 128):
            for spread in (False, True):
                lengths = rng.integers(1, 257, size=n).tolist() if spread else [256] * n
                rows.append({"n_seqs": n, "prompt_len": p, "lengths": lengths, "seconds": truth.makespan(lengths, p)})
    got = ProfiledCostModel.fit_makespans(pd.DataFrame(rows))
    for k, v in truth.coefficients.items():
        assert getattr(got, k) == pytest.approx(v, rel=1e-4, abs=1e-10), k
    assert got.fit_stats["max_ape_pct"] < 1e-6
    assert batch_features([5], 3) == {"c0": 5, "c1": 5, "c2": 5 * 3 + 10, "c3": 5, "p0": 1, "p1": 3, "f0": 0, "f1": 0}


def test_profiled_json_keeps_departures(tmp_path):
    m = ProfiledCostModel(c0=2e-3, c1=3e-5, c2=3e-7, f0=1e-3, f1=2e-4)
    m.to_json(tmp_path / "m.json")
    back = ProfiledCostModel.from_json(tmp_path / "m.json")
    assert back.departure_time(3) == pytest.approx(1e-3 + 6e-4) and back.departure_time(0) == 0


def test_profiled_json_keeps_the_abort_time_and_reads_older_profiles_as_free_aborts(tmp_path):
    from lssim.sim.shared_host import ScaledCost

    m = ProfiledCostModel(c0=2e-3, c1=3e-5, c2=3e-7, abort_seconds=2e-4)
    m.to_json(tmp_path / "m.json")
    back = ProfiledCostModel.from_json(tmp_path / "m.json")
    assert back.abort_time(10) == pytest.approx(2e-3) and back.abort_time(0) == 0 and back.describe()["a1"] == 2e-4
    payload = json.loads((tmp_path / "m.json").read_text())
    del payload["abort_coefficients"]  # a profile measured before aborts were
    (tmp_path / "old.json").write_text(json.dumps(payload))
    assert ProfiledCostModel.from_json(tmp_path / "old.json").abort_time(10) == 0
    assert ScaledCost(m, 1.7).abort_time(3) == pytest.approx(6e-4)  # the caller's time: not the host's slow-down
    assert RooflineCostModel("qwen2.5-7b", "H100").abort_time(3) == 0.0  # a model without it: free
    with pytest.raises(ValueError, match="a1"):
        ProfiledCostModel(c0=2e-3, c1=3e-5, c2=3e-7, abort_seconds=-1.0)


def test_fit_makespans_names_bad_rows():
    bad = pd.DataFrame({"n_seqs": [2], "prompt_len": [8], "lengths": [[3]], "seconds": [0.1]})
    with pytest.raises(ValueError, match="row 0"):
        ProfiledCostModel.fit_makespans(bad)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 64), st.floats(0, 5e5)), min_size=1, max_size=40), st.sampled_from(["roofline", "profiled", "quadratic", "spec"]))
def test_work_time_bounds_any_schedule(iterations, which):
    """The lower bound's work term: whatever iterations generate T tokens reading W context tokens (at most 64
    sequences each), their summed time is at least work_time(T, W, 64)."""
    from lssim.loop.core import Speculation

    models = {
        "roofline": RooflineCostModel("qwen2.5-7b", "H100"),
        "profiled": ProfiledCostModel(c0=2e-3, c1=3e-5, c2=3e-7),
        "quadratic": ProfiledCostModel(c0=2e-3, c1=3e-5, c2=3e-7, c3=4e-6),
    }
    models["spec"] = SpeculativeCost(models["roofline"], Speculation(method="ngram", alpha=0.6, gamma=4, max_batch=32))
    cost = models[which]
    spent = sum(cost.decode_time(n, c, 1) for n, c in iterations)
    tokens, reads = sum(n for n, _ in iterations), sum(c for _, c in iterations)
    assert spent >= cost.work_time(tokens, reads, 64) * (1 - 1e-9)


def test_work_time_counts_the_context_the_old_term_left_out():
    cost = RooflineCostModel("qwen2.5-7b", "H100")
    prompt, length = 500, 8000  # a step of long responses
    tokens = 256 * length
    reads = 256 * (length * prompt + length * (length - 1) / 2)
    old = tokens / peak_tokens_per_second(cost, 256, prompt)
    assert cost.work_time(tokens, tokens * prompt, 256) >= old * (1 - 1e-9)  # never looser
    assert cost.work_time(tokens, reads, 256) > 1.5 * old  # long responses: the KV reads dominate
