"""Tests of the synthetic trace generator, its presets and `lssim synth`."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lssim.cli import main
from lssim.traces.synth import PRESETS, SynthConfig, get_preset, synthesize
from lssim.traces.trace import load_trace, validate_trace
from lssim.traces.summary import trace_info

REPO = Path(__file__).resolve().parents[1]

SMALL = SynthConfig(steps=12, n_prompts=400, prompts_per_step=100, group_size=4, max_tokens=8192)


def info(df):
    return trace_info(df, validate=False)


# --------------------------------------------------------------------------
# determinism and validity
# --------------------------------------------------------------------------


def test_deterministic_under_seed():
    a = synthesize(SMALL.replace(seed=7))
    b = synthesize(SMALL.replace(seed=7))
    pd.testing.assert_frame_equal(a, b)


def test_seeds_differ():
    a = synthesize(SMALL.replace(seed=1))
    b = synthesize(SMALL.replace(seed=2))
    assert a.shape == b.shape
    assert not a["response_len"].equals(b["response_len"])
    assert not a["prompt_id"].equals(b["prompt_id"])


def test_overrides_keyword():
    pd.testing.assert_frame_equal(synthesize(SMALL, seed=3), synthesize(SMALL.replace(seed=3)))


small_configs = st.builds(
    lambda n_prompts, pps_frac, steps, g, mt, seed, tail, pers, loops, lp, drift: SynthConfig(
        n_prompts=n_prompts,
        prompts_per_step=max(1, int(n_prompts * pps_frac)),
        steps=steps,
        group_size=g,
        max_tokens=mt,
        seed=seed,
        tail_fraction=tail,
        persistence=pers,
        loop_fraction=loops,
        length_penalty=lp,
        drift_per_100_steps=drift,
        length_median=min(1900.0, mt),
    ),
    n_prompts=st.integers(1, 40),
    pps_frac=st.floats(0.01, 1.0),
    steps=st.integers(1, 8),
    g=st.integers(1, 5),
    mt=st.integers(1, 40000),
    seed=st.integers(0, 2**32 - 1),
    tail=st.sampled_from([0.0, 0.05, 0.5, 0.99]),
    pers=st.sampled_from([0.0, 0.5, 1.0]),
    loops=st.sampled_from([0.0, 0.1, 1.0]),
    lp=st.sampled_from([0.0, 1.0, 5.0]),
    drift=st.sampled_from([-0.9, 0.0, 3.0]),
)


@settings(max_examples=40, deadline=None)
@given(cfg=small_configs)
def test_output_always_validates(cfg):
    df = synthesize(cfg)
    again = validate_trace(df)
    pd.testing.assert_frame_equal(again, df)
    assert len(df) == cfg.steps * cfg.prompts_per_step * cfg.group_size
    assert (df["max_tokens"] == cfg.max_tokens).all()
    assert df["reward"].isin([0.0, 1.0]).all()
    assert df["finish_reason"].isin(["stop", "length"]).all()
    sizes = df.groupby(["step", "prompt_id"]).size()
    assert (sizes == cfg.group_size).all()
    assert (df.groupby("step")["prompt_id"].nunique() == cfg.prompts_per_step).all()


def test_epochwise_sampling_without_replacement():
    cfg = SynthConfig(steps=10, n_prompts=50, prompts_per_step=12, group_size=2)  # 4 steps/epoch, 2 dropped
    df = synthesize(cfg)
    groups = df[df["sample_idx"] == 0][["step", "prompt_id"]]
    assert cfg.steps_per_epoch == 4
    for epoch, g in groups.groupby(groups["step"] // cfg.steps_per_epoch):
        assert g["prompt_id"].is_unique, f"prompt repeated within epoch {epoch}"
    # the order differs between epochs (a reshuffle, not a fixed cycle)
    e0 = groups[groups["step"] == 0]["prompt_id"].tolist()
    e1 = groups[groups["step"] == 4]["prompt_id"].tolist()
    assert set(e0) != set(e1)
    # every prompt of the pool is used once per full epoch except the dropped remainder
    assert groups[groups["step"] < 4]["prompt_id"].nunique() == 48


# --------------------------------------------------------------------------
# knobs do what they say
# --------------------------------------------------------------------------


def test_persistence_raises_cross_step_correlation():
    base = SynthConfig(steps=16, n_prompts=400, prompts_per_step=100, group_size=8, tail_fraction=0.0,
                       loop_fraction=0.0, max_tokens=10**6)
    lo = info(synthesize(base.replace(persistence=0.0)))
    mid = info(synthesize(base.replace(persistence=0.6)))
    hi = info(synthesize(base.replace(persistence=0.98)))
    assert lo["persistence_pairs"] == mid["persistence_pairs"] == 3 * 400
    assert abs(lo["persistence_spearman"]) < 0.15
    assert lo["persistence_spearman"] < mid["persistence_spearman"] < hi["persistence_spearman"]
    assert hi["persistence_spearman"] > 0.8
    assert hi["persistence_pearson_log"] > mid["persistence_pearson_log"] > lo["persistence_pearson_log"]


def test_loops_are_truncated_with_zero_reward():
    df = synthesize(SMALL.replace(loop_fraction=0.2, reward_a=50, reward_b=1))
    loops = df[df["loop_start"] >= 0]
    assert 0.15 < len(loops) / len(df) < 0.25
    assert (loops["finish_reason"] == "length").all()
    assert (loops["response_len"] == SMALL.max_tokens).all()
    assert (loops["reward"] == 0).all()
    assert (loops["loop_start"] < SMALL.max_tokens).all()
    assert loops["entropy_mean"].mean() < df.loc[df["loop_start"] < 0, "entropy_mean"].mean()
    assert (synthesize(SMALL.replace(loop_fraction=0.0))["loop_start"] == -1).all()
    every = synthesize(SMALL.replace(loop_fraction=1.0))
    assert (every["loop_start"] >= 0).all() and (every["reward"] == 0).all()


def test_truncation_at_max_tokens():
    df = synthesize(SMALL.replace(max_tokens=1000, loop_fraction=0.0))
    assert df["response_len"].max() == 1000
    cut = df["finish_reason"] == "length"
    assert 0.3 < cut.mean() < 0.99  # median typical length 1900 > cap
    assert (df.loc[cut, "response_len"] == 1000).all()
    assert (df.loc[cut, "reward"] == 0).all()
    assert (df.loc[~cut, "response_len"] <= 1000).all()
    wide = synthesize(SMALL.replace(max_tokens=10**7, loop_fraction=0.0, tail_fraction=0.0))
    assert (wide["finish_reason"] == "stop").all()


def test_length_penalty_makes_long_responses_wrong_more_often():
    base = SMALL.replace(loop_fraction=0.0, max_tokens=10**7, group_size=8, steps=8)
    pen = info(synthesize(base.replace(length_penalty=1.5)))
    flat = info(synthesize(base.replace(length_penalty=0.0)))
    assert pen["reward_mean_long"] < pen["reward_mean_short"] - 0.1
    assert abs(flat["reward_mean_long"] - flat["reward_mean_short"]) < 0.03


def test_difficulty_sets_mean_reward():
    easy = info(synthesize(SMALL.replace(reward_a=8, reward_b=1, length_penalty=0, loop_fraction=0)))
    hard = info(synthesize(SMALL.replace(reward_a=1, reward_b=8, length_penalty=0, loop_fraction=0)))
    assert easy["reward_mean"] > 0.75 and hard["reward_mean"] < 0.2


def test_drift_grows_lengths():
    df = synthesize(SMALL.replace(steps=40, n_prompts=200, prompts_per_step=200, drift_per_100_steps=3.0,
                                  max_tokens=10**7, loop_fraction=0))
    med = df.groupby("step")["response_len"].median()
    ratio = med.iloc[-5:].mean() / med.iloc[:5].mean()
    assert 1.5 < ratio < 2.4  # expected 4 ** (35/100) = 1.62


def test_tail_fraction_heavier_tail_and_medians():
    base = SMALL.replace(max_tokens=10**7, loop_fraction=0.0)
    light = info(synthesize(base.replace(tail_fraction=0.0)))
    heavy = info(synthesize(base.replace(tail_fraction=0.15, tail_alpha=0.9)))
    assert heavy["response_len"]["p99"] > 2 * light["response_len"]["p99"]
    assert abs(light["response_len"]["p50"] / 1900 - 1) < 0.15


def test_group_sigma_controls_within_group_spread():
    def spread(gs):
        df = synthesize(SMALL.replace(group_sigma=gs, max_tokens=10**7, loop_fraction=0.0))
        return np.log(df["response_len"]).groupby([df["step"], df["prompt_id"]]).std().mean()

    assert spread(0.0) < 0.01 < 0.2 < spread(0.5)


# --------------------------------------------------------------------------
# config validation
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kw",
    [
        dict(steps=0),
        dict(group_size=-1),
        dict(prompts_per_step=5000),
        dict(persistence=1.5),
        dict(tail_fraction=1.0),
        dict(tail_alpha=0),
        dict(loop_fraction=-0.1),
        dict(length_sigma=-1),
        dict(drift_per_100_steps=-1),
        dict(reward_a=0),
        dict(max_tokens=2.5),
        dict(steps=True),
        dict(length_median=float("nan")),
        dict(length_median="big"),
    ],
)
def test_config_rejects_bad_values(kw):
    with pytest.raises(ValueError, match="SynthConfig." + next(iter(kw))):
        SynthConfig(**kw)


def test_config_unknown_keys():
    with pytest.raises(ValueError, match="unknown SynthConfig key.*bogus"):
        SynthConfig.from_dict({"bogus": 1})
    with pytest.raises(ValueError, match="unknown SynthConfig key.*bogus"):
        SMALL.replace(bogus=1)
    with pytest.raises(TypeError):
        SynthConfig(bogus=1)
    assert SynthConfig.from_dict({"steps": 3}).steps == 3
    assert SynthConfig.from_dict(SMALL.to_dict()) == SMALL


def test_every_field_documented():
    import inspect

    import lssim.traces.synth as S

    src = inspect.getsource(S.SynthConfig)
    for name in SynthConfig.field_names():
        i = src.index(f"    {name}:")
        nxt = src[i:].splitlines()[1].strip()
        assert nxt.startswith('"""'), f"SynthConfig.{name} has no docstring under it"


# --------------------------------------------------------------------------
# presets and reference traces
# --------------------------------------------------------------------------


def test_preset_math7b_shape():
    df = synthesize(PRESETS["math7b"])
    i = info(df)
    assert i["group_size"] == 8 and i["max_tokens"] == 16384 and i["steps"] == 40
    assert i["groups"] == 40 * 256
    assert 1500 <= i["response_len"]["p50"] <= 2500
    assert i["response_len"]["p99"] >= 0.8 * 16384
    assert 0.03 <= i["truncated_fraction"] <= 0.06


def test_preset_longtail32k_shape():
    i = info(synthesize(PRESETS["longtail32k"]))
    assert i["group_size"] == 16 and i["max_tokens"] == 32768 and i["groups"] == 30 * 128
    assert 0.02 <= i["truncated_fraction"] <= 0.08
    assert i["response_len"]["max"] / i["response_len"]["p50"] >= 15
    assert i["step_max_over_median"] >= 15


def test_get_preset_unknown():
    with pytest.raises(ValueError, match="unknown preset 'x'.*math7b"):
        get_preset("x")


@pytest.mark.parametrize("name", ["math7b", "longtail32k"])
def test_reference_trace_matches_its_command(name):
    """traces/<name>.parquet is what `lssim synth --preset <name> --seed 0` makes."""
    ref = load_trace(REPO / "traces" / f"{name}.parquet")
    pd.testing.assert_frame_equal(ref, synthesize(PRESETS[name].replace(seed=0)))


def test_one_million_responses():
    """A million-response trace synthesizes whole and valid (its speed is the benchmark's to print, not a test's)."""
    cfg = PRESETS["math7b"].replace(steps=489)  # 489 * 256 * 8 = 1,001,472 rows
    df = synthesize(cfg)
    assert len(df) == 489 * 256 * 8
    assert df["step"].nunique() == 489 and (df["response_len"] <= df["max_tokens"]).all()


# --------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------


def test_cli_synth_writes_trace(tmp_path, capsys):
    out = tmp_path / "s.parquet"
    rc = main(["synth", "--preset", "math7b", "--seed", "5", "--steps", "3", "--prompts-per-step", "16",
               "--group-size", "4", "--max-tokens", "4096", "--out", str(out)])
    assert rc == 0
    assert "wrote 192 responses" in capsys.readouterr().out
    df = load_trace(out)
    expect = synthesize(PRESETS["math7b"].replace(seed=5, steps=3, prompts_per_step=16, group_size=4,
                                                  max_tokens=4096))
    pd.testing.assert_frame_equal(df, expect)
    assert main(["trace", "info", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["rows"] == 192


def test_cli_synth_set_override(tmp_path):
    out = tmp_path / "s.parquet"
    main(["synth", "--preset", "longtail32k", "--steps", "2", "--set", "loop_fraction=1", "--set",
          "persistence=0.1", "--out", str(out)])
    df = load_trace(out)
    assert (df["loop_start"] >= 0).all() and df["step"].max() == 1


@pytest.mark.parametrize(
    "extra,expect",
    [
        (["--preset", "nope"], "unknown preset 'nope'"),
        (["--preset", "math7b", "--steps", "0"], "SynthConfig.steps must be >= 1"),
        (["--preset", "math7b", "--prompts-per-step", "99999"], "prompts_per_step"),
        (["--preset", "math7b", "--set", "bogus=1"], "unknown SynthConfig key 'bogus'"),
        (["--preset", "math7b", "--set", "steps=many"], "expected an integer"),
        (["--preset", "math7b", "--set", "steps"], "KEY=VALUE"),
    ],
)
def test_cli_synth_bad_input_exits_2(tmp_path, capsys, extra, expect):
    out = tmp_path / "s.parquet"
    with pytest.raises(SystemExit) as ei:
        main(["synth", *extra, "--out", str(out)])
    assert ei.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("lssim: error: ") and expect in err, err
    assert "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


def test_cli_synth_bad_out_dir(tmp_path, capsys):
    with pytest.raises(SystemExit) as ei:
        main(["synth", "--preset", "math7b", "--steps", "1", "--out", str(tmp_path / "no" / "x.parquet")])
    assert ei.value.code == 2
    assert "does not exist" in capsys.readouterr().err


def test_cli_synth_argparse_errors_exit_2(capsys):
    with pytest.raises(SystemExit) as ei:
        main(["synth", "--preset", "math7b"])  # no --out
    assert ei.value.code == 2
    with pytest.raises(SystemExit) as ei:
        main(["synth", "--preset", "math7b", "--seed", "x", "--out", "a.parquet"])
    assert ei.value.code == 2
    assert "lssim synth: error" in capsys.readouterr().err
