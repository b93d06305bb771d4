"""The rollout-trace format: schema, validation, loading, writing, summaries.

A *trace* is a table with one row per generated response of an RL
post-training run (GRPO/DAPO style): which step (policy version) it was
generated at, which prompt and group member it is, how long the prompt and
response were, what reward it got and why generation ended.  The schema lives
in :data:`COLUMNS` -- the single place in code that defines the format; the
validation, the defaults for optional columns and the documentation table
(:func:`schema_markdown`) are all derived from it.

Public API
----------
- :class:`TraceError` -- raised for any malformed trace (a ``ValueError``).
- :data:`COLUMNS`, :data:`SCHEMA`, :data:`REQUIRED`, :data:`OPTIONAL`,
  :data:`KEY`, :data:`FINISH_REASONS` -- the schema.
- :func:`load_trace` -- read and validate a parquet trace.
- :func:`validate_trace` -- check a frame and return its normalized form.
- :func:`write_trace` -- validate and atomically write a parquet trace.
- :func:`trace_info` / :func:`format_trace_info` -- summary statistics.
"""

from __future__ import annotations

import math
import numbers
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

__all__ = [
    "TraceError",
    "Column",
    "COLUMNS",
    "SCHEMA",
    "REQUIRED",
    "OPTIONAL",
    "KEY",
    "FINISH_REASONS",
    "TRACE_FORMAT_VERSION",
    "load_trace",
    "validate_trace",
    "write_trace",
    "trace_info",
    "format_trace_info",
    "schema_markdown",
]

TRACE_FORMAT_VERSION = "1"
"""Written into the parquet key-value metadata as ``lssim.trace_format``."""


class TraceError(ValueError):
    """A trace file or frame does not follow the lssim trace schema."""


# --------------------------------------------------------------------------
# Schema (the one place in code that defines the format)
# --------------------------------------------------------------------------

FINISH_REASONS: tuple[str, ...] = ("stop", "length", "abort", "policy_stop")
"""Allowed values of ``finish_reason``.

``stop``: the model emitted EOS / a stop string.  ``length``: it hit
``max_tokens``.  ``abort``: the engine aborted it (e.g. a partial-rollout
system cut it off at the end of a step).  ``policy_stop``: a scheduling
policy stopped it early (see ``stop_reason``)."""

_STEP = object()  # sentinel default: "same value as the row's `step`"


@dataclass(frozen=True)
class Column:
    """One column of the trace schema."""

    name: str
    kind: str
    """``"int"`` (stored int64), ``"float"`` (float64) or ``"str"``."""
    required: bool
    doc: str
    default: Any = None
    """Fill value when an optional column is missing (``_STEP``: copy ``step``)."""
    min: float | None = None
    """Smallest allowed value (inclusive), None for no bound."""
    max: float | None = None
    """Largest allowed value (inclusive), None for no bound."""
    allow_nan: bool = False
    """Float columns only: NaN means 'unknown' and is allowed."""
    choices: tuple[str, ...] | None = None
    """Str columns only: the allowed values, None for any string."""

    @property
    def dtype(self) -> str:
        return {"int": "int64", "float": "float64", "str": "string"}[self.kind]

    @property
    def range_doc(self) -> str:
        parts = []
        if self.choices is not None:
            parts.append("one of " + ", ".join(f"`{c}`" for c in self.choices))
        if self.min is not None and self.max is not None:
            parts.append(f"[{_num(self.min)}, {_num(self.max)}]")
        elif self.min is not None:
            parts.append(f">= {_num(self.min)}")
        elif self.max is not None:
            parts.append(f"<= {_num(self.max)}")
        if self.kind == "float":
            parts.append("NaN = unknown" if self.allow_nan else "finite, no NaN")
        return "; ".join(parts) if parts else "any"

    @property
    def default_doc(self) -> str:
        if self.required:
            return "-"
        if self.default is _STEP:
            return "= `step`"
        if isinstance(self.default, float) and math.isnan(self.default):
            return "NaN"
        return f"`{self.default!r}`" if isinstance(self.default, str) else str(self.default)


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


_NAN = float("nan")

COLUMNS: tuple[Column, ...] = (
    # ---- required ----------------------------------------------------------
    Column("step", "int", True, "RL step = policy (weight) version the response was generated for.", min=0),
    Column("prompt_id", "int", True, "Identifier of the prompt (e.g. its dataset index); stable across steps.", min=0),
    Column("sample_idx", "int", True, "Index of the response within the prompt's group at this step (0..G-1).", min=0),
    Column("prompt_len", "int", True, "Prompt length in tokens.", min=1),
    Column("response_len", "int", True, "Generated response length in tokens.", min=0),
    Column("reward", "float", True, "Scalar reward of the response (e.g. 0/1 correctness).", min=-1.0, max=1.0),
    Column("finish_reason", "str", True, "Why generation ended.", choices=FINISH_REASONS),
    Column("max_tokens", "int", True, "Response-token cap in force for this response.", min=1),
    # ---- optional ----------------------------------------------------------
    Column("stop_reason", "str", False, "Why a policy stopped the response (free text); empty if none.", default=""),
    Column(
        "loop_start", "int", False,
        "Token index where a degenerate repetition loop starts; -1 if none.", default=-1, min=-1,
    ),
    Column(
        "policy_version_first", "int", False,
        "Weight version of the response's first token (partial/async rollout).", default=_STEP, min=0,
    ),
    Column(
        "policy_version_last", "int", False,
        "Weight version of the response's last token.", default=_STEP, min=0,
    ),
    Column("instance", "int", False, "Inference instance (engine replica) that served it; -1 unknown.", default=-1, min=-1),
    Column(
        "submit_time", "float", False,
        "Seconds since the step's start when the request was submitted (may be < 0 if carried over).",
        default=_NAN, allow_nan=True,
    ),
    Column(
        "first_token_time", "float", False,
        "Seconds since the step's start when the first token came out.", default=_NAN, allow_nan=True,
    ),
    Column(
        "finish_time", "float", False,
        "Seconds since the step's start when the response finished.", default=_NAN, allow_nan=True,
    ),
    Column(
        "step_rollout_seconds", "float", False,
        "Measured rollout (generation) wall time of the step, repeated on each row of the step.",
        default=_NAN, min=0.0, allow_nan=True,
    ),
    Column(
        "step_train_seconds", "float", False,
        "Measured training (update) wall time of the step, repeated on each row of the step.",
        default=_NAN, min=0.0, allow_nan=True,
    ),
    Column(
        "entropy_mean", "float", False, "Mean per-token entropy of the response (nats).",
        default=_NAN, min=0.0, allow_nan=True,
    ),
    Column(
        "entropy_collapse_start", "int", False,
        "Token index where the response's entropy collapses (low-entropy rambling without exact repetition); -1 if none.",
        default=-1, min=-1,
    ),
)

SCHEMA: dict[str, Column] = {c.name: c for c in COLUMNS}
REQUIRED: tuple[str, ...] = tuple(c.name for c in COLUMNS if c.required)
OPTIONAL: tuple[str, ...] = tuple(c.name for c in COLUMNS if not c.required)
KEY: tuple[str, ...] = ("step", "prompt_id", "sample_idx")
"""The unique key of a row."""

CROSS_COLUMN_RULES: tuple[str, ...] = (
    "`response_len <= max_tokens`",
    "`finish_reason == 'length'` implies `response_len == max_tokens`",
    "`loop_start` is -1 or `0 <= loop_start <= response_len`",
    "`entropy_collapse_start` is -1 or `0 <= entropy_collapse_start <= response_len`",
    "`policy_version_first <= policy_version_last`",
    "`submit_time <= first_token_time <= finish_time` where both values are known",
    "`step_rollout_seconds` and `step_train_seconds` take a single value within a step (NaN ignored)",
    "(`step`, `prompt_id`, `sample_idx`) is unique",
)
"""Rules that involve more than one column (documented in traces/README.md)."""


def schema_markdown() -> str:
    """The column table (markdown) as documented in ``traces/README.md``."""
    lines = [
        "| column | type | required | default | valid range | meaning |",
        "|---|---|---|---|---|---|",
    ]
    for c in COLUMNS:
        lines.append(
            f"| `{c.name}` | {c.dtype} | {'yes' if c.required else 'no'} | {c.default_doc} "
            f"| {c.range_doc} | {c.doc} |"
        )
    return "\n".join(lines)


# --------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------


def _fmt(v: Any) -> str:
    """A short human form of one offending value."""
    if hasattr(v, "item") and not isinstance(v, (str, bytes)):
        try:
            v = v.item()
        except (ValueError, TypeError):
            pass
    if isinstance(v, float) and v.is_integer() and abs(v) < 1e16:
        return repr(v)
    s = repr(v)
    return s if len(s) <= 60 else s[:57] + "..."


def _fail(source: str, col: str, series: pd.Series | None, bad: np.ndarray, problem: str) -> None:
    """Raise a TraceError naming the first row flagged in boolean mask ``bad``."""
    idx = np.flatnonzero(bad)
    pos = int(idx[0])
    nbad = len(idx)
    val = "" if series is None else f" (value {_fmt(series.iloc[pos])})"
    more = f"; {nbad} bad rows in all" if nbad > 1 else ""
    raise TraceError(f"{source}: column {col!r}: row {pos}: {problem}{val}{more}")


def _is_real_number(v: Any) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, (bool, np.bool_))


def _object_numeric(s: pd.Series, col: str, source: str, kind: str) -> np.ndarray:
    """Object-dtype column that should be numeric: float64 array or TraceError."""
    inferred = pd.api.types.infer_dtype(s, skipna=True)
    if inferred not in ("integer", "floating", "mixed-integer-float", "decimal", "empty"):
        bad = np.fromiter(
            (not (_is_real_number(v) or v is None or (isinstance(v, float) and math.isnan(v))) for v in s),
            dtype=bool,
            count=len(s),
        )
        if bad.any():
            _fail(source, col, s, bad, f"expected {kind}, got {type(s.iloc[int(np.flatnonzero(bad)[0])]).__name__}")
    return pd.to_numeric(s, errors="raise").to_numpy(dtype="float64", na_value=np.nan)


def _as_float_array(s: pd.Series, col: str, source: str, kind: str) -> np.ndarray:
    """Any numeric-looking column as float64 (NaN for missing); refuse non-numbers."""
    dt = s.dtype
    if pd.api.types.is_bool_dtype(dt):
        _fail(source, col, s, np.ones(len(s), bool), f"expected {kind}, got bool")
    if isinstance(dt, pd.CategoricalDtype) or pd.api.types.is_string_dtype(dt) and dt != object:
        mask = s.notna().to_numpy()
        if not mask.any():
            mask = np.ones(len(s), bool)
        _fail(source, col, s, mask, f"expected {kind}, got text ({dt})")
    if pd.api.types.is_numeric_dtype(dt):
        return s.to_numpy(dtype="float64", na_value=np.nan)
    if dt == object:
        return _object_numeric(s, col, source, kind)
    _fail(source, col, s, np.ones(len(s), bool), f"expected {kind}, got dtype {dt}")
    raise AssertionError  # unreachable


def _coerce_int(s: pd.Series, col: str, source: str) -> np.ndarray:
    dt = s.dtype
    if pd.api.types.is_integer_dtype(dt) and not pd.api.types.is_bool_dtype(dt):
        if isinstance(dt, pd.api.extensions.ExtensionDtype):
            na = s.isna().to_numpy()
            if na.any():
                _fail(source, col, s, na, "missing value (NA) in integer column")
            return s.to_numpy(dtype="int64")
        if dt == np.uint64:
            big = s.to_numpy() > np.iinfo(np.int64).max
            if big.any():
                _fail(source, col, s, big, "value does not fit in int64")
        return s.to_numpy().astype("int64", copy=False)
    a = _as_float_array(s, col, source, "an integer")
    nan = np.isnan(a)
    if nan.any():
        _fail(source, col, s, nan, "missing value (NaN) in integer column")
    if not np.isfinite(a).all():
        _fail(source, col, s, ~np.isfinite(a), "infinite value in integer column")
    frac = a != np.floor(a)
    if frac.any():
        _fail(source, col, s, frac, "non-integer value in integer column")
    big = np.abs(a) > 2.0**53
    if big.any():
        _fail(source, col, s, big, "integer value too large to be exact")
    return a.astype("int64")


def _coerce_float(s: pd.Series, col: str, source: str) -> np.ndarray:
    if pd.api.types.is_float_dtype(s.dtype) and not isinstance(s.dtype, pd.api.extensions.ExtensionDtype):
        return s.to_numpy().astype("float64", copy=False)
    return _as_float_array(s, col, source, "a number")


def _coerce_str(s: pd.Series, col: str, source: str, nan_default: str | None) -> pd.Series:
    dt = s.dtype
    if isinstance(dt, pd.CategoricalDtype):
        s = s.astype(object).where(s.notna(), None)
        dt = s.dtype
    if pd.api.types.is_string_dtype(dt) and dt != object:
        pass  # a proper string dtype: values are str or NA
    elif dt == object:
        if pd.api.types.infer_dtype(s, skipna=True) not in ("string", "empty"):
            bad = np.fromiter((not (isinstance(v, str) or _isna_scalar(v)) for v in s), dtype=bool, count=len(s))
            _fail(source, col, s, bad, f"expected text, got {type(s.iloc[int(np.flatnonzero(bad)[0])]).__name__}")
    else:
        _fail(source, col, s, np.ones(len(s), bool), f"expected text, got dtype {dt}")
    na = s.isna().to_numpy()
    if na.any():
        if nan_default is None:
            _fail(source, col, s, na, "missing value")
        s = s.where(~na, nan_default)
    return s.astype(_STR_DTYPE)


def _isna_scalar(v: Any) -> bool:
    return v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v))


# pandas >= 3 has a dedicated default string dtype; on pandas 2 fall back to object.
_STR_DTYPE: Any = "str" if int(pd.__version__.split(".")[0]) >= 3 else object


def validate_trace(df: pd.DataFrame, source: str = "<frame>") -> pd.DataFrame:
    """Check ``df`` against the schema and return its normalized form.

    The returned frame has every schema column (required ones checked, missing
    optional ones filled with their defaults) in schema order, cast to int64 /
    float64 / string, followed by any extra columns unchanged; rows are sorted
    by (step, prompt_id, sample_idx) with a fresh RangeIndex.  The input is not
    modified.

    Raises :class:`TraceError` naming ``source``, the column and the first bad
    row (0-based position in the input) with its value.
    """
    if not isinstance(df, pd.DataFrame):
        raise TraceError(f"{source}: expected a pandas DataFrame, got {type(df).__name__}")
    if len(df.columns) != len(set(df.columns)):
        dup = pd.Index(df.columns)[pd.Index(df.columns).duplicated()][0]
        raise TraceError(f"{source}: column {dup!r} appears more than once")
    if len(df) == 0:
        raise TraceError(f"{source}: empty trace (no rows)")
    missing = [c for c in REQUIRED if c not in df.columns]
    if missing:
        raise TraceError(
            f"{source}: missing required column(s) {', '.join(repr(c) for c in missing)}; "
            f"required: {', '.join(REQUIRED)}"
        )

    n = len(df)
    out: dict[str, Any] = {}
    # ---- types --------------------------------------------------------------
    for c in COLUMNS:
        if c.name not in df.columns:
            continue
        s = df[c.name]
        if c.kind == "int":
            out[c.name] = _coerce_int(s, c.name, source)
        elif c.kind == "float":
            out[c.name] = _coerce_float(s, c.name, source)
        else:
            out[c.name] = _coerce_str(s, c.name, source, None if c.required else c.default)
    # ---- defaults for missing optional columns ------------------------------
    for c in COLUMNS:
        if c.name in out:
            continue
        if c.default is _STEP:
            out[c.name] = out["step"].copy()
        elif c.kind == "int":
            out[c.name] = np.full(n, c.default, dtype="int64")
        elif c.kind == "float":
            out[c.name] = np.full(n, c.default, dtype="float64")
        else:
            out[c.name] = pd.Series([c.default] * n, dtype=_STR_DTYPE) if n else pd.Series([], dtype=_STR_DTYPE)

    def series(name: str) -> pd.Series:
        v = out[name]
        return v if isinstance(v, pd.Series) else pd.Series(v)

    # ---- per-column ranges ----------------------------------------------------
    for c in COLUMNS:
        v = out[c.name]
        if c.kind == "float":
            nan = np.isnan(v)
            if not c.allow_nan and nan.any():
                _fail(source, c.name, series(c.name), nan, "NaN not allowed")
            inf = np.isinf(v)
            if inf.any():
                _fail(source, c.name, series(c.name), inf, "infinite value")
        if c.kind in ("int", "float"):
            with np.errstate(invalid="ignore"):
                if c.min is not None:
                    bad = v < c.min
                    if bad.any():
                        _fail(source, c.name, series(c.name), bad, f"must be >= {_num(c.min)}")
                if c.max is not None:
                    bad = v > c.max
                    if bad.any():
                        _fail(source, c.name, series(c.name), bad, f"must be <= {_num(c.max)}")
        if c.choices is not None:
            bad = ~v.isin(c.choices).to_numpy()
            if bad.any():
                _fail(source, c.name, v, bad, f"must be one of {', '.join(c.choices)}")

    # ---- cross-column rules ---------------------------------------------------
    rl, mt = out["response_len"], out["max_tokens"]
    bad = rl > mt
    if bad.any():
        pos = int(np.flatnonzero(bad)[0])
        _fail(source, "response_len", None, bad,
              f"response_len {rl[pos]} > max_tokens {mt[pos]}")
    is_len = (out["finish_reason"] == "length").to_numpy()
    bad = is_len & (rl != mt)
    if bad.any():
        pos = int(np.flatnonzero(bad)[0])
        _fail(source, "finish_reason", None, bad,
              f"finish_reason 'length' but response_len {rl[pos]} != max_tokens {mt[pos]}")
    ls = out["loop_start"]
    bad = ls > rl
    if bad.any():
        pos = int(np.flatnonzero(bad)[0])
        _fail(source, "loop_start", None, bad, f"loop_start {ls[pos]} > response_len {rl[pos]}")
    cs = out["entropy_collapse_start"]
    bad = cs > rl
    if bad.any():
        pos = int(np.flatnonzero(bad)[0])
        _fail(source, "entropy_collapse_start", None, bad, f"entropy_collapse_start {cs[pos]} > response_len {rl[pos]}")
    pf, pl = out["policy_version_first"], out["policy_version_last"]
    bad = pf > pl
    if bad.any():
        pos = int(np.flatnonzero(bad)[0])
        _fail(source, "policy_version_first", None, bad,
              f"policy_version_first {pf[pos]} > policy_version_last {pl[pos]}")
    for a, b in (("submit_time", "first_token_time"), ("first_token_time", "finish_time"), ("submit_time", "finish_time")):
        with np.errstate(invalid="ignore"):
            bad = out[a] > out[b]  # False where either is NaN
        if bad.any():
            pos = int(np.flatnonzero(bad)[0])
            _fail(source, b, None, bad, f"{a} {_fmt(out[a][pos])} > {b} {_fmt(out[b][pos])}")
    step = out["step"]
    for name in ("step_rollout_seconds", "step_train_seconds"):
        v = out[name]
        known = ~np.isnan(v)
        if known.any():
            kpos = np.flatnonzero(known)
            g = pd.DataFrame({"step": step[kpos], "v": v[kpos], "pos": kpos}).groupby("step")
            first_v, first_pos = g["v"].transform("first").to_numpy(), g["pos"].transform("first").to_numpy()
            bad_k = v[kpos] != first_v
            if bad_k.any():
                bad = np.zeros(n, bool)
                bad[kpos[bad_k]] = True
                pos = int(np.flatnonzero(bad)[0])
                ref = int(first_pos[np.flatnonzero(bad_k)[0]])
                _fail(source, name, series(name), bad,
                      f"differs within step {step[pos]} (row {ref} has {_fmt(v[ref])})")

    # ---- unique key -----------------------------------------------------------
    keys = pd.DataFrame({k: out[k] for k in KEY})
    dup = keys.duplicated(keep="first").to_numpy()
    if dup.any():
        second = int(np.flatnonzero(dup)[0])
        kv = tuple(int(out[k][second]) for k in KEY)
        same = np.ones(n, bool)
        for k, x in zip(KEY, kv):
            same &= out[k] == x
        first = int(np.flatnonzero(same)[0])
        desc = ", ".join(f"{k}={x}" for k, x in zip(KEY, kv))
        ndup = int(dup.sum())
        more = f"; {ndup} duplicate rows in all" if ndup > 1 else ""
        raise TraceError(
            f"{source}: key columns 'step', 'prompt_id', 'sample_idx': row {second}: duplicate key ({desc}), "
            f"first seen at row {first}{more}"
        )

    # ---- assemble (sorted by key), keep extra columns ---------------------------
    order = np.lexsort((out["sample_idx"], out["prompt_id"], out["step"]))
    identity = bool((order == np.arange(n)).all())

    def arr(v: Any) -> Any:
        a = v.array if isinstance(v, pd.Series) else v
        return a if identity else a.take(order)

    cols: dict[str, Any] = {c.name: arr(out[c.name]) for c in COLUMNS}
    for c in df.columns:
        if c not in SCHEMA:
            cols[c] = arr(df[c])
    # copy=False: one block per column, no consolidation copy (matters at 1M rows)
    return pd.DataFrame(cols, index=pd.RangeIndex(n), copy=False)


# --------------------------------------------------------------------------
# Files
# --------------------------------------------------------------------------


def load_trace(path: str | os.PathLike) -> pd.DataFrame:
    """Read a parquet trace and return it validated and normalized.

    Raises :class:`TraceError` if the file does not exist, is not a parquet
    file, has no rows or violates the schema (see :func:`validate_trace`).
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    p = Path(path)
    source = str(path)
    if not p.exists():
        raise TraceError(f"{source}: no such file")
    if not p.is_file():
        raise TraceError(f"{source}: not a regular file")
    if p.stat().st_size == 0:
        raise TraceError(f"{source}: empty file (0 bytes), not a parquet trace")
    try:
        table = pq.read_table(p)
    except (pa.ArrowException, OSError) as e:
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise TraceError(f"{source}: not a parquet file ({msg})") from None
    if table.num_rows == 0:
        raise TraceError(f"{source}: empty trace (no rows)")
    df = table.to_pandas()
    return validate_trace(df, source=source)


def write_trace(df: pd.DataFrame, path: str | os.PathLike, *, compression: str = "zstd") -> pd.DataFrame:
    """Validate ``df`` and write it to ``path`` as parquet, atomically.

    The frame is validated first (a :class:`TraceError` leaves ``path``
    untouched); it is then written to a temporary file in the same directory
    and moved over ``path`` with :func:`os.replace`, so readers never see a
    half-written trace and a failed write leaves nothing behind.  Returns the
    normalized frame that was written.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    p = Path(path)
    norm = validate_trace(df, source=str(path))
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        raise TraceError(f"{path}: directory {str(parent)!r} does not exist")
    table = pa.Table.from_pandas(norm, preserve_index=False)
    meta = dict(table.schema.metadata or {})
    meta[b"lssim.trace_format"] = TRACE_FORMAT_VERSION.encode()
    table = table.replace_schema_metadata(meta)
    from .results import atomic_write

    atomic_write(p, lambda tmp: pq.write_table(table, tmp, compression=compression))
    return norm


# --------------------------------------------------------------------------
# Summaries
# --------------------------------------------------------------------------


def _f(x: Any) -> float | None:
    """JSON-friendly float (None for NaN/inf)."""
    x = float(x)
    return x if math.isfinite(x) else None


def _corr(a: np.ndarray, b: np.ndarray) -> float | None:
    if len(a) < 3 or np.std(a) == 0 or np.std(b) == 0:
        return None
    return _f(np.corrcoef(a, b)[0, 1])


def trace_info(df: pd.DataFrame, *, validate: bool = True, source: str = "<frame>") -> dict[str, Any]:
    """Summary statistics of a trace, as a JSON-serializable dict.

    Keys: ``rows``, ``steps``, ``step_min``, ``step_max``, ``prompts``,
    ``groups``, ``group_size`` (int if every group has the same size, else
    None), ``group_size_min``/``group_size_max``, ``max_tokens`` (int if
    constant, else None) and ``max_tokens_max``, ``prompt_len_mean``,
    ``response_len`` (dict of mean, p10, p50, p90, p99, max), per-step tail
    ``step_max_over_median`` and ``step_p99_over_p50`` (medians over steps),
    ``max_over_median`` (overall), ``finish_reason`` (fraction of rows per
    reason), ``truncated_fraction`` (finish_reason == 'length'),
    ``loop_fraction`` (loop_start >= 0), ``reward_mean``, ``reward_mean_short`` /
    ``reward_mean_long`` (rows below / above their group's median length),
    ``persistence_spearman`` / ``persistence_pearson_log`` (correlation of a
    prompt's mean log(1+response_len) between consecutive appearances) and
    ``persistence_pairs`` (how many such pairs), and ``timed_fraction``
    (rows with a known finish_time).
    """
    if validate:
        df = validate_trace(df, source=source)
    rl = df["response_len"].to_numpy()
    step = df["step"].to_numpy()
    pid = df["prompt_id"].to_numpy()
    info: dict[str, Any] = {}
    info["rows"] = int(len(df))
    steps = np.unique(step)
    info["steps"] = int(len(steps))
    info["step_min"] = int(steps[0])
    info["step_max"] = int(steps[-1])
    info["prompts"] = int(len(np.unique(pid)))
    gsize = df.groupby(["step", "prompt_id"], sort=False).size().to_numpy()
    info["groups"] = int(len(gsize))
    info["group_size"] = int(gsize[0]) if gsize.min() == gsize.max() else None
    info["group_size_min"] = int(gsize.min())
    info["group_size_max"] = int(gsize.max())
    mt = df["max_tokens"].to_numpy()
    info["max_tokens"] = int(mt[0]) if mt.min() == mt.max() else None
    info["max_tokens_max"] = int(mt.max())
    info["prompt_len_mean"] = _f(df["prompt_len"].mean())

    q = np.quantile(rl, [0.1, 0.5, 0.9, 0.99])
    info["response_len"] = {
        "mean": _f(rl.mean()),
        "p10": _f(q[0]),
        "p50": _f(q[1]),
        "p90": _f(q[2]),
        "p99": _f(q[3]),
        "max": int(rl.max()),
    }
    info["max_over_median"] = _f(rl.max() / q[1]) if q[1] > 0 else None
    g = pd.Series(rl.astype("float64")).groupby(step)
    smax, smed, sp99 = g.max(), g.median(), g.quantile(0.99)
    with np.errstate(divide="ignore", invalid="ignore"):
        r1 = (smax / smed).replace([np.inf, -np.inf], np.nan).dropna()
        r2 = (sp99 / smed).replace([np.inf, -np.inf], np.nan).dropna()
    info["step_max_over_median"] = _f(r1.median()) if len(r1) else None
    info["step_p99_over_p50"] = _f(r2.median()) if len(r2) else None

    fr = df["finish_reason"].value_counts(normalize=True)
    info["finish_reason"] = {r: _f(fr.get(r, 0.0)) for r in FINISH_REASONS}
    info["truncated_fraction"] = info["finish_reason"]["length"]
    info["loop_fraction"] = _f((df["loop_start"].to_numpy() >= 0).mean())
    reward = df["reward"].to_numpy()
    info["reward_mean"] = _f(reward.mean())
    gmed = pd.Series(rl.astype("float64")).groupby([step, pid]).transform("median").to_numpy()
    short, long_ = rl < gmed, rl > gmed
    info["reward_mean_short"] = _f(reward[short].mean()) if short.any() else None
    info["reward_mean_long"] = _f(reward[long_].mean()) if long_.any() else None

    # persistence: prompt's mean log-length at consecutive appearances
    m = (
        pd.DataFrame({"prompt_id": pid, "step": step, "ll": np.log1p(rl)})
        .groupby(["prompt_id", "step"], sort=True)["ll"]
        .mean()
        .reset_index()
    )
    same = m["prompt_id"].to_numpy()[1:] == m["prompt_id"].to_numpy()[:-1]
    a = m["ll"].to_numpy()[:-1][same]
    b = m["ll"].to_numpy()[1:][same]
    info["persistence_pairs"] = int(len(a))
    info["persistence_pearson_log"] = _corr(a, b)
    info["persistence_spearman"] = (
        _corr(pd.Series(a).rank().to_numpy(), pd.Series(b).rank().to_numpy()) if len(a) else None
    )
    info["timed_fraction"] = _f((~np.isnan(df["finish_time"].to_numpy())).mean())
    return info


def format_trace_info(info: dict[str, Any], title: str | None = None) -> str:
    """Human-readable multi-line rendering of :func:`trace_info`'s dict."""

    def num(x: Any, fmt: str = ".3g") -> str:
        return "n/a" if x is None else format(x, fmt)

    rlq = info["response_len"]
    gs = info["group_size"] if info["group_size"] is not None else f"{info['group_size_min']}..{info['group_size_max']}"
    mt = info["max_tokens"] if info["max_tokens"] is not None else f"varies (max {info['max_tokens_max']})"
    fr = ", ".join(f"{k} {100 * v:.2f}%" for k, v in info["finish_reason"].items() if v)
    lines = []
    if title:
        lines.append(title)
    lines += [
        f"rows            {info['rows']:,}",
        f"steps           {info['steps']} (step {info['step_min']}..{info['step_max']})",
        f"prompts         {info['prompts']:,}   groups {info['groups']:,}   group size {gs}",
        f"max_tokens      {mt}   mean prompt_len {num(info['prompt_len_mean'], '.1f')}",
        "response_len    mean {m}  p10 {p10}  p50 {p50}  p90 {p90}  p99 {p99}  max {mx}".format(
            m=num(rlq["mean"], ".0f"), p10=num(rlq["p10"], ".0f"), p50=num(rlq["p50"], ".0f"),
            p90=num(rlq["p90"], ".0f"), p99=num(rlq["p99"], ".0f"), mx=rlq["max"],
        ),
        f"tail            max/median {num(info['max_over_median'], '.1f')} overall; per step (median over steps): "
        f"max/median {num(info['step_max_over_median'], '.1f')}, p99/p50 {num(info['step_p99_over_p50'], '.2f')}",
        f"finish_reason   {fr}",
        f"truncated       {100 * info['truncated_fraction']:.2f}%   loops {100 * info['loop_fraction']:.2f}%",
        f"reward          mean {num(info['reward_mean'], '.3f')}  (shorter than group median "
        f"{num(info['reward_mean_short'], '.3f')}, longer {num(info['reward_mean_long'], '.3f')})",
        f"persistence     spearman {num(info['persistence_spearman'], '.3f')}  pearson(log) "
        f"{num(info['persistence_pearson_log'], '.3f')}  over {info['persistence_pairs']:,} consecutive appearances",
        f"timed rows      {100 * info['timed_fraction']:.1f}%",
    ]
    return "\n".join(lines)
