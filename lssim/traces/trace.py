"""The rollout-trace format: schema, validation, loading, writing.

A *trace* is a table with one row per generated response of an RL
post-training run (GRPO/DAPO style): which step (policy version) it was
generated at, which prompt and group member it is, how long the prompt and
response were, what reward it got and why generation ended.  The schema lives
in :data:`COLUMNS` -- the single place in code that defines the format; the
validation, the defaults for optional columns and the documentation table
(:func:`schema_markdown`) are all derived from it.  The checks themselves are
small named functions in :mod:`lssim.traces.checks`; summaries are in
:mod:`lssim.traces.summary`.

Public API
----------
- :class:`TraceError` -- raised for any malformed trace (a ``ValueError``).
- :data:`COLUMNS`, :data:`SCHEMA`, :data:`REQUIRED`, :data:`OPTIONAL`,
  :data:`KEY`, :data:`FINISH_REASONS` -- the schema.
- :func:`load_trace` -- read and validate a parquet trace.
- :func:`validate_trace` -- check a frame and return its normalized form.
- :func:`write_trace` -- validate and atomically write a parquet trace.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from lssim.loop.core import FINISH_REASONS
from lssim.traces.checks import (CROSS_COLUMN_CHECKS, STR_DTYPE, TraceError, check_column_range, coerce_bool, coerce_float,
                                 coerce_floats, coerce_id, coerce_int, coerce_str, key_order, num)
from lssim.traces.signal_trace import default_source

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
    "SIGNAL_SOURCES",
    "load_trace",
    "validate_trace",
    "write_trace",
    "schema_markdown",
]

TRACE_FORMAT_VERSION = "1"
"""Written into the parquet key-value metadata as ``lssim.trace_format``."""


# --------------------------------------------------------------------------
# Schema (the one place in code that defines the format)
# --------------------------------------------------------------------------

# FINISH_REASONS (lssim.loop.core): `stop`: the model emitted EOS / a stop string.  `length`: it hit
# `max_tokens`.  `policy_stop`: a scheduling policy stopped it early (see `stop_reason`).  `abort`: the
# engine aborted it (e.g. a partial-rollout system cut it off at the end of a step).

_STEP = object()  # sentinel default: "same value as the row's `step`"
_SIGNALS_LABELLED = object()  # sentinel default: `synthetic` where the trace has loop or collapse labels, else ''
SIGNAL_SOURCES = ("", "synthetic", "measured")


@dataclass(frozen=True)
class Column:
    """One column of the trace schema."""

    name: str
    kind: str
    """``"int"`` (stored int64), ``"float"`` (float64), ``"str"``, ``"bool"``, ``"id"`` (int64 or text,
    whichever the trace has: an identifier kept as written) or ``"floats"`` (a list of float32 per row)."""
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
    filled: bool = True
    """False: the column is there only when measured (never filled with a default); checked where present."""

    @property
    def dtype(self) -> str:
        return {"int": "int64", "float": "float64", "str": "string", "bool": "bool", "id": "int64 or string",
                "floats": "list of float32"}[self.kind]

    @property
    def range_doc(self) -> str:
        parts = []
        if self.choices is not None:
            parts.append("one of " + ", ".join(f"`{c}`" for c in self.choices))
        if self.min is not None and self.max is not None:
            parts.append(f"[{num(self.min)}, {num(self.max)}]")
        elif self.min is not None:
            parts.append(f">= {num(self.min)}")
        elif self.max is not None:
            parts.append(f"<= {num(self.max)}")
        if self.kind == "float":
            parts.append("NaN = unknown" if self.allow_nan else "finite, no NaN")
        if self.kind == "id":
            parts = [f"integers {parts[0]}" if parts else "integers", "or text (not empty), kept as written"]
        return "; ".join(parts) if parts else "any"

    @property
    def default_doc(self) -> str:
        if self.required:
            return "-"
        if self.default is _STEP:
            return "= `step`"
        if self.default is _SIGNALS_LABELLED:
            return "`synthetic` with `loop_start` or `entropy_collapse_start`, else `''`"
        if not self.filled:
            return "absent"
        if isinstance(self.default, float) and math.isnan(self.default):
            return "NaN"
        return f"`{self.default!r}`" if isinstance(self.default, str) else str(self.default)


_NAN = float("nan")

COLUMNS: tuple[Column, ...] = (
    # ---- required ----------------------------------------------------------
    Column("step", "int", True, "RL step = policy (weight) version the response was generated for.", min=0),
    Column(
        "prompt_id", "id", True,
        "Identifier of the prompt (a dataset index, a uid, a hash of its text); stable across steps.", min=0,
    ),
    Column(
        "sample_idx", "int", True,
        "Index of the response among the prompt's responses at this step (0..G-1; numbered across its groups).", min=0,
    ),
    Column("prompt_len", "int", True, "Prompt length in tokens.", min=1),
    Column("response_len", "int", True, "Generated response length in tokens.", min=0),
    Column("reward", "float", True, "Scalar reward of the response, on any scale (0/1 correctness, +5/-5, a reward model's score)."),
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
    Column(
        "signal_source", "str", False,
        "Where the early-exit signals a replay reads come from: `measured` (the `signal_*` columns below, computed "
        "from the response's tokens and log-probs by lssim.loop.signals.signals_along, as the real engine computes "
        "them), `synthetic` (modelled from `loop_start`, `entropy_collapse_start` and `entropy_mean`, as the synthesizer "
        "writes them), or empty: none (a policy that reads them refuses the trace).",
        default=_SIGNALS_LABELLED, choices=SIGNAL_SOURCES,
    ),
    Column("signal_window", "int", False, "Measured signals: tokens in the window each value is over (0: none).",
           default=0, min=0, filled=False),
    Column("signal_ngram", "int", False, "Measured signals: n-gram length of the repetition measure (0: none).",
           default=0, min=0, filled=False),
    Column("signal_stride", "int", False, "Measured signals: tokens between values; value i is the window ending "
           "after (i + 1) * signal_stride tokens, so there are response_len // signal_stride (0: none).",
           default=0, min=0, filled=False),
    Column("signal_repetition", "floats", False, "Measured signals: the window's repetition (1 - distinct n-grams / "
           "n-grams) at each stride, in [0, 1].", filled=False),
    Column("signal_entropy", "floats", False, "Measured signals: the window's mean entropy in nats at each stride "
           "(the exact entropies where the dump had them, else -log-prob of the sampled tokens); NaN without "
           "log-probs.", filled=False),
    Column(
        "group_id", "int", False,
        "Tells apart groups of one prompt in one step (a prompt drawn twice, DAPO-style extra batches): rows of "
        "one (`step`, `prompt_id`) with different `group_id` are different groups.", default=0, min=0,
    ),
    Column(
        "trained", "bool", False,
        "False for a response generated but not trained on (its group filtered out, DAPO-style, or left out "
        "by a policy).", default=True,
    ),
    Column(
        "batch", "int", False,
        "The data loader's batch its group came from, numbered as the run's steps from 0 (the trace's i-th step "
        "is step i), where the run drew it ahead of that batch's step (partial rollouts over-provisioning, async "
        "modes); -1: the step it ran in, or unknown.",
        default=-1, min=-1,
    ),
)

SCHEMA: dict[str, Column] = {c.name: c for c in COLUMNS}
REQUIRED: tuple[str, ...] = tuple(c.name for c in COLUMNS if c.required)
OPTIONAL: tuple[str, ...] = tuple(c.name for c in COLUMNS if not c.required)
KEY: tuple[str, ...] = ("step", "prompt_id", "sample_idx")
"""The unique key of a row."""

CROSS_COLUMN_RULES: tuple[str, ...] = tuple(check.__doc__ for check in CROSS_COLUMN_CHECKS)
"""Rules that involve more than one column (documented in traces/README.md), in the order they are checked."""


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


def validate_trace(df: pd.DataFrame, source: str = "<frame>") -> pd.DataFrame:
    """Check ``df`` against the schema and return its normalized form.

    The returned frame has every schema column (required ones checked, missing
    optional ones filled with their defaults) in schema order, cast to int64 /
    float64 / string / bool (``prompt_id``: int64, or text as written),
    followed by any extra columns unchanged; rows are sorted by (step,
    prompt_id, sample_idx) with a fresh RangeIndex.  The input is not modified.

    Raises :class:`TraceError` naming ``source``, the column and the first bad
    row (0-based position in the input) with its value.  The checks run in the
    order traces/README.md lists them: the frame's shape, each column's type,
    each column's range, then :data:`lssim.traces.checks.CROSS_COLUMN_CHECKS`.
    """
    _check_shape(df, source)
    cols = _coerced_columns(df, source)
    _fill_defaults(cols, len(df))
    for c in COLUMNS:
        if c.name in cols:
            check_column_range(c, cols[c.name], source)
    for check in CROSS_COLUMN_CHECKS:
        check(cols, source)
    return _sorted_frame(cols, df)


def _check_shape(df: Any, source: str) -> None:
    """A frame, no column twice, at least one row, every required column."""
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


def _coerced_columns(df: pd.DataFrame, source: str) -> dict[str, Any]:
    """Each schema column present in ``df``, cast to its type (numpy arrays; text as a string Series)."""
    cols: dict[str, Any] = {}
    for c in COLUMNS:
        if c.name not in df.columns:
            continue
        s = df[c.name]
        if c.kind == "str":
            cols[c.name] = coerce_str(s, c.name, source, None if c.required else c.default)
        else:
            cols[c.name] = _COERCE[c.kind](s, c.name, source)
    return cols


_COERCE = {"int": coerce_int, "float": coerce_float, "bool": coerce_bool, "id": coerce_id, "floats": coerce_floats}


def _fill_defaults(cols: dict[str, Any], n: int) -> None:
    """Missing optional columns take their defaults (``_STEP``: a copy of ``step``); those not `filled` stay missing."""
    signal_source = default_source(cols)  # before the labels are filled below
    for c in COLUMNS:
        if c.name in cols or not c.filled:
            continue
        if c.default is _SIGNALS_LABELLED:
            cols[c.name] = pd.Series([signal_source] * n, dtype=STR_DTYPE) if n else pd.Series([], dtype=STR_DTYPE)
        elif c.default is _STEP:
            cols[c.name] = cols["step"].copy()
        elif c.kind in ("int", "float", "bool"):
            cols[c.name] = np.full(n, c.default, dtype={"int": "int64", "float": "float64", "bool": bool}[c.kind])
        else:
            cols[c.name] = pd.Series([c.default] * n, dtype=STR_DTYPE) if n else pd.Series([], dtype=STR_DTYPE)


def _sorted_frame(cols: dict[str, Any], df: pd.DataFrame) -> pd.DataFrame:
    """Schema columns in schema order, then ``df``'s extra columns, rows sorted by the key."""
    n = len(df)
    order = key_order(cols)  # None: in key order already (a trace lssim wrote)

    def arr(v: Any) -> Any:
        a = v.array if isinstance(v, pd.Series) else v
        return a if order is None else a.take(order)

    out: dict[str, Any] = {c.name: arr(cols[c.name]) for c in COLUMNS if c.name in cols}
    for c in df.columns:
        if c not in SCHEMA:
            out[c] = arr(df[c])
    # copy=False: one block per column, no consolidation copy (matters at 1M rows)
    return pd.DataFrame(out, index=pd.RangeIndex(n), copy=False)


# --------------------------------------------------------------------------
# Files
# --------------------------------------------------------------------------


TEXT_FORMATS = {".csv": "CSV", ".jsonl": "JSON lines", ".ndjson": "JSON lines", ".json": "JSON"}


def load_trace(path: str | os.PathLike) -> pd.DataFrame:
    """Read a trace and return it validated and normalized.

    Parquet is the format lssim writes; a table with the same columns as CSV (``.csv``), JSON lines
    (``.jsonl``/``.ndjson``) or a JSON array of records (``.json``) is read too, so a trace made by a
    spreadsheet or a logging script needs no conversion step. Raises :class:`TraceError` if the file does not
    exist, cannot be read as its format, has no rows or violates the schema (see :func:`validate_trace`).
    """
    p = Path(path)
    source = str(path)
    if not p.exists():
        raise TraceError(f"{source}: no such file")
    if not p.is_file():
        raise TraceError(f"{source}: not a regular file")
    fmt = TEXT_FORMATS.get(p.suffix.lower())
    if p.stat().st_size == 0:
        raise TraceError(f"{source}: empty file (0 bytes), not a {fmt or 'parquet'} trace")
    df = _read_text_table(p, fmt) if fmt else _read_parquet(p)
    if len(df) == 0:
        raise TraceError(f"{source}: empty trace (no rows)")
    return validate_trace(df, source=source)


def _read_parquet(p: Path) -> pd.DataFrame:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        # ParquetFile reads one file without pyarrow.dataset (its import and thread pool cost more than the read), and
        # split_blocks keeps one block per column: no copy of every number into pandas' consolidated 2-D blocks.
        return pq.ParquetFile(p).read().to_pandas(split_blocks=True)
    except (pa.ArrowException, OSError) as e:
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise TraceError(f"{p}: not a parquet file ({msg})") from None


def _read_text_table(p: Path, fmt: str) -> pd.DataFrame:
    """A CSV or JSON table of trace columns. Text columns are read as text (a prompt id '007' stays '007' only
    if every id is text-like; numeric ids become integers as in parquet); an empty text cell is ''."""
    text_columns = {c.name: str for c in COLUMNS if c.kind == "str"}
    try:
        if fmt == "CSV":
            df = pd.read_csv(p, dtype=text_columns, keep_default_na=False,
                             na_values={c.name: ["", "nan", "NaN"] for c in COLUMNS if c.kind == "float"})
        else:
            df = pd.read_json(p, lines=fmt == "JSON lines", orient="records", dtype=False)
    except (ValueError, UnicodeDecodeError, pd.errors.ParserError) as e:
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise TraceError(f"{p}: not a {fmt} table ({msg})") from None
    for name in text_columns:
        if name in df.columns:
            df[name] = df[name].where(df[name].notna(), "").astype(str)
    return df


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

    from lssim.results import atomic_write

    p = Path(path)
    norm = validate_trace(df, source=str(path))
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        raise TraceError(f"{path}: directory {str(parent)!r} does not exist")
    table = pa.Table.from_pandas(norm, preserve_index=False)
    meta = dict(table.schema.metadata or {})
    meta[b"lssim.trace_format"] = TRACE_FORMAT_VERSION.encode()
    table = table.replace_schema_metadata(meta)
    atomic_write(p, lambda tmp: pq.write_table(table, tmp, compression=compression))
    return norm
