"""Measured early-exit signals from real tokens (issue 36, items 1-2): `lssim import` keeps them from a dump's token ids
(slime: the tokens and rollout_log_probs; verl: the text retokenized), `lssim signals` adds them to a trace, each value
is what lssim.loop.signals.signals_along -- the function the real engine calls -- gives at that stride, and a replay of
breaker on the trace stops exactly the responses whose signals cross its threshold at a check."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import WhitespaceSplit

from lssim.cli import main
from lssim.loop.signals import DEFAULT, SignalSpec, repetition_rate, signals_along
from lssim.traces.importers.common import EOS_SKIPPED
from lssim.traces.signal_trace import DEFAULT_STRIDE, measure_response
from lssim.traces.trace import load_trace

torch = pytest.importorskip("torch")

VOCAB = 2000
STRIDE = 64
MIN_TOKENS, CHECK_EVERY = 256, 64
BREAKER = f"breaker(min_tokens={MIN_TOKENS}, check_every={CHECK_EVERY})"
BREAKER_REPETITION_ONLY = f"breaker(min_tokens={MIN_TOKENS}, check_every={CHECK_EVERY}, entropy_below=0, entropy_above=1e999)"
# (length, where the period-3 loop starts or None): lengths off the 64-token checks, so no check falls on an end.
# The 400-token one loops for its last 60 tokens only: its window never holds enough of the loop by its last check.
SHAPES = [(600, 300), (600, None), (450, None), (130, None), (520, 200), (400, 340), (600, 300), (333, None)]


def response(rng: np.random.Generator, n: int, loop_at: int | None) -> tuple[list[int], list[float]]:
    """Random token ids (4..VOCAB), ending in a period-3 cycle from `loop_at`; log-probs near -1 (entropy ~1 nat:
    neither breaker's collapse nor its babble), -0.5 inside the loop."""
    tokens = rng.integers(4, VOCAB, n).tolist()
    logprobs = rng.uniform(-1.5, -0.5, n).tolist()
    if loop_at is not None:
        tokens[loop_at:] = [7, 8, 9] * ((n - loop_at) // 3) + [7, 8, 9][: (n - loop_at) % 3]
        logprobs[loop_at:] = [-0.5] * (n - loop_at)
    return tokens, logprobs


def make_responses(seed: int = 0) -> list[list[tuple[list[int], list[float]]]]:
    """Two steps of two groups of four responses."""
    rng = np.random.default_rng(seed)
    shapes = SHAPES + SHAPES[::-1]
    return [[[response(rng, *shapes[8 * s + 4 * g + k]) for k in range(4)] for g in range(2)] for s in range(2)]


def write_slime(root: Path, steps, logprobs: bool = True) -> Path:
    """`--dump-details root` as tests/test_importers.py writes it, with real token ids and slime's Sample.rollout_log_probs
    (one log-prob per response token)."""
    d = root / "rollout_data"
    d.mkdir(parents=True)
    index = group_index = 0
    for step, groups in enumerate(steps):
        samples = []
        for g, group in enumerate(groups):
            for tokens, lps in group:
                prompt = [1, 100 + g, 200 + step]
                samples.append({"group_index": group_index, "index": index, "prompt": f"prompt {g} of step {step}",
                                "tokens": prompt + tokens, "response_length": len(tokens), "reward": float(index % 2),
                                "status": "completed", "weight_versions": [str(step)], "metadata": {},
                                "rollout_log_probs": lps if logprobs else None, "loss_mask": None})
                index += 1
            group_index += 1
        torch.save({"rollout_id": step, "samples": samples}, d / f"{step}.pt")
    return root


def expected_signals(tokens, logprobs, stride=STRIDE) -> tuple[np.ndarray, np.ndarray]:
    rep, ent = signals_along(tokens, logprobs, range(stride, len(tokens) + 1, stride), DEFAULT)
    return np.asarray(rep, np.float32), np.asarray(ent, np.float32)


def stopped_by_rule(tokens) -> bool:
    """Whether breaker's repetition rule fires at one of its checks: every CHECK_EVERY tokens from MIN_TOKENS, before
    the end, on signals_along's value there."""
    checks = list(range(MIN_TOKENS, len(tokens), CHECK_EVERY))
    return bool(checks) and max(signals_along(tokens, None, checks, DEFAULT)[0]) >= 0.5


def replay_stops(trace: Path, policy: str, capsys) -> int:
    """How many responses `lssim replay --json` says the policy stopped (its policy_stopped_fraction of them all)."""
    capsys.readouterr()
    assert main(["replay", str(trace), "--policy", policy, "--instances", "1", "--no-reference", "--json"]) == 0
    (summary,) = json.loads(capsys.readouterr().out).values()
    stopped = summary["policy_stopped_fraction"] * len(load_trace(trace))
    assert stopped == pytest.approx(round(stopped))
    return round(stopped)


def by_source(frame: pd.DataFrame, steps) -> list:
    """The (tokens, logprobs) of each trace row, found from its source file and record."""
    flat = {step: [r for group in groups for r in group] for step, groups in enumerate(steps)}
    return [flat[int(Path(f).stem)][int(i)] for f, i in zip(frame["source_file"], frame["source_record"])]


def test_slime_import_keeps_the_signals_and_breaker_stops_exactly_the_loops(tmp_path, capsys):
    steps = make_responses()
    src, out = write_slime(tmp_path / "dump", steps), tmp_path / "trace.parquet"
    assert main(["import", "slime", str(src), "-o", str(out)]) == 0
    said = capsys.readouterr().out
    assert f"early-exit signals measured from the dump's token ids and rollout_log_probs (window {DEFAULT.window}, at most half a response's budget; stride {STRIDE})" in said
    trace = load_trace(out)
    assert set(trace["signal_source"]) == {"measured"} and set(trace["signal_stride"]) == {DEFAULT_STRIDE}
    rows = by_source(trace, steps)
    for (tokens, lps), rep, ent in zip(rows, trace["signal_repetition"], trace["signal_entropy"]):
        want_rep, want_ent = expected_signals(tokens, lps)
        np.testing.assert_array_equal(rep, want_rep)
        np.testing.assert_array_equal(ent, want_ent)
    loops = sum(stopped_by_rule(tokens) for tokens, _ in rows)
    assert 0 < loops < sum(loop_at is not None for _, loop_at in SHAPES) * 2  # the late loop (400, 340) is not stopped
    assert replay_stops(out, BREAKER, capsys) == loops


def test_slime_without_log_probs_measures_repetition_only(tmp_path, capsys):
    steps = make_responses(1)
    src, out = write_slime(tmp_path / "dump", steps, logprobs=False), tmp_path / "trace.parquet"
    assert main(["import", "slime", str(src), "-o", str(out), "--signal-stride", "32"]) == 0
    assert "have no rollout_log_probs: their early-exit entropy is NaN" in capsys.readouterr().out
    trace = load_trace(out)
    for (tokens, _), rep, ent in zip(by_source(trace, steps), trace["signal_repetition"], trace["signal_entropy"]):
        np.testing.assert_array_equal(rep, expected_signals(tokens, None, 32)[0])
        assert len(ent) == len(tokens) // 32 and np.isnan(ent).all()
    with pytest.raises(SystemExit):  # breaker's entropy rules have nothing to read: refused, naming the signal
        main(["replay", str(out), "--policy", BREAKER, "--instances", "1", "--no-reference", "--json"])
    assert "entropy" in capsys.readouterr().err
    assert replay_stops(out, BREAKER_REPETITION_ONLY, capsys) == sum(stopped_by_rule(t) for t, _ in by_source(trace, steps))


def test_no_signals_leaves_the_trace_without_them(tmp_path, capsys):
    src, out = write_slime(tmp_path / "dump", make_responses()), tmp_path / "trace.parquet"
    assert main(["import", "slime", str(src), "-o", str(out), "--no-signals"]) == 0
    assert "early-exit signals not measured (--no-signals)" in capsys.readouterr().out
    assert set(load_trace(out)["signal_source"]) == {""}


# --------------------------------------------------------------------------
# verl: text, retokenized
# --------------------------------------------------------------------------


@pytest.fixture
def word_tokenizer(tmp_path) -> Path:
    """A word-level tokenizer: word w{k} is id k + 4 (ids 0..3 special, the EOS 2)."""
    vocab = {"<pad>": 0, "<bos>": 1, "<eos>": 2, "<unk>": 3, **{f"w{k}": k + 4 for k in range(VOCAB)}}
    tok = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = WhitespaceSplit()
    d = tmp_path / "tokenizer"
    d.mkdir()
    tok.save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<eos>"}))
    return d


def text(tokens: list[int]) -> str:
    return " ".join(f"w{t - 4}" for t in tokens)


def write_verl(root: Path, steps) -> Path:
    """trainer.rollout_data_dir as tests/test_importers.py writes it: decoded text without the EOS (every response here
    stopped: the framework counted one token more than the text has)."""
    root.mkdir(parents=True)
    for s, groups in enumerate(steps):
        rows = [{"input": f"prompt {g}", "output": text(tokens), "score": 1.0, "step": s + 1, "uid": f"u{s}-{g}"}
                for g, group in enumerate(groups) for tokens, _ in group]
        (root / f"{s + 1}.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return root


def test_verl_import_retokenizes_and_breaker_stops_exactly_the_loops(tmp_path, word_tokenizer, capsys):
    steps = make_responses(2)
    src, out = write_verl(tmp_path / "dump", steps), tmp_path / "trace.parquet"
    assert main(["import", "verl", str(src), "-o", str(out), "--tokenizer", str(word_tokenizer), "--max-tokens", "1024"]) == 0
    assert "early-exit signals measured from the retokenized text" in capsys.readouterr().out
    trace = load_trace(out).sort_values(["step", "source_record"])
    flat = [tokens + [EOS_SKIPPED] for groups in steps for group in groups for tokens, _ in group]  # the EOS verl counted
    assert trace["response_len"].tolist() == [len(t) for t in flat]
    for tokens, rep, ent in zip(flat, trace["signal_repetition"], trace["signal_entropy"]):
        np.testing.assert_array_equal(rep, expected_signals(tokens, None)[0])
        assert np.isnan(ent).all()
    loops = sum(stopped_by_rule(t) for t in flat)
    assert loops > 0 and replay_stops(out, BREAKER_REPETITION_ONLY, capsys) == loops


# --------------------------------------------------------------------------
# lssim signals
# --------------------------------------------------------------------------


def token_rows(trace: pd.DataFrame, rows, with_logprobs: bool = True) -> list[dict]:
    return [{"step": int(s), "prompt_id": int(p), "sample_idx": int(k), "tokens": t,
             **({"logprobs": lp} if with_logprobs else {})}
            for s, p, k, (t, lp) in zip(trace["step"], trace["prompt_id"], trace["sample_idx"], rows)]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


@pytest.fixture
def bare(tmp_path):
    """A slime import without signals, the import with them, and the token rows of each trace row."""
    steps = make_responses(3)
    src = write_slime(tmp_path / "dump", steps)
    assert main(["import", "slime", str(src), "-o", str(tmp_path / "bare.parquet"), "--no-signals"]) == 0
    assert main(["import", "slime", str(src), "-o", str(tmp_path / "full.parquet")]) == 0
    trace = load_trace(tmp_path / "bare.parquet")
    return tmp_path / "bare.parquet", load_trace(tmp_path / "full.parquet"), token_rows(trace, by_source(trace, steps))


SIGNAL_COLUMNS = ["signal_source", "signal_window", "signal_ngram", "signal_stride", "signal_repetition", "signal_entropy"]


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_signals_round_trip_equals_the_import(bare, tmp_path, capsys, fmt):
    trace, full, rows = bare
    source = tmp_path / f"tokens.{fmt}"
    write_jsonl(source, rows) if fmt == "jsonl" else pd.DataFrame(rows).to_parquet(source)
    out = tmp_path / "measured.parquet"
    capsys.readouterr()
    assert main(["signals", str(trace), "--tokens", str(source), "--out", str(out)]) == 0
    loops = sum(max(measure_response(r["tokens"])["signal_repetition"], default=0) >= 0.5 for r in rows)
    said = capsys.readouterr().out
    assert said.count("\n") == 1 and f"of {len(rows)} of {len(rows)} responses" in said and f": {loops} loop(s)" in said
    got = load_trace(out)
    pd.testing.assert_frame_equal(got[SIGNAL_COLUMNS], full[SIGNAL_COLUMNS])


def test_signals_from_text_with_a_tokenizer(bare, tmp_path, word_tokenizer):
    trace, full, rows = bare
    source = write_jsonl(tmp_path / "text.jsonl", [{**{k: r[k] for k in ("step", "prompt_id", "sample_idx")},
                                                    "text": text(r["tokens"])} for r in rows])
    out = tmp_path / "measured.parquet"
    with pytest.raises(SystemExit):
        main(["signals", str(trace), "--tokens", str(source), "--out", str(out)])
    assert main(["signals", str(trace), "--tokens", str(source), "--out", str(out), "--tokenizer", str(word_tokenizer)]) == 0
    got = load_trace(out)
    for a, b in zip(got["signal_repetition"], full["signal_repetition"]):
        np.testing.assert_array_equal(a, b)
    assert all(np.isnan(e).all() for e in got["signal_entropy"])  # text has no log-probs


def fails(argv: list[str], capsys) -> str:
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    return err


def test_signals_errors_name_the_row(bare, tmp_path, capsys):
    trace, _, rows = bare
    out = tmp_path / "out.parquet"
    argv = ["signals", str(trace), "--out", str(out), "--tokens"]
    short = [dict(r) for r in rows]
    short[2]["tokens"], short[2]["logprobs"] = short[2]["tokens"][:-1], short[2]["logprobs"][:-1]
    err = fails(argv + [str(write_jsonl(tmp_path / "short.jsonl", short))], capsys)
    key = f"step {rows[2]['step']}, prompt_id {rows[2]['prompt_id']}, sample_idx {rows[2]['sample_idx']}"
    assert f"short.jsonl: line 3: ({key}) has {len(short[2]['tokens'])} tokens, but its trace row's response_len is" in err
    unknown = rows + [{**rows[0], "sample_idx": 99}]
    err = fails(argv + [str(write_jsonl(tmp_path / "unknown.jsonl", unknown))], capsys)
    assert f"unknown.jsonl: line {len(unknown)}: (step {rows[0]['step']}, prompt_id {rows[0]['prompt_id']}, sample_idx 99) " \
           f"is not a row of the trace {trace}" in err
    err = fails(argv + [str(write_jsonl(tmp_path / "twice.jsonl", rows + rows[:1]))], capsys)
    assert f"twice.jsonl: line {len(rows) + 1}:" in err and "again (first at" in err
    err = fails(argv + [str(write_jsonl(tmp_path / "few.jsonl", rows[1:]))], capsys)
    assert f"{trace}: row 0 (step {rows[0]['step']}, prompt_id {rows[0]['prompt_id']}, sample_idx {rows[0]['sample_idx']}) " \
           "has no tokens (1 of" in err and "--partial" in err
    assert not out.exists()


def test_signals_partial_leaves_rows_without_tokens_without_signals(bare, tmp_path, capsys):
    trace, full, rows = bare
    few = write_jsonl(tmp_path / "few.jsonl", rows[1:])
    out = tmp_path / "out.parquet"
    assert main(["signals", str(trace), "--tokens", str(few), "--out", str(out), "--partial"]) == 0
    got = load_trace(out)
    assert got["signal_source"].tolist() == [""] + ["measured"] * (len(rows) - 1)
    err = fails(["replay", str(out), "--policy", BREAKER, "--instances", "1", "--no-reference", "--json"], capsys)
    assert "signal" in err
    first = write_jsonl(tmp_path / "first.jsonl", rows[:1])  # the missing row later: the others keep their signals
    assert main(["signals", str(out), "--tokens", str(first), "--out", str(out), "--partial"]) == 0
    pd.testing.assert_frame_equal(load_trace(out)[SIGNAL_COLUMNS], full[SIGNAL_COLUMNS])


# --------------------------------------------------------------------------
# measure_response is signals_along at every stride
# --------------------------------------------------------------------------


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(0, 5), max_size=300), st.integers(1, 40), st.integers(1, 4), st.integers(0, 40), st.booleans())
def test_measure_response_is_signals_along_at_each_stride(tokens, stride, ngram, extra, with_logprobs):
    spec = SignalSpec(ngram + extra, ngram)
    logprobs = [-(t % 3) / 2 for t in tokens] if with_logprobs else None
    got = measure_response(tokens, logprobs, spec=spec, stride=stride)
    positions = list(range(stride, len(tokens) + 1, stride))
    rep, ent = signals_along(tokens, logprobs, positions, spec)
    np.testing.assert_array_equal(got["signal_repetition"], np.asarray(rep, np.float32))
    np.testing.assert_array_equal(got["signal_entropy"], np.asarray(ent, np.float32))
    assert len(got["signal_repetition"]) == len(tokens) // stride
    for value, p in zip(got["signal_repetition"], positions):  # the sliding count is the window's own n-gram count
        assert value == np.float32(repetition_rate(tokens[max(0, p - spec.window):p], ngram))
