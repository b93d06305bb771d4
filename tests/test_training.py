"""Tests for lssim.sim.training: the training-phase models (analytic, profiled, the old placeholder), the packing rule the
real trainer shares, the shipped CPU profile, and the simulator's use of them."""

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lssim.sim.trainer import SimTrainer, TrainTimeModel
from lssim.sim.train_profiled import ProfiledTrainCost, step_features
from lssim.sim.training import (
    AnalyticTrainCost,
    TrainCostModel,
    TrainPhases,
    load_train_cost,
    pack_padded,
    padded_shapes,
)

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "real_backend" / "data" / "profile_trainer_cpu.json"
COMPUTE = ("logprob", "reference", "update")

PROFILED = ProfiledTrainCost(l0=4e-3, lB=1e-4, l1=3e-5, l2=3e-8, u0=1e-2, uB=3e-4, u1=9e-5, u2=9e-8, o0=2e-3, k0=5e-3,
                             s0=0.04, micro_batch_tokens=4096, recompute_logprobs=True)
MODELS = {
    "analytic-7b": AnalyticTrainCost("qwen2.5-7b", "H100", reference=True),
    "analytic-32b-a100": AnalyticTrainCost("qwen2.5-32b", "A100", mini_batches=2),
    "analytic-padded": AnalyticTrainCost("qwen2.5-1.5b", "H200", packing=False),
    "profiled": PROFILED,
}
lengths = st.lists(st.integers(1, 40_000), min_size=1, max_size=60)


def phases(model, seq, n=8, collocated=True):
    seq = np.asarray(seq, dtype=np.int64)
    return model.phases(seq, np.minimum(seq, 100), n, collocated=collocated)


# -- TrainPhases -------------------------------------------------------------------------------------


def test_phases_total_and_metrics():
    p = TrainPhases(1.0, 0.5, 3.0, 2.0, 0.25)
    assert p.total == pytest.approx(6.75)
    assert p.as_metrics() == {"logprob_seconds": 1.0, "reference_seconds": 0.5, "update_seconds": 3.0,
                              "sync_seconds": 2.0, "switch_seconds": 0.25}
    with pytest.raises(ValueError, match="update"):
        TrainPhases(1.0, 0.0, -1.0, 0.0, 0.0)
    with pytest.raises(ValueError, match="sync"):
        TrainPhases(1.0, 0.0, 1.0, float("nan"), 0.0)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_every_model_speaks_the_protocol(name):
    model = MODELS[name]
    assert isinstance(model, TrainCostModel)
    assert phases(model, []) == TrainPhases.zero()  # nothing trained, nothing synced
    assert model.micro_batch_seconds(np.array([100, 200])) > 0
    assert model.optimizer_step_seconds(4) >= 0
    json.dumps(model.describe())  # a report can hold it
    with pytest.raises(ValueError, match="n_devices"):
        phases(model, [10], n=0)
    with pytest.raises(ValueError, match="prompt_len"):
        model.phases(np.array([10]), np.array([11]), 1, collocated=True)


# -- scaling ---------------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(sorted(MODELS)), seq=lengths, which=st.integers(0, 10**6), extra=st.integers(1, 5000))
def test_more_tokens_never_cheaper(name, seq, which, extra):
    """Within one micro-batch split. The profiled model pads each micro-batch to its longest sequence under a token
    cap, and a longer sequence can split a micro-batch and shed padding, as a padded trainer does (pinned in the
    next test); with a cap no batch reaches, its micro-batches do not change and the property holds."""
    model = MODELS[name]
    if model is PROFILED:
        model = replace(PROFILED, micro_batch_tokens=10**9)
    longer = list(seq)
    longer[which % len(seq)] += extra
    for collocated in (True, False):
        a, b = phases(model, seq, collocated=collocated), phases(model, longer, collocated=collocated)
        for phase in ("logprob", "reference", "update", "sync", "switch"):
            assert getattr(b, phase) >= getattr(a, phase) - 1e-12, phase


def test_a_longer_sequence_that_splits_a_padded_micro_batch_can_be_cheaper():
    """[1352, 1] pads to one micro-batch of 2 x 1352 tokens under a 4096-token cap; with the 1 grown to 2049 the pair
    needs 4098, so it runs as two micro-batches of one sequence each and 654 fewer tokens are computed. The model
    keeps this (a padded trainer does it too): the counterexample hypothesis found for the property above."""
    a = phases(PROFILED, [1] * 8 + [1352])
    b = phases(PROFILED, [2049] + [1] * 7 + [1352])
    assert b.update < a.update
    assert [len(m) for m in pack_padded(np.array([2049, 1]), 4096)] == [1, 1]
    assert [len(m) for m in pack_padded(np.array([1352, 1]), 4096)] == [2]


@settings(max_examples=60, deadline=None)
@given(seq=lengths, extra=st.integers(1, 40_000))
def test_one_more_sequence_never_cheaper_in_one_mini_batch(seq, extra):
    for model in (AnalyticTrainCost(mini_batches=1), AnalyticTrainCost(mini_batches=1, packing=False)):
        a, b = phases(model, seq), phases(model, seq + [extra])
        assert b.logprob >= a.logprob and b.update >= a.update


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(sorted(MODELS)), seq=st.lists(st.integers(1000, 40_000), min_size=64, max_size=400),
       tiny=lengths)
def test_more_devices_cheaper_for_compute_phases(name, seq, tiny):
    """Within a node and across nodes (where FSDP's collectives move to the network), as long as every device
    still fills whole micro-batches: then the compute outweighs FSDP's gathers. With less work per device a
    step on more devices may cost more (the gathers grow, the compute cannot shrink), as real FSDP does.
    The profiled CPU model has no collectives but pads each micro-batch to its longest sequence after a split into
    mini-batches, so with mixed lengths a smaller share can pad worse (found by hypothesis: [1, 1, 1366] on 2 devices
    priced above 1); with sequences of one length it is cheaper on more devices for any batch."""
    model = MODELS[name]
    if name == "profiled":
        seq, busy = [max(tiny)] * len(tiny), lambda n: True  # noqa: E731
    else:
        busy = lambda n: sum(seq) / model.mini_batches / n >= model.max_token_len_per_gpu  # noqa: E731
    for counts in ((1, 2, 3, 4, 6, 8), (16, 24, 32, 64, 128)):
        runs = [phases(model, seq, n=n) for n in counts if busy(n)]
        for fewer, more in zip(runs, runs[1:]):
            for phase in COMPUTE:
                assert getattr(more, phase) <= getattr(fewer, phase) + 1e-12, phase
            assert more.sync == fewer.sync


def test_devices_scale_a_compute_bound_batch_nearly_linearly():
    seq = np.full(1024, 4096)
    one, eight = phases(MODELS["analytic-7b"], seq, n=8), phases(MODELS["analytic-7b"], seq, n=64)
    assert 6.0 < one.update / eight.update <= 8.0


def test_packing_same_tokens_fewer_longer_sequences_cost_more_attention():
    """Packed (verl's use_dynamic_bsz), the linear FLOPs depend on tokens only; attention grows with each
    sequence's square, so the same tokens in fewer, longer sequences cost more, never less."""
    model = AnalyticTrainCost(mini_batches=1)
    many_short = phases(model, [1000] * 64, n=1)
    few_long = phases(model, [16000] * 4, n=1)
    assert few_long.update > many_short.update and few_long.logprob > many_short.logprob
    # ... by the attention share only: 2 s^2 h d L against 2 P s per sequence.
    spec = model.spec
    attn = lambda s: 2.0 * spec.n_heads * spec.head_dim * spec.n_layers * s  # noqa: E731  per token
    ratio = (2 * spec.params + attn(16000)) / (2 * spec.params + attn(1000))
    assert few_long.update / many_short.update == pytest.approx(ratio, rel=0.1)


def test_padding_costs_what_packing_saves():
    mixed = [16000] + [500] * 63
    packed, padded = AnalyticTrainCost(mini_batches=1), AnalyticTrainCost(mini_batches=1, packing=False)
    assert phases(padded, mixed).update > 5 * phases(packed, mixed).update
    uniform = [4000] * 64  # nothing to pad: the FLOPs agree (only the micro-batch count differs)
    assert phases(padded, uniform).update == pytest.approx(phases(packed, uniform).update, rel=0.05)


def test_profiled_pays_for_padding():
    """The CPU trainer pads each micro-batch to its longest: a long sequence among short ones makes its
    micro-batch expensive, unless packing puts it in one of its own."""
    model = PROFILED
    short = [100] * 20
    assert phases(model, short + [1000], n=1).update > phases(model, short + [100], n=1).update
    shapes = padded_shapes(short + [4000], 4096)
    assert shapes.tolist() == [[20, 100], [1, 4000]]


# -- modes -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", [n for n in MODELS if n.startswith("analytic")])
def test_collocated_adds_a_switch_disaggregated_none(name):
    seq = np.full(256, 3000)
    col, dis = phases(MODELS[name], seq, collocated=True), phases(MODELS[name], seq, collocated=False)
    assert col.switch > 0 and dis.switch == 0
    for phase in COMPUTE:
        assert getattr(col, phase) == getattr(dis, phase)


def test_profiled_cpu_has_no_switch():
    col, dis = phases(PROFILED, [50, 60], collocated=True), phases(PROFILED, [50, 60], collocated=False)
    assert col.switch == dis.switch == 0 and col.total == dis.total


def test_offload_when_the_training_state_does_not_fit():
    seq = np.full(128, 2000)
    assert AnalyticTrainCost("qwen2.5-7b").offloads(8) == (False, False)  # 15 GB of state per GPU fits in 40
    assert AnalyticTrainCost("qwen2.5-32b").offloads(8) == (True, True)  # 66 GB does not
    small, big = phases(AnalyticTrainCost("qwen2.5-7b"), seq), phases(AnalyticTrainCost("qwen2.5-32b"), seq)
    assert small.switch == pytest.approx(AnalyticTrainCost().engine_sleep_wake_s)
    assert big.switch > small.switch + 1.0
    forced = phases(AnalyticTrainCost("qwen2.5-7b", param_offload=True, optimizer_offload=True), seq)
    assert forced.switch > small.switch


def test_reference_phase_only_when_asked():
    seq = np.full(64, 2000)
    assert phases(AnalyticTrainCost(), seq).reference == 0
    ref = phases(AnalyticTrainCost(reference=True, ref_param_offload=False), seq)
    assert ref.reference == pytest.approx(ref.logprob)
    assert phases(AnalyticTrainCost(reference=True), seq).reference > ref.reference  # weights streamed from host


def test_every_analytic_constant_has_a_source():
    constants = AnalyticTrainCost().describe()["constants"]
    skip = {"model", "hardware"}
    names = {f for f in AnalyticTrainCost.__dataclass_fields__} - skip
    assert set(constants) == names
    assert all(isinstance(c["source"], str) and len(c["source"]) > 20 for c in constants.values())


def test_analytic_rejects_bad_constants():
    with pytest.raises(ValueError, match="mfu"):
        AnalyticTrainCost(mfu=1.5)
    with pytest.raises(ValueError, match="unknown model"):
        AnalyticTrainCost("gpt-9")
    with pytest.raises(ValueError, match="mini_batches"):
        AnalyticTrainCost(mini_batches=0)


# -- packing shared with the real trainer ---------------------------------------------------------


def _old_trainer_rule(lengths, max_tokens):
    """GRPOTrainer._micro_batches as it was before it called pack_padded."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    out, batch = [], []
    for i in order:
        if batch and (len(batch) + 1) * max(lengths[i], lengths[batch[-1]]) > max_tokens:
            out.append(batch)
            batch = []
        batch.append(i)
    return out + ([batch] if batch else [])


@settings(max_examples=100, deadline=None)
@given(seq=st.lists(st.integers(1, 3000), min_size=1, max_size=80), max_tokens=st.integers(1, 20_000))
def test_pack_padded_is_the_trainer_rule(seq, max_tokens):
    batches = pack_padded(seq, max_tokens)
    assert [b.tolist() for b in batches] == _old_trainer_rule(seq, max_tokens)
    assert sorted(i for b in batches for i in b.tolist()) == list(range(len(seq)))
    for b in batches:
        assert len(b) == 1 or len(b) * max(seq[i] for i in b) <= max_tokens


# -- the profiled fit ----------------------------------------------------------------------------------


def _synthetic_measurements(model, rng, noise=0.0):
    rows = []
    for B in (2, 4, 8, 16, 32, 64):
        for T in (16, 64, 128, 256, 520):
            for m in ((1, 2, 4) if B >= 8 else (1,)):
                rows.append({"kind": "step", "split": "fit", "lengths": [T] * B, "mini_batches": m})
    for B in (12, 40):
        rows.append({"kind": "step", "split": "held_out", "lengths": rng.integers(9, 520, B).tolist(), "mini_batches": 1})
    df = pd.DataFrame(rows)
    df["micro_batch_tokens"] = model.micro_batch_tokens
    true = np.array([model.step_seconds(r.lengths, r.mini_batches) for r in df.itertuples()])
    for k, col in enumerate(("logprob", "update")):
        df[f"{col}_cpu_seconds"] = true[:, k] * (1 + noise * rng.standard_normal(len(df)))
        df[f"{col}_seconds"] = df[f"{col}_cpu_seconds"] * 2  # a busy machine's wall clock
    df["sync_seconds"] = np.nan
    syncs = pd.DataFrame({"kind": "sync", "split": "fit", "lengths": [[]] * 5, "mini_batches": 1,
                          "micro_batch_tokens": model.micro_batch_tokens, "sync_seconds": model.s0 * (1 + 0.01 * np.arange(5))})
    return pd.concat([df, syncs], ignore_index=True)


def test_fit_recovers_known_coefficients():
    rng = np.random.default_rng(0)
    df = _synthetic_measurements(PROFILED, rng)
    fitted = ProfiledTrainCost.fit(df, micro_batch_tokens=PROFILED.micro_batch_tokens)
    for c in ("l1", "l2", "u1", "u2"):
        assert getattr(fitted, c) == pytest.approx(getattr(PROFILED, c), rel=1e-3), c
    stats = fitted.fit_stats
    assert stats["fitted_on"] == "cpu"
    assert stats["cpu"]["held_out"]["logprob_plus_update"]["median_ape_pct"] < 0.1
    assert stats["wall"]["fit"]["update"]["median_ape_pct"] == pytest.approx(50.0, abs=0.1)  # the 2x wall clock
    assert fitted.s0 == pytest.approx(PROFILED.s0 * 1.02)


def test_fit_with_noise_reports_its_error():
    rng = np.random.default_rng(1)
    df = _synthetic_measurements(PROFILED, rng, noise=0.05)
    fitted = ProfiledTrainCost.fit(df, micro_batch_tokens=PROFILED.micro_batch_tokens)
    assert 1.0 < fitted.fit_stats["cpu"]["fit"]["update"]["median_ape_pct"] < 8.0


def test_fit_rejects_bad_measurements():
    df = _synthetic_measurements(PROFILED, np.random.default_rng(0))
    with pytest.raises(ValueError, match="missing columns"):
        ProfiledTrainCost.fit(df.drop(columns=["update_cpu_seconds"]), source="m.parquet")
    bad = df.copy()
    bad.loc[3, "update_cpu_seconds"] = -1.0
    with pytest.raises(ValueError, match=r"m.parquet: column 'update_cpu_seconds' must be finite and > 0 \(row 3\)"):
        ProfiledTrainCost.fit(bad, source="m.parquet")
    with pytest.raises(ValueError, match="no sync measurements"):
        ProfiledTrainCost.fit(df[df["kind"] == "step"], source="m.parquet")


def test_step_features_count_what_the_trainer_runs():
    f = step_features([100] * 8, mini_batches=2, micro_batch_tokens=300)  # 4 per mini-batch, 3 per micro-batch
    assert f["o0"] == 2 and f["k0"] == 1
    assert f["u0"] == 4 and f["uB"] == 8 and f["u1"] == 800  # [3, 1] per mini-batch
    assert f["l0"] == 3 and f["lB"] == 8  # the whole batch: [3, 3, 2]


# -- JSON ------------------------------------------------------------------------------------------


def test_profiled_json_round_trip(tmp_path):
    path = tmp_path / "p.json"
    model = ProfiledTrainCost.fit(_synthetic_measurements(PROFILED, np.random.default_rng(0)), micro_batch_tokens=4096,
                                  meta={"command": "test"})
    model.to_json(path)
    back = ProfiledTrainCost.from_json(path)
    assert back == model and back.fit_stats == model.fit_stats and back.meta == model.meta
    assert isinstance(load_train_cost(path), ProfiledTrainCost)
    assert ProfiledTrainCost.from_json(path, mini_batches=3).mini_batches == 3
    assert not list(tmp_path.glob("*.tmp"))


def test_analytic_json_round_trip(tmp_path):
    model = AnalyticTrainCost("llama3-8b", "A100", mfu=0.4, param_offload=True)
    path = tmp_path / "a.json"
    path.write_text(json.dumps(model.to_dict()))
    assert load_train_cost(path) == model


def _write(tmp_path, payload):
    path = tmp_path / "bad.json"
    path.write_text(payload if isinstance(payload, str) else json.dumps(payload))
    return path


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d["coefficients"].pop("u1"), "must hold exactly"),
    (lambda d: d["coefficients"].update(u1=-1.0), "u1 must be finite and >= 0"),
    (lambda d: d["coefficients"].update(u1="fast"), "u1 must be finite"),
    (lambda d: d.update(extra=1), "unknown keys"),
    (lambda d: d["trainer"].update(gpus=2), "unknown trainer settings"),
    (lambda d: d["trainer"].update(micro_batch_tokens=0), "micro_batch_tokens must be an int >= 1"),
    (lambda d: d.update(version=7), "unsupported version"),
    (lambda d: d.update(kind="ProfiledCostModel"), "kind must be"),
    (lambda d: d["forms"].update(update="something else"), "forms differ"),
])
def test_bad_profile_files_give_clear_errors(tmp_path, mutate, message):
    payload = PROFILED.to_dict()
    mutate(payload)
    path = _write(tmp_path, payload)
    with pytest.raises(ValueError, match=message) as err:
        load_train_cost(path)
    assert str(path) in str(err.value)


def test_missing_or_garbled_profile_files(tmp_path):
    with pytest.raises(ValueError, match="does not exist.*profile_trainer"):
        load_train_cost(tmp_path / "nope.json")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_train_cost(_write(tmp_path, "{not json"))
    with pytest.raises(ValueError, match="kind must be"):
        load_train_cost(_write(tmp_path, "[1, 2]"))
    with pytest.raises(ValueError, match="unknown keys"):
        load_train_cost(_write(tmp_path, {"kind": "AnalyticTrainCost", "mfu": 0.3, "speed": "fast"}))
    with pytest.raises(ValueError, match="an analytic model"):
        ProfiledTrainCost.from_json(_write(tmp_path, AnalyticTrainCost().to_dict()))


# -- the shipped CPU profile -------------------------------------------------------------------------


def test_shipped_profile_reproduces_its_measurements():
    model = ProfiledTrainCost.from_json(SHIPPED)
    measurements = pd.read_parquet(SHIPPED.with_name(model.meta["measurements"]))
    assert model.meta["command"].startswith("python -m real_backend.profile_trainer")
    reported = model.fit_stats
    for clock in ("cpu", "wall"):
        again = model.error(measurements, clock=clock)
        for split in ("fit", "held_out"):
            for phase, stats in again[split].items():
                assert stats == pytest.approx(reported[clock][split][phase]), (clock, split, phase)
    # What the simulator uses it for: whole steps of mixed lengths, never fitted on.
    assert reported["cpu"]["held_out"]["logprob_plus_update"]["median_ape_pct"] < 15.0
    assert model.recompute_logprobs is False  # as GRPOTrainer runs by default


# -- the simulator ---------------------------------------------------------------------------------


def _groups(lengths, prompt_len=100):
    from lssim.loop.core import Group, Request

    reqs = []
    for i, n in enumerate(lengths):
        r = Request(rid=i, group_id=i // 2, step=0, prompt_id=i // 2, sample_idx=i % 2, prompt_len=prompt_len, max_tokens=n)
        r.generated, r.reward = n, float(i % 2 if i < 4 else 0)
        reqs.append(r)
    return [Group(prompt_id=k, step=0, requests=reqs[2 * k:2 * k + 2]) for k in range(len(reqs) // 2)]


class _Clock:
    def __init__(self):
        self.clock = 0.0

    def advance(self, seconds):
        self.clock += seconds


def test_sim_trainer_reports_the_phases_and_the_collocated_mode_puts_them_on_the_clock():
    from lssim.loop.modes import ModeConfig

    clock = _Clock()
    clock.now = lambda: clock.clock
    trainer = SimTrainer(clock, AnalyticTrainCost(), n_devices=16)
    groups = _groups([3000, 500, 800, 1200])
    metrics = trainer.train(groups, step=0)
    expected = AnalyticTrainCost().phases(np.array([3100, 600, 900, 1300]), np.full(4, 100), 16, collocated=True)
    assert clock.clock == 0.0  # pricing is not spending: the mode decides when the phases run
    mode = ModeConfig(rollout_devices=16).build()
    mode.bind(clock, groups_per_step=4)
    timing = mode.train(metrics, 0, groups, 0.0, 0.0)
    assert metrics["seconds"] == pytest.approx(expected.total) == pytest.approx(clock.clock) == pytest.approx(timing.end)
    for key, value in expected.as_metrics().items():
        assert metrics[key] == pytest.approx(value)
    assert metrics["tokens"] == 5900 and metrics["sequences"] == 4


def test_sim_trainer_signal_only_skips_groups_without_signal():
    groups = _groups([100, 200, 300, 400, 500, 600])  # only the first two groups have rewards that differ
    assert SimTrainer(_Clock(), TrainTimeModel(), signal_only=True).train(groups, 0)["sequences"] == 4
    assert SimTrainer(_Clock(), TrainTimeModel()).train(groups, 0)["sequences"] == 6


def test_replay_reports_train_phases():
    from lssim.analysis.replay import SimSetup, simulate
    from lssim.traces.synth import SynthConfig, synthesize
    from lssim.traces.workload import Workload

    trace = synthesize(SynthConfig(n_prompts=32, steps=2, prompts_per_step=16, group_size=4, max_tokens=2048))
    res = simulate(Workload(trace, seed=0), "baseline", SimSetup(n_instances=2, max_num_seqs=64), steps=2)
    s = res.steps
    phase_sum = s[[f"trainer_{p}_seconds" for p in ("logprob", "reference", "update", "sync", "switch")]].sum(axis=1)
    assert np.allclose(s["train_seconds"], phase_sum)
    assert (s["trainer_update_seconds"] > 0).all() and (s["trainer_switch_seconds"] > 0).all()
    assert res.meta["train"]["kind"] == "analytic"


def test_sim_setup_takes_a_profile_path_and_rejects_a_bad_one(tmp_path):
    from lssim.analysis.replay import SimSetup

    path = tmp_path / "p.json"
    PROFILED.to_json(path)
    assert isinstance(SimSetup(train=str(path)).train_cost(), ProfiledTrainCost)
    with pytest.raises(ValueError, match="does not exist"):
        SimSetup(train=str(tmp_path / "missing.json"))
    with pytest.raises(ValueError, match="TrainCostModel"):
        SimSetup(train=3.0)


def test_profiler_plans_every_cell_in_random_order():
    from real_backend.profile_trainer import PROMPT_LEN, _Prompts, plan_cells, synthetic_batch

    rng = np.random.default_rng(0)
    cells = plan_cells(rng, repeats=2, sync_repeats=3)
    steps = [c for c in cells if c["kind"] == "step"]
    assert sum(c["kind"] == "sync" for c in cells) == 3
    assert len({(c["cell"], c["repeat"]) for c in steps}) == len(steps)
    assert {c["split"] for c in steps} == {"fit", "held_out"}
    assert [c["repeat"] for c in steps] != sorted(c["repeat"] for c in steps)  # shuffled, not in repeat order
    prompts = _Prompts()
    groups = synthetic_batch(rng, [20, 30, 40, 50], prompts, vocab=18)
    assert [len(g.requests) for g in groups] == [2, 2] and all(g.has_signal for g in groups)
    r = groups[1].requests[1]
    assert r.prompt_len + r.generated == 50 and len(prompts.prompt_tokens(r.prompt_id)) == PROMPT_LEN
    assert len(r.tokens) == len(r.signals["logprobs"]) == 42

