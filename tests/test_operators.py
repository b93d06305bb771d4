"""Tests for lssim.cost.operators (the GPU cost model summed kernel by kernel) and its fit (lssim.cost.operator_fit):
the CostModel protocol's invariants, the kernel inventory against the parameter count, the profile file, and the
held-out error table reproduced from the shipped data."""

import json
import random

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lssim.cost import MODELS, SHAPES, CostModel, KernelProfile, OperatorCostModel
from lssim.cost.operator_fit import (GEMM_SWEEP, STEPS_SOURCE, UNSEEN_SOURCE, VIDUR_TABLE_TOKENS, cross_stack, fit_profile,
                                     heldout_table, lssim_points, points_from_log, step_points, vidur_form_floor,
                                     vidur_measured_layers, vidur_neighbourhood_errors, vidur_steps)
from lssim.cost.operators import (DATA_DIR, KERNEL_PROFILES, GemmTable, decoder_kernels, gemm_seconds,
                                  load_gemm_table, load_kernel_profile)

MODELS_UNDER_TEST = {
    "7b": OperatorCostModel("qwen2.5-7b", "H100"),
    "1.5b+overhead": OperatorCostModel("qwen2.5-1.5b", "H100", iteration_overhead_s=3e-4),
    "32b-tp2": OperatorCostModel("qwen2.5-32b", "H100", tp=2),
}
names = st.sampled_from(sorted(MODELS_UNDER_TEST))
batch = st.integers(1, 512)
per_seq_ctx = st.floats(0.0, 32768.0)


def rel_close(a, b, rel=1e-9):
    return abs(a - b) <= rel * max(abs(a), abs(b), 1e-300)


def test_is_a_cost_model():
    for model in MODELS_UNDER_TEST.values():
        assert isinstance(model, CostModel)
        assert model.decode_time(0, 0.0, 5) == 0.0 and model.decode_time(4, 100.0, 0) == 0.0
        assert model.prefill_time(0) == 0.0 and model.departure_time(3) == 0.0


@settings(max_examples=200, deadline=None)
@given(names, batch, per_seq_ctx, st.integers(1, 300))
def test_a_span_is_the_sum_of_its_iterations(name, n, c, k):
    cost = MODELS_UNDER_TEST[name]
    ctx = n * c
    singles = sum(cost.decode_time(n, ctx + i * n, 1) for i in range(k))
    assert rel_close(cost.decode_time(n, ctx, k), singles, 1e-9)


@settings(max_examples=200, deadline=None)
@given(names, batch, st.integers(1, 64), per_seq_ctx, st.floats(0.0, 4096.0), st.integers(1, 50))
def test_monotone_in_batch_and_context(name, n, dn, c, dc, k):
    cost = MODELS_UNDER_TEST[name]
    t = cost.decode_time(n, n * c, k)
    assert cost.decode_time(n + dn, n * c, k) >= t
    assert cost.decode_time(n + dn, (n + dn) * c, k) >= t
    assert cost.decode_time(n, n * (c + dc), k) >= t
    assert cost.decode_time(n, n * c, k + 1) > t


@settings(max_examples=200, deadline=None)
@given(names, batch, per_seq_ctx, st.floats(0.0, 30.0))
def test_iterations_within_inverts_decode_time(name, n, c, seconds):
    cost = MODELS_UNDER_TEST[name]
    k = cost.iterations_within(n, n * c, seconds)
    assert cost.decode_time(n, n * c, k) <= seconds < cost.decode_time(n, n * c, k + 1)


@settings(max_examples=200, deadline=None)
@given(names, st.integers(1, 20000), st.integers(1, 20000))
def test_prefill_is_monotone_and_subadditive(name, a, b):
    cost = MODELS_UNDER_TEST[name]
    assert cost.prefill_time(a + b) >= max(cost.prefill_time(a), cost.prefill_time(b))
    assert cost.prefill_time(a + b) <= cost.prefill_time(a) + cost.prefill_time(b) * (1 + 1e-12)
    # the prompts' causal attention only adds time
    assert cost.prompt_prefill_time([a, b]) >= cost.prefill_time(a + b)


@settings(max_examples=60, deadline=None)
@given(names, st.integers(0, 2**32 - 1), st.integers(1, 256))
def test_work_time_bounds_any_schedule(name, seed, max_num_seqs):
    cost = MODELS_UNDER_TEST[name]
    rng = random.Random(seed)
    spent = tokens = reads = 0.0
    for _ in range(rng.randint(1, 20)):  # spans of random batch sizes, each sequence at its own context
        n, k, c0 = rng.randint(1, max_num_seqs), rng.randint(1, 200), rng.uniform(0, 8000)
        spent += cost.decode_time(n, n * c0, k)
        tokens += n * k
        reads += n * (k * c0 + k * (k - 1) / 2)
    assert cost.work_time(tokens, reads, max_num_seqs) <= spent * (1 + 1e-9)


def test_kernels_read_every_weight_once():
    # The GEMMs of all layers plus the LM head hold every parameter but the input embedding (when untied),
    # the QKV bias and the norms.
    for key in ("qwen2.5-7b", "qwen2.5-1.5b", "llama3-8b", "llama2-7b"):
        spec, shape = MODELS[key], SHAPES[key]
        kern = decoder_kernels(spec, shape)
        weights = spec.n_layers * sum(k * n for _, k, n in kern.gemms) + kern.hidden * kern.vocab
        q, kv = spec.n_heads * spec.head_dim, spec.n_kv_heads * spec.head_dim
        rest = (0 if shape.tied_embeddings else shape.vocab * spec.hidden) + spec.n_layers * (
            (q + 2 * kv if shape.qkv_bias else 0) + 2 * spec.hidden) + spec.hidden
        assert weights + rest == spec.params, key
    # tensor parallelism splits heads, MLP and vocabulary: a GPU holds about 1/tp of the GEMM weights
    one, four = decoder_kernels("qwen2.5-32b"), decoder_kernels("qwen2.5-32b", tp=4)
    assert sum(k * n for _, k, n in four.gemms) * 4 == sum(k * n for _, k, n in one.gemms)
    with pytest.raises(ValueError, match="tp"):
        decoder_kernels("qwen2.5-7b", tp=3)
    with pytest.raises(ValueError, match="DecoderShape"):
        OperatorCostModel(MODELS["tiny-ref"].__class__(10, 1, 8, 2, 2, 4, 2, "unknown"))


def test_profile_file_round_trip_and_errors(tmp_path):
    profile = load_kernel_profile("H100")
    path = tmp_path / "p.json"
    profile.to_json(path)
    assert KernelProfile.from_json(path) == profile
    payload = json.loads(path.read_text())
    path.write_text(json.dumps({**payload, "gemm_speed": 1.0}))
    with pytest.raises(ValueError, match="unknown key.*gemm_speed"):
        KernelProfile.from_json(path)
    path.write_text(json.dumps({**payload, "gemm_bandwidth": -1.0}))
    with pytest.raises(ValueError, match=r"p.json: KernelProfile.gemm_bandwidth"):
        KernelProfile.from_json(path)
    with pytest.raises(ValueError, match="no measured kernel profile"):
        OperatorCostModel("qwen2.5-7b", "A100")


def test_held_out_table_is_reproduced_from_the_shipped_data():
    table, profile, sums = heldout_table()
    shipped = pd.read_csv(DATA_DIR / "gpu_cost_heldout.csv")
    assert list(table.columns) == list(shipped.columns) and len(table) == len(shipped)
    for col in ("source", "model", "kind", "n_seqs", "ctx_len", "n_prompts", "prompt_len", "tokens"):
        assert (table[col].to_numpy() == shipped[col].to_numpy()).all(), col
    for col in ("measured_s", "predicted_s", "gemm_table_s", "roofline_s"):
        np.testing.assert_allclose(table[col], shipped[col], rtol=1e-3, err_msg=col)
    # the simulator's H100 profile is this very fit (none of the held-out points in it)
    fitted = KernelProfile.from_json(KERNEL_PROFILES["H100"])
    for field in ("gemm_bandwidth", "gemm_flops", "attention_bandwidth", "elementwise_bandwidth"):
        assert getattr(profile, field) == pytest.approx(getattr(fitted, field), rel=1e-3), field
    # What the README claims: every held-out whole iteration of the project's H100 profiles within 10%, and the
    # roofline off by more; the Vidur check meets 10% at decode sizes only.
    ours = table[table["source"] == "lssim H100 torch"]
    assert len(ours) == 26 and set(ours["kind"]) == {"decode", "prefill"}
    assert ours["ape_pct"].max() <= 10.0
    assert ours["roofline_ape_pct"].median() > 3 * ours["ape_pct"].median()
    vidur = table[table["source"].str.startswith("vidur")]
    assert vidur.loc[vidur["kind"] == "decode layers", "ape_pct"].max() <= 10.0
    assert set(sums["model"]) == {"Llama-2-7b-hf"}
    # the points measured after the fit, on both sides of cuBLAS's steps: within 10% too, with or without the sweep
    steps = table[table["source"] == STEPS_SOURCE]
    assert len(steps) == 24 and steps["ape_pct"].max() <= 10.0 and steps["gemm_table_ape_pct"].max() <= 10.0
    # OperatorCostModel(model, "H100", gemms="H100") is the model of the "measured GEMMs" column: the shipped
    # profile fitted around the sweep, the sweep's GEMMs
    for r in steps.itertuples():
        shipped = OperatorCostModel(r.model, "H100", gemms="H100")
        got = shipped.decode_time(r.n_seqs, r.n_seqs * r.ctx_len, 1) if r.kind == "decode" else \
            shipped.prompt_prefill_time([r.prompt_len] * r.n_prompts)
        assert got == pytest.approx(r.gemm_table_s, rel=1e-3)
    # and two models of another family that no fit saw (Llama-2-7B, Llama-3-8B)
    unseen = table[table["source"] == UNSEEN_SOURCE]
    assert set(unseen["model"]) == {"llama2-7b", "llama3-8b"} and len(unseen) == 19
    assert unseen["ape_pct"].max() <= 10.0 < unseen["roofline_ape_pct"].max()


def test_the_measured_gemms_follow_the_step_the_curve_smooths_over():
    """qwen2.5-7b's whole prefill costs 21% more at 520 tokens than at 512 (measured, one run): the sweep's table
    follows that step; the fitted curve cannot."""
    steps = step_points().set_index(["model", "kind", "prompt_len"])["seconds"]
    measured = steps["qwen2.5-7b", "prefill", 520] / steps["qwen2.5-7b", "prefill", 512]
    points = lssim_points()
    table = GemmTable(GEMM_SWEEP)
    with_table = OperatorCostModel("qwen2.5-7b", fit_profile(points, gemms=table), gemms=table)
    curve = OperatorCostModel("qwen2.5-7b", "H100")
    ratio = {name: m.prompt_prefill_time([520]) / m.prompt_prefill_time([512]) for name, m in
             (("table", with_table), ("curve", curve))}
    assert measured > 1.15
    assert abs(ratio["table"] / measured - 1) < 0.05 < abs(ratio["curve"] / measured - 1)


def test_gemm_table_prices_measured_products_exactly_and_the_rest_by_the_curve(tmp_path):
    profile = load_kernel_profile("H100")
    frame = pd.DataFrame({"k": [64] * 3, "n": [32] * 3, "tokens": [1, 8, 16], "seconds": [2e-6, 3e-6, 5e-6]})
    table = GemmTable(frame)
    assert (64, 32) in table and (32, 64) not in table
    assert table.seconds(profile, 8, 64, 32) == pytest.approx(3e-6)
    assert table.seconds(profile, 12, 64, 32) == pytest.approx(4e-6)  # between measured counts: linear
    assert table.seconds(profile, 32, 64, 32) == pytest.approx(10e-6)  # beyond the last: its time per token
    np.testing.assert_allclose(table.seconds(profile, np.array([1.0, 16.0]), 64, 32), [2e-6, 5e-6])
    assert table.seconds(profile, 8, 128, 32) == gemm_seconds(profile, 8, 128, 32)
    # the shipped table by its hardware key; an OperatorCostModel without one prices by the curve
    shipped = OperatorCostModel("qwen2.5-7b", "H100", gemms="H100")
    assert shipped.gemms is load_gemm_table("H100") and OperatorCostModel("qwen2.5-7b", "H100").gemms is None
    assert shipped.describe()["gemm_table"] == "lssim/profiles/h100_gemm_sweep.csv"
    bad = tmp_path / "sweep.csv"
    frame.assign(seconds=[2e-6, 0.0, 5e-6]).to_csv(bad, index=False)
    with pytest.raises(ValueError, match=r"sweep.csv: row 1 has tokens 8"):
        GemmTable(bad)
    frame.drop(columns="seconds").to_csv(bad, index=False)
    with pytest.raises(ValueError, match=r"without column\(s\) \['seconds'\]"):
        GemmTable(bad)


def test_two_stacks_agree_where_memory_bound_and_part_at_the_steps():
    """Our sweep and Vidur's profiles time the same H100 GEMMs: within a few percent at 1-64 tokens (the weight
    read), apart by up to a third where each cuBLAS picks its own kernel."""
    cs = cross_stack()
    llama = cs[(cs["model"] == "Llama-2-7b-hf") & (cs["tp"] == 1)].set_index("tokens")["ratio"]
    assert (llama.loc[[1, 2, 4, 8, 16, 32, 64]] - 1).abs().max() < 0.05
    assert llama.loc[256] < 0.8 and cs["ratio"].min() < 0.7 and len(cs) == 1000


def test_step_points_come_from_the_logs_and_a_log_without_points_is_an_error(tmp_path):
    points = step_points()
    assert len(points) == 24 and points["held_out"].all()
    assert set(points.loc[points["kind"] == "decode", "n_seqs"]) == {16, 24, 128, 136}
    empty = tmp_path / "x.log"
    empty.write_text("nothing here\n")
    with pytest.raises(ValueError, match="x.log: no decode or prefill point"):
        points_from_log(empty, "qwen2.5-7b")


def test_simulator_runs_on_the_operator_model_and_the_bound_holds():
    from lssim.analysis.replay import SimSetup, simulate
    from lssim.traces.synth import get_preset, synthesize
    from lssim.traces.workload import Workload

    preset = get_preset("math7b")
    trace = synthesize(preset.replace(steps=2, prompts_per_step=16))
    with pytest.raises(ValueError, match="cost"):
        SimSetup(cost="vidur")
    setup = SimSetup(cost="operators", n_instances=2)
    for policy in ("baseline", "april"):
        result = simulate(Workload(trace), policy, setup)
        s = result.steps
        assert result.meta["cost"]["kind"] == "operators"
        assert (s["rollout_seconds"] >= s["lower_bound_seconds"] * (1 - 1e-9)).all()


def test_vidur_steps_show_why_the_prefill_points_miss():
    """The held-out Llama-2-7B's time is a staircase in the token count (cuBLAS picks a kernel per shape) and the
    table's powers of two sit at the bottom of its steps: the diagnostics the README cites."""
    steps = vidur_steps().set_index("tokens")
    assert list(steps.index) == list(VIDUR_TABLE_TOKENS)
    # 512 -> 520 tokens (+1.6%) costs 28% more: no step-free curve is within 10% of both
    assert steps.loc[512, "next_tokens"] == 520 and steps.loc[512, "jump_pct"] > 20
    assert steps.loc[512, "floor_pct"] > 10 and steps.loc[1024, "floor_pct"] > 5
    for t in (512, 1024, 2048):
        assert steps.loc[t, "below_neighbours_pct"] > 4, t
    # the floor formula: the best shared error e of two points q apart in time and r apart in tokens
    q, r = steps.loc[512, "next_measured_s"] / steps.loc[512, "measured_s"], 520 / 512
    e = steps.loc[512, "floor_pct"] / 100
    assert (1 + e) * r == pytest.approx((1 - e) * q, rel=1e-9)
    assert np.isnan(steps.loc[4096, "next_tokens"])  # the last profiled count


def test_the_form_fitted_to_the_held_out_points_themselves_is_a_bound():
    floor = vidur_form_floor()
    table, _, _ = heldout_table()
    vidur = table[table["source"].str.startswith("vidur")]
    assert list(floor["tokens"]) == list(vidur["tokens"])
    np.testing.assert_allclose(floor["measured_s"], vidur["measured_s"], rtol=1e-9)
    # seeing the very points can only do better than the fit that does not see them
    assert floor["ape_pct"].max() < vidur["ape_pct"].max()
    assert floor["ape_pct"].max() > 5  # ... and even then this form is not far inside the 10% bar


def test_vidur_diagnostics_name_a_missing_model(tmp_path):
    (tmp_path / "vidur_h100_models.csv").write_text((DATA_DIR / "vidur_h100_models.csv").read_text())
    (tmp_path / "vidur_h100_ops.csv").write_text((DATA_DIR / "vidur_h100_ops.csv").read_text().splitlines()[0] + "\n")
    with pytest.raises(ValueError, match="no Vidur rows"):
        vidur_measured_layers(tmp_path)


def test_gemm_sweep_times_every_gemm_of_a_layer_on_cpu():
    from lssim.cost.gpu_gemm_sweep import COLUMNS, sweep

    table = sweep("tiny-ref", tokens=(8, 1), device="cpu", dtype="float32", warmup=0, iters=1, log=lambda *_: None)
    assert list(table.columns) == COLUMNS
    gemms = decoder_kernels("tiny-ref").gemms
    assert len(table) == 2 * len(gemms)
    assert list(table["tokens"]) == [1, 8] * len(gemms)  # sorted
    assert set(zip(table["op"], table["k"], table["n"])) == set(gemms)
    assert (table["seconds"] > 0).all() and (table["kernel"].str.len() > 0).all()
    assert set(table["source"]) == {"tiny-ref"} and set(table["tp"]) == {1}
    np.testing.assert_allclose(table["tflops"], 2 * table["tokens"] * table["k"] * table["n"] / table["seconds"] / 1e12)
    with pytest.raises(ValueError, match="positive"):
        sweep("tiny-ref", tokens=(0, 8), device="cpu")


def test_gemm_sweep_times_a_product_once_for_every_shape_that_shares_it():
    from lssim.cost.gpu_gemm_sweep import GemmShape, sweep_shapes, vidur_shapes

    shapes = [GemmShape("a", 1, "up", 64, 96, (1, 8)), GemmShape("b", 2, "up", 64, 96, (8, 16)),
              GemmShape("a", 1, "down", 96, 64, (4,))]
    progress = []
    table = sweep_shapes(shapes, device="cpu", dtype="float32", warmup=0, iters=1, log=lambda *_: None,
                         on_rows=lambda t: progress.append(len(t)))
    assert progress == [4, 5]  # after each k x n product, the table so far
    assert table[["source", "tp", "tokens"]].values.tolist()[:4] == [["a", 1, 1], ["a", 1, 8], ["b", 2, 8], ["b", 2, 16]]
    shared = table[table["tokens"] == 8]
    assert shared["seconds"].nunique() == 1  # one timing, reported for both shapes
    vidur = vidur_shapes()
    assert {s.source for s in vidur} == set(pd.read_csv(DATA_DIR / "vidur_h100_models.csv")["model"])
    llama = {s.op: s for s in vidur if s.source == "Llama-2-7b-hf" and s.tp == 1}
    assert (llama["mlp_up_proj"].k, llama["mlp_up_proj"].n) == (4096, 2 * 11008) and len(llama["mlp_up_proj"].tokens) == 259


def test_kernel_switches_are_where_the_kernel_name_changes():
    from lssim.cost.gpu_gemm_sweep import kernel_switches

    table = pd.DataFrame({"op": ["a"] * 4 + ["b"] * 2, "tokens": [16, 8, 24, 32, 8, 16],
                          "seconds": [2.0, 1.0, 5.0, 5.0, 1.0, 1.0], "kernel": ["x", "x", "y", "x", "z", "z"]})
    switches = kernel_switches(table)
    assert switches[["op", "previous_tokens", "tokens", "previous_kernel", "kernel"]].values.tolist() == \
        [["a", 16, 24, "x", "y"], ["a", 24, 32, "y", "x"]]
    assert switches["time_ratio"].tolist() == [2.5, 1.0]


def test_neighbourhood_errors_cover_the_counts_around_each_point():
    _, _, sums = heldout_table()
    near = vidur_neighbourhood_errors(sums).set_index("tokens")
    tp1 = sums[sums["tp"] == 1].set_index("tokens")
    counts = tp1.index.to_numpy()
    for t in (512, 1024):
        inside = counts[np.abs(counts / t - 1) <= 0.15]
        assert near.loc[t, "points"] == len(inside) and t in inside
        signed = (tp1.loc[inside, "predicted_s"] / tp1.loc[inside, "measured_s"] - 1) * 100
        assert near.loc[t, "median_signed_pct"] == pytest.approx(signed.median())
        assert near.loc[t, "within_10"] == (signed.abs() <= 10).sum()
    # the shipped model is within 10% of the median of every neighbourhood, though not of every power of two
    assert near["median_signed_pct"].abs().max() < 10


def test_interpolating_the_measurements_stays_inside_each_tile_step(tmp_path):
    """A layer whose every kernel costs ceil(tokens / 128) units (a pure staircase): each count left out is predicted
    exactly from the counts of its own step, where interpolating across the step (512 from 504 and 520) would be
    12.5% off. On the shipped data every interior count of every model and tp is scored once."""
    from lssim.cost.operator_fit import VIDUR_OPS, load_vidur, vidur_interpolation_errors

    (tmp_path / "vidur_h100_models.csv").write_text((DATA_DIR / "vidur_h100_models.csv").read_text())
    tokens = np.arange(8, 1025, 8)
    ops = pd.DataFrame({"model": "Llama-2-7b-hf", "tp": 1, "tokens": tokens,
                        **{op: np.ceil(tokens / 128) * 1e-3 for op in VIDUR_OPS}})
    ops.to_csv(tmp_path / "vidur_h100_ops.csv", index=False)
    errors = vidur_interpolation_errors(tmp_path)
    assert len(errors) == len(tokens) - 2 and errors["ape_pct"].max() < 1e-9
    shipped = vidur_interpolation_errors()
    counts = load_vidur().groupby(["model", "tp"])["tokens"].nunique()
    assert len(shipped) == int((counts - 2).sum()) and (shipped["ape_pct"] >= 0).all()
