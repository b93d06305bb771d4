"""Tests of the trace format: validation, load/write, summaries, `lssim trace info`."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lssim.traces import trace as T
from lssim.cli import main
from lssim.traces.summary import format_trace_info, trace_info
from lssim.traces.trace import (
    COLUMNS,
    KEY,
    OPTIONAL,
    REQUIRED,
    TraceError,
    load_trace,
    validate_trace,
    write_trace,
)

REPO = Path(__file__).resolve().parents[1]


def make_frame(n_steps: int = 2, n_prompts: int = 3, group: int = 2, max_tokens: int = 100) -> pd.DataFrame:
    """A small valid trace with only the required columns, rows in key order."""
    rows = []
    for s in range(n_steps):
        for p in range(n_prompts):
            for k in range(group):
                rl = 10 * (p + 1) + k + s
                rows.append((s, p, k, 5 + p, rl, float((p + k) % 2), "stop", max_tokens))
    df = pd.DataFrame(rows, columns=list(REQUIRED))
    # one truncated response
    df.loc[min(1, len(df) - 1), ["response_len", "finish_reason", "reward"]] = [max_tokens, "length", 0.0]
    return df


def write_raw(df: pd.DataFrame, path: Path) -> Path:
    """Write a parquet file bypassing validation (to test load_trace)."""
    pq.write_table(pa.Table.from_pandas(df, preserve_index=False), path)
    return path


def leftovers(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir())


# --------------------------------------------------------------------------
# valid traces
# --------------------------------------------------------------------------


def test_valid_frame_normalized():
    df = make_frame()
    before = df.copy()
    out = validate_trace(df)
    pd.testing.assert_frame_equal(df, before)  # input untouched
    assert list(out.columns) == [c.name for c in COLUMNS if c.filled]  # measured signals only when measured
    for c in (c for c in COLUMNS if c.filled):
        if c.kind in ("int", "id"):  # the frame's prompt ids are integers: int64
            assert out[c.name].dtype == np.int64, c.name
        elif c.kind == "float":
            assert out[c.name].dtype == np.float64, c.name
        elif c.kind == "bool":
            assert out[c.name].dtype == bool, c.name
        else:
            assert pd.api.types.is_string_dtype(out[c.name].dtype), c.name
    assert (out["stop_reason"] == "").all()
    assert (out["loop_start"] == -1).all()
    assert (out["policy_version_first"] == out["step"]).all()
    assert (out["policy_version_last"] == out["step"]).all()
    assert (out["instance"] == -1).all()
    assert (out["group_id"] == 0).all() and out["trained"].all()
    for c in ("submit_time", "first_token_time", "finish_time", "step_rollout_seconds", "entropy_mean"):
        assert out[c].isna().all()
    assert isinstance(out.index, pd.RangeIndex) and out.index[0] == 0


def test_sorted_with_fresh_index_and_extras_kept():
    df = make_frame()
    df["my_extra"] = np.arange(len(df)) * 10
    shuffled = df.sample(frac=1.0, random_state=3)
    shuffled.index = shuffled.index + 1000
    out = validate_trace(shuffled)
    assert list(out.index) == list(range(len(df)))
    assert out[list(KEY)].equals(df[list(KEY)])
    assert out["my_extra"].tolist() == df["my_extra"].tolist()  # moved with its row
    assert out.columns[-1] == "my_extra"


def test_accepts_loose_but_exact_types():
    df = make_frame()
    df["response_len"] = df["response_len"].astype("float64")  # integral floats are fine
    df["reward"] = df["reward"].astype("int64")  # ints are fine for float columns
    df["prompt_len"] = df["prompt_len"].astype("int32")
    df["finish_reason"] = df["finish_reason"].astype("category")
    df["step"] = df["step"].astype("Int64")
    df["max_tokens"] = df["max_tokens"].astype(object)
    out = validate_trace(df)
    assert out["response_len"].dtype == np.int64 and out["reward"].dtype == np.float64
    assert out["finish_reason"].tolist() == make_frame()["finish_reason"].tolist()


def test_optional_columns_present_are_checked_and_kept():
    df = make_frame()
    df["loop_start"] = -1
    df.loc[3, "loop_start"] = 4
    df["stop_reason"] = [None] * len(df)
    df["finish_time"] = np.linspace(1, 2, len(df))
    df["step_rollout_seconds"] = df["step"] * 10.0 + 5
    out = validate_trace(df)
    assert out.loc[3, "loop_start"] == 4
    assert (out["stop_reason"] == "").all()
    assert out["step_rollout_seconds"].tolist() == (df["step"] * 10.0 + 5).tolist()


def test_round_trip(tmp_path):
    df = make_frame()
    df["entropy_mean"] = 0.5
    df["extra_col"] = "x"
    path = tmp_path / "t.parquet"
    written = write_trace(df, path)
    assert leftovers(tmp_path) == ["t.parquet"]
    back = load_trace(path)
    pd.testing.assert_frame_equal(back, written)
    pd.testing.assert_frame_equal(back, validate_trace(df))
    assert pq.read_schema(path).metadata[b"lssim.trace_format"] == T.TRACE_FORMAT_VERSION.encode()


@settings(max_examples=25, deadline=None)
@given(
    n_steps=st.integers(1, 4),
    n_prompts=st.integers(1, 5),
    group=st.integers(1, 4),
    seed=st.integers(0, 2**16),
)
def test_round_trip_property(tmp_path_factory, n_steps, n_prompts, group, seed):
    rng = np.random.default_rng(seed)
    df = make_frame(n_steps, n_prompts, group, max_tokens=200)
    df["response_len"] = rng.integers(0, 200, len(df))
    df["finish_reason"] = rng.choice(["stop", "abort", "policy_stop"], len(df))
    df["reward"] = rng.uniform(-1, 1, len(df))
    df = df.sample(frac=1.0, random_state=seed % 1000)
    path = tmp_path_factory.mktemp("rt") / "t.parquet"
    written = write_trace(df, path)
    pd.testing.assert_frame_equal(load_trace(path), written)
    assert written[list(KEY)].apply(tuple, axis=1).is_monotonic_increasing


# --------------------------------------------------------------------------
# malformed traces
# --------------------------------------------------------------------------


def _set(col, row, value):
    def f(df):
        df[col] = df[col].astype(object)
        df.loc[row, col] = value
        return df

    return f


def _setcol(col, values):
    def f(df):
        df[col] = values(df)
        return df

    return f


# (id, mutation, substrings the message must contain)
BAD_CASES = [
    ("string_in_int", _set("response_len", 4, "12"), ["'response_len'", "row 4", "'12'"]),
    ("strdtype_in_int", _setcol("response_len", lambda d: d["response_len"].astype(str)), ["'response_len'", "row 0"]),
    ("fraction_in_int", _setcol("prompt_len", lambda d: d["prompt_len"] + np.where(d.index == 5, 0.5, 0.0)),
     ["'prompt_len'", "row 5", "7.5", "non-integer"]),
    ("nan_in_int", _setcol("response_len", lambda d: np.where(d.index == 2, np.nan, d["response_len"])),
     ["'response_len'", "row 2", "NaN"]),
    ("bool_in_int", _setcol("step", lambda d: d["step"] > 0), ["'step'", "bool"]),
    ("negative_len", _set("response_len", 3, -5), ["'response_len'", "row 3", "-5", ">= 0"]),
    ("zero_prompt_len", _set("prompt_len", 7, 0), ["'prompt_len'", "row 7", ">= 1"]),
    ("negative_step", _set("step", 0, -1), ["'step'", "row 0", "-1"]),
    ("reward_nan", _setcol("reward", lambda d: np.where(d.index == 6, np.nan, d["reward"])),
     ["'reward'", "row 6", "NaN"]),
    ("reward_inf", _setcol("reward", lambda d: np.where(d.index == 6, np.inf, d["reward"])),
     ["'reward'", "row 6", "inf"]),
    ("reward_text", _set("reward", 2, "good"), ["'reward'", "row 2", "'good'"]),
    ("finish_unknown", _set("finish_reason", 9, "eos"), ["'finish_reason'", "row 9", "'eos'", "one of"]),
    ("finish_missing", _set("finish_reason", 9, None), ["'finish_reason'", "row 9", "missing"]),
    ("finish_not_text", _set("finish_reason", 2, 3), ["'finish_reason'", "row 2", "text"]),
    ("len_gt_max", _set("response_len", 4, 101), ["'response_len'", "row 4", "101", "max_tokens 100"]),
    ("length_not_max", _set("response_len", 1, 99), ["'finish_reason'", "row 1", "99", "length"]),
    ("max_tokens_zero", _set("max_tokens", 0, 0), ["'max_tokens'", "row 0", ">= 1"]),
    ("loop_past_end", _setcol("loop_start", lambda d: np.where(d.index == 3, 1000, -1)), ["'loop_start'", "row 3", "1000"]),
    ("versions_reversed", _setcol("policy_version_first", lambda d: d["step"] + (d.index == 10)),
     ["'policy_version_first'", "row 10"]),
    ("times_reversed", _setcol("finish_time", lambda d: np.where(d.index == 2, 0.5, 3.0)),
     ["'finish_time'", "row 2"]),
    ("step_time_varies", _setcol("step_rollout_seconds", lambda d: np.where(d.index == 4, 9.0, 10.0)),
     ["'step_rollout_seconds'", "row 4", "step 0", "9.0"]),
    ("entropy_negative", _setcol("entropy_mean", lambda d: np.where(d.index == 11, -0.1, 0.3)),
     ["'entropy_mean'", "row 11", "-0.1"]),
]


def _mutate_for_time_case(df):
    df["submit_time"] = 0.0
    df["first_token_time"] = 1.0
    return df


@pytest.mark.parametrize("case", BAD_CASES, ids=[c[0] for c in BAD_CASES])
def test_malformed_frame_refused(case):
    name, mutate, expect = case
    df = make_frame()
    if name == "times_reversed":
        df = _mutate_for_time_case(df)
    df = mutate(df)
    with pytest.raises(TraceError) as ei:
        validate_trace(df, source="bad.parquet")
    msg = str(ei.value)
    assert msg.startswith("bad.parquet: ")
    for s in expect:
        assert s in msg, (s, msg)


@pytest.mark.parametrize("case", BAD_CASES[:6], ids=[c[0] for c in BAD_CASES[:6]])
def test_malformed_file_refused_names_file(tmp_path, case):
    name, mutate, expect = case
    df = mutate(make_frame())
    if name in ("string_in_int",):  # mixed object column can't go to parquet as is
        df["response_len"] = df["response_len"].astype(str)
        expect = ["'response_len'", "row 0"]
    path = write_raw(df, tmp_path / f"{name}.parquet")
    with pytest.raises(TraceError) as ei:
        load_trace(path)
    msg = str(ei.value)
    assert str(path) in msg
    for s in expect:
        assert s in msg, (s, msg)


@pytest.mark.parametrize("col", REQUIRED)
def test_missing_required_column(col):
    df = make_frame().drop(columns=[col])
    with pytest.raises(TraceError, match=f"f.parquet: missing required column.*'{col}'"):
        validate_trace(df, source="f.parquet")


def test_duplicate_key_names_key_and_both_rows():
    df = make_frame()
    df.loc[9, ["step", "prompt_id", "sample_idx"]] = df.loc[2, ["step", "prompt_id", "sample_idx"]].to_numpy()
    with pytest.raises(TraceError) as ei:
        validate_trace(df, source="d.parquet")
    msg = str(ei.value)
    s, p, k = df.loc[2, ["step", "prompt_id", "sample_idx"]]
    assert f"step={s}, prompt_id={p}, sample_idx={k}" in msg
    assert "row 9" in msg and "row 2" in msg and msg.startswith("d.parquet")


def test_empty_frame():
    with pytest.raises(TraceError, match="x: empty trace"):
        validate_trace(make_frame().iloc[:0], source="x")


def test_not_a_frame():
    with pytest.raises(TraceError):
        validate_trace([1, 2, 3])


@settings(max_examples=30, deadline=None)
@given(
    row=st.integers(0, 11),
    col=st.sampled_from(["step", "prompt_id", "sample_idx", "prompt_len", "response_len", "max_tokens"]),
    value=st.sampled_from([-3, -1.0, 2.5, np.nan]),
)
def test_first_bad_row_is_named(row, col, value):
    df = make_frame()
    df[col] = df[col].astype("float64")
    df.loc[row, col] = value
    with pytest.raises(TraceError) as ei:
        validate_trace(df, source="h.parquet")
    msg = str(ei.value)
    assert f"'{col}'" in msg and f"row {row}" in msg, msg


# ---- file-level problems -------------------------------------------------------


def test_missing_file(tmp_path):
    with pytest.raises(TraceError, match="no such file"):
        load_trace(tmp_path / "nope.parquet")


def test_directory_is_not_a_trace(tmp_path):
    with pytest.raises(TraceError, match="not a regular file"):
        load_trace(tmp_path)


def test_not_parquet(tmp_path):
    p = tmp_path / "t.parquet"
    p.write_text("step,prompt_id\n1,2\n")
    with pytest.raises(TraceError, match=r"t\.parquet: not a parquet file"):
        load_trace(p)


def test_zero_byte_file(tmp_path):
    p = tmp_path / "t.parquet"
    p.write_bytes(b"")
    with pytest.raises(TraceError, match="empty file"):
        load_trace(p)


def test_zero_row_parquet(tmp_path):
    p = write_raw(make_frame().iloc[:0], tmp_path / "t.parquet")
    with pytest.raises(TraceError, match=r"t\.parquet: empty trace \(no rows\)"):
        load_trace(p)


# ---- atomic writing ------------------------------------------------------------------


def test_write_invalid_leaves_nothing(tmp_path):
    df = make_frame()
    df.loc[0, "response_len"] = -1
    with pytest.raises(TraceError, match="out.parquet"):
        write_trace(df, tmp_path / "out.parquet")
    assert leftovers(tmp_path) == []


def test_write_invalid_keeps_existing_file(tmp_path):
    path = tmp_path / "out.parquet"
    good = write_trace(make_frame(), path)
    bad = make_frame()
    bad["reward"] = np.inf  # rewards may take any scale (lssim.loop.rewards), but must be finite
    with pytest.raises(TraceError):
        write_trace(bad, path)
    assert leftovers(tmp_path) == ["out.parquet"]
    pd.testing.assert_frame_equal(load_trace(path), good)


def test_write_failure_leaves_no_partial_file(tmp_path, monkeypatch):
    path = tmp_path / "out.parquet"
    good = write_trace(make_frame(), path)

    def broken(table, where, **kw):
        with open(where, "wb") as f:
            f.write(b"PAR1 half written")
        raise OSError("disk full")

    monkeypatch.setattr(pq, "write_table", broken)
    with pytest.raises(OSError, match="disk full"):
        write_trace(make_frame(n_steps=3), path)
    assert leftovers(tmp_path) == ["out.parquet"]
    monkeypatch.undo()
    pd.testing.assert_frame_equal(load_trace(path), good)

    monkeypatch.setattr(pq, "write_table", broken)
    with pytest.raises(OSError):
        write_trace(make_frame(), tmp_path / "new.parquet")
    assert leftovers(tmp_path) == ["out.parquet"]


def test_write_into_missing_directory(tmp_path):
    with pytest.raises(TraceError, match="does not exist"):
        write_trace(make_frame(), tmp_path / "no" / "t.parquet")


# --------------------------------------------------------------------------
# speed
# --------------------------------------------------------------------------


def test_validate_one_million_rows():
    """A million rows validate and come back sorted by key (how fast: `python -m lssim.benchmarks.sim_speed
    --only cli` times load + validation inside the 1,024,000-response replay; no timed unit tests)."""
    n_steps, n_prompts, g = 50, 2500, 8
    n = n_steps * n_prompts * g
    rng = np.random.default_rng(0)
    rl = rng.integers(0, 16384, n)
    df = pd.DataFrame(
        {
            "step": np.repeat(np.arange(n_steps), n_prompts * g),
            "prompt_id": np.tile(np.repeat(np.arange(n_prompts), g), n_steps),
            "sample_idx": np.tile(np.arange(g), n_steps * n_prompts),
            "prompt_len": rng.integers(1, 500, n),
            "response_len": rl,
            "reward": rng.integers(0, 2, n).astype(float),
            "finish_reason": np.where(rl == 16383, "length", "stop"),
            "max_tokens": np.full(n, 16384),
        }
    )
    df.loc[rl == 16383, "response_len"] = 16384
    df = df.iloc[::-1]  # exercise the sort too
    out = validate_trace(df)
    assert len(out) == n
    keys = out[["step", "prompt_id", "sample_idx"]].to_numpy()
    assert (np.diff(keys[:, 0]) >= 0).all() and out["step"].iloc[0] == 0 and out["sample_idx"].iloc[:g].tolist() == list(range(g))


# --------------------------------------------------------------------------
# trace_info and the CLI
# --------------------------------------------------------------------------


def test_trace_info_values():
    df = make_frame(n_steps=2, n_prompts=3, group=2, max_tokens=35)
    df["loop_start"] = -1
    df.loc[1, "loop_start"] = 3
    info = trace_info(df)
    json.dumps(info)  # serializable
    assert info["rows"] == 12 and info["steps"] == 2 and info["prompts"] == 3
    assert info["groups"] == 6 and info["group_size"] == 2 and info["max_tokens"] == 35
    rl = validate_trace(df)["response_len"]
    assert info["response_len"]["max"] == rl.max() == 35
    assert info["response_len"]["p50"] == pytest.approx(np.quantile(rl, 0.5))
    assert info["truncated_fraction"] == pytest.approx(1 / 12)
    assert info["loop_fraction"] == pytest.approx(1 / 12)
    assert info["reward_mean"] == pytest.approx(validate_trace(df)["reward"].mean())
    assert info["persistence_pairs"] == 3
    # prompts keep their relative lengths across the two steps -> perfect rank correlation
    assert info["persistence_spearman"] == pytest.approx(1.0)


def test_trace_info_ragged_groups():
    df = make_frame().iloc[:-1]
    info = trace_info(df)
    assert info["group_size"] is None and info["group_size_min"] == 1 and info["group_size_max"] == 2
    assert "1..2" in format_trace_info(info)


def test_cli_trace_info(tmp_path, capsys):
    path = tmp_path / "t.parquet"
    write_trace(make_frame(), path)
    assert main(["trace", "info", str(path)]) == 0
    out = capsys.readouterr().out
    assert "rows" in out and "12" in out and "persistence" in out and "truncated" in out
    assert main(["trace", "info", str(path), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["rows"] == 12 and info["file"] == str(path)
    assert info["response_len"]["max"] == 100


@pytest.mark.parametrize(
    "content,expect",
    [(None, "no such file"), (b"not parquet at all", "not a parquet file"), (b"", "empty file")],
)
def test_cli_trace_info_bad_file(tmp_path, capsys, content, expect):
    path = tmp_path / "t.parquet"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(SystemExit) as ei:
        main(["trace", "info", str(path)])
    assert ei.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("lssim: error: ") and str(path) in err and expect in err
    assert "Traceback" not in err


def test_cli_trace_info_invalid_trace(tmp_path, capsys):
    df = make_frame()
    df.loc[5, "finish_reason"] = "weird"
    path = write_raw(df, tmp_path / "t.parquet")
    with pytest.raises(SystemExit) as ei:
        main(["trace", "info", str(path)])
    assert ei.value.code == 2
    err = capsys.readouterr().err
    assert "'finish_reason'" in err and "row 5" in err and "'weird'" in err


def test_cli_usage_errors_exit_2(capsys):
    for argv in ([], ["trace"], ["nonsense"]):
        with pytest.raises(SystemExit) as ei:
            main(argv)
        assert ei.value.code == 2
    assert "lssim: error" in capsys.readouterr().err


# --------------------------------------------------------------------------
# documentation
# --------------------------------------------------------------------------


def test_readme_documents_every_column():
    text = (REPO / "traces" / "README.md").read_text()
    for c in COLUMNS:
        assert f"`{c.name}`" in text, c.name
    for r in T.FINISH_REASONS:
        assert f"`{r}`" in text
    assert T.schema_markdown() in text, "traces/README.md column table is out of date with lssim.traces.trace.COLUMNS"


@pytest.mark.parametrize("name", ["math7b", "longtail32k"])
def test_reference_traces_valid_and_small(name):
    path = REPO / "traces" / f"{name}.parquet"
    assert path.stat().st_size < 3_000_000
    df = load_trace(path)
    assert len(df) > 10_000
    assert {c.name for c in COLUMNS if c.filled and not c.required} <= set(df.columns)


@pytest.mark.parametrize("suffix", [".csv", ".jsonl", ".json"])
def test_text_tables_load_as_the_parquet_trace(tmp_path, suffix):
    """A trace kept as CSV or JSON (a spreadsheet, a logging script) loads as the same frame as its parquet."""
    frame = make_frame()
    frame["stop_reason"] = ["", "loop"] * (len(frame) // 2)
    frame["submit_time"] = [float("nan"), 0.5] * (len(frame) // 2)
    frame["prompt_id"] = [f"q{p}" for p in frame["prompt_id"]]
    write_trace(frame, tmp_path / "t.parquet")
    path = tmp_path / f"t{suffix}"
    {".csv": lambda: frame.to_csv(path, index=False),
     ".jsonl": lambda: frame.to_json(path, orient="records", lines=True),
     ".json": lambda: frame.to_json(path, orient="records")}[suffix]()
    pd.testing.assert_frame_equal(load_trace(path), load_trace(tmp_path / "t.parquet"))


def test_text_table_errors_name_the_file_and_the_row(tmp_path):
    broken = tmp_path / "broken.csv"
    broken.write_text('step,prompt_id\n"1,2\n')
    with pytest.raises(TraceError, match=r"broken\.csv: not a CSV table"):
        load_trace(broken)
    frame = make_frame()
    frame.loc[3, "response_len"] = -1
    bad = tmp_path / "bad.csv"
    frame.to_csv(bad, index=False)
    with pytest.raises(TraceError, match=r"bad\.csv: column 'response_len': row 3"):
        load_trace(bad)
