"""The trace checks: column coercion and the named rules a trace must follow (lssim.traces.trace runs them).

Every check raises :class:`TraceError` naming the source (file), the column, the first bad row (its
0-based position in the input, before sorting) and the offending value, e.g.

    run.parquet: column 'response_len': row 4: must be >= 0 (value -5)

A check reads ``cols``, the coerced columns by name (numpy arrays for numbers, pandas string Series
for text, all in input row order), and returns nothing; lssim.traces.trace runs them in the order of
:data:`CROSS_COLUMN_CHECKS` after the per-column ones, so the first rule broken is the one reported.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Callable

import numpy as np
import pandas as pd


class TraceError(ValueError):
    """A trace file or frame does not follow the lssim trace schema."""


Columns = dict[str, Any]
Check = Callable[[Columns, str], None]

# pandas >= 3 has a dedicated default string dtype; on pandas 2 fall back to object.
STR_DTYPE: Any = "str" if int(pd.__version__.split(".")[0]) >= 3 else object


# --------------------------------------------------------------------------
# Reporting
# --------------------------------------------------------------------------


def fmt_value(v: Any) -> str:
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


def fail(source: str, col: str, values: Any, bad: np.ndarray, problem: str) -> None:
    """Raise a TraceError naming the first row flagged in boolean mask ``bad`` (and its value, unless
    ``values`` is None)."""
    idx = np.flatnonzero(bad)
    pos = int(idx[0])
    val = "" if values is None else f" (value {fmt_value(_at(values, pos))})"
    more = f"; {len(idx)} bad rows in all" if len(idx) > 1 else ""
    raise TraceError(f"{source}: column {col!r}: row {pos}: {problem}{val}{more}")


def _at(values: Any, pos: int) -> Any:
    return values.iloc[pos] if isinstance(values, pd.Series) else values[pos]


def num(x: float) -> str:
    """A bound as the docs write it: 0 rather than 0.0."""
    return str(int(x)) if float(x).is_integer() else str(x)


# --------------------------------------------------------------------------
# Coercion: one column to its schema type
# --------------------------------------------------------------------------


def _is_real_number(v: Any) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, (bool, np.bool_))


def _isna_scalar(v: Any) -> bool:
    return v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v))


def _first_type(s: pd.Series, bad: np.ndarray) -> str:
    return type(s.iloc[int(np.flatnonzero(bad)[0])]).__name__


def _object_numeric(s: pd.Series, col: str, source: str, kind: str) -> np.ndarray:
    """Object-dtype column that should be numeric: float64 array or TraceError."""
    inferred = pd.api.types.infer_dtype(s, skipna=True)
    if inferred not in ("integer", "floating", "mixed-integer-float", "decimal", "empty"):
        bad = np.fromiter((not (_is_real_number(v) or _isna_scalar(v)) for v in s), dtype=bool, count=len(s))
        if bad.any():
            fail(source, col, s, bad, f"expected {kind}, got {_first_type(s, bad)}")
    return pd.to_numeric(s, errors="raise").to_numpy(dtype="float64", na_value=np.nan)


def _as_float_array(s: pd.Series, col: str, source: str, kind: str) -> np.ndarray:
    """Any numeric-looking column as float64 (NaN for missing); refuse non-numbers."""
    dt = s.dtype
    if pd.api.types.is_bool_dtype(dt):
        fail(source, col, s, np.ones(len(s), bool), f"expected {kind}, got bool")
    if isinstance(dt, pd.CategoricalDtype) or pd.api.types.is_string_dtype(dt) and dt != object:
        mask = s.notna().to_numpy()
        fail(source, col, s, mask if mask.any() else np.ones(len(s), bool), f"expected {kind}, got text ({dt})")
    if pd.api.types.is_numeric_dtype(dt):
        return s.to_numpy(dtype="float64", na_value=np.nan)
    if dt == object:
        return _object_numeric(s, col, source, kind)
    fail(source, col, s, np.ones(len(s), bool), f"expected {kind}, got dtype {dt}")
    raise AssertionError  # unreachable


def _exact_integers(a: np.ndarray, s: pd.Series, col: str, source: str) -> np.ndarray:
    """A float array that must hold whole numbers, as int64."""
    for bad, problem in (
        (np.isnan(a), "missing value (NaN) in integer column"),
        (np.isinf(a), "infinite value in integer column"),
    ):
        if bad.any():
            fail(source, col, s, bad, problem)
    for bad, problem in ((a != np.floor(a), "non-integer value in integer column"),
                         (np.abs(a) > 2.0**53, "integer value too large to be exact")):
        if bad.any():
            fail(source, col, s, bad, problem)
    return a.astype("int64")


def coerce_int(s: pd.Series, col: str, source: str) -> np.ndarray:
    """int64: any integer dtype, or floats whose values are whole; refuses text, bools, NaN/NA, inf."""
    dt = s.dtype
    if pd.api.types.is_integer_dtype(dt) and not pd.api.types.is_bool_dtype(dt):
        if isinstance(dt, pd.api.extensions.ExtensionDtype):
            na = s.isna().to_numpy()
            if na.any():
                fail(source, col, s, na, "missing value (NA) in integer column")
            return s.to_numpy(dtype="int64")
        if dt == np.uint64:
            big = s.to_numpy() > np.iinfo(np.int64).max
            if big.any():
                fail(source, col, s, big, "value does not fit in int64")
        return s.to_numpy().astype("int64", copy=False)
    return _exact_integers(_as_float_array(s, col, source, "an integer"), s, col, source)


def coerce_float(s: pd.Series, col: str, source: str) -> np.ndarray:
    """float64: integer and float dtypes; refuses text and bools."""
    if pd.api.types.is_float_dtype(s.dtype) and not isinstance(s.dtype, pd.api.extensions.ExtensionDtype):
        return s.to_numpy().astype("float64", copy=False)
    return _as_float_array(s, col, source, "a number")


def coerce_floats(s: pd.Series, col: str, source: str) -> np.ndarray:
    """A list of numbers per row -> an object array of 1-D float32 arrays (None -> empty)."""
    out = np.empty(len(s), dtype=object)
    for i, v in enumerate(s.to_numpy(dtype=object)):
        try:
            a = np.asarray([] if v is None else v, dtype=np.float32)
        except (TypeError, ValueError):
            a = None
        if a is None or a.ndim != 1:
            bad = np.zeros(len(s), bool)
            bad[i] = True
            fail(source, col, s, bad, "expected a list of numbers")
        out[i] = a
    return out


def coerce_str(s: pd.Series, col: str, source: str, nan_default: str | None) -> pd.Series:
    """Text: str/object/categorical columns holding text; a missing value becomes ``nan_default``
    (refused where that is None)."""
    dt = s.dtype
    if isinstance(dt, pd.CategoricalDtype):
        s = s.astype(object).where(s.notna(), None)
        dt = s.dtype
    if pd.api.types.is_string_dtype(dt) and dt != object:
        pass  # a proper string dtype: values are str or NA
    elif dt == object:
        if pd.api.types.infer_dtype(s, skipna=True) not in ("string", "empty"):
            bad = np.fromiter((not (isinstance(v, str) or _isna_scalar(v)) for v in s), dtype=bool, count=len(s))
            fail(source, col, s, bad, f"expected text, got {_first_type(s, bad)}")
    else:
        fail(source, col, s, np.ones(len(s), bool), f"expected text, got dtype {dt}")
    na = s.isna().to_numpy()
    if na.any():
        if nan_default is None:
            fail(source, col, s, na, "missing value")
        s = s.where(~na, nan_default)
    return s.astype(STR_DTYPE)


def coerce_bool(s: pd.Series, col: str, source: str) -> np.ndarray:
    """bool: a bool column, or 0/1 numbers; refuses text, other numbers and missing values."""
    if pd.api.types.is_bool_dtype(s.dtype):
        na = s.isna().to_numpy()
        if na.any():
            fail(source, col, s, na, "missing value (NA) in bool column")
        return s.to_numpy(dtype=bool)
    if s.dtype == object:
        bad = np.fromiter((not (isinstance(v, (bool, np.bool_)) or (_is_real_number(v) and v in (0, 1))) for v in s),
                          dtype=bool, count=len(s))
        if bad.any():
            fail(source, col, s, bad, "expected a bool (True/False or 1/0)")
        return s.to_numpy().astype(bool)
    a = _as_float_array(s, col, source, "a bool (True/False or 1/0)")
    bad = ~np.isin(a, (0.0, 1.0))
    if bad.any():
        fail(source, col, s, bad, "expected a bool (True/False or 1/0)")
    return a.astype(bool)


def coerce_id(s: pd.Series, col: str, source: str) -> np.ndarray | pd.Series:
    """An identifier as the trace wrote it: int64 where every value is a whole number (as coerce_int), text
    where every value is text (not empty); a column mixing the two, or missing a value, is refused."""
    dt = s.dtype
    text = isinstance(dt, pd.CategoricalDtype) or (pd.api.types.is_string_dtype(dt) and dt != object)
    if dt == object:
        inferred = pd.api.types.infer_dtype(s, skipna=True)
        if inferred.startswith("mixed") and inferred != "mixed-integer-float":
            known = ~s.isna().to_numpy()
            is_text = np.fromiter((isinstance(v, str) for v in s), dtype=bool, count=len(s))
            first = int(np.flatnonzero(known)[0])
            mixed = known & (is_text != is_text[first])
            if mixed.any():
                fail(source, col, s, mixed, f"identifiers mix text and numbers (row {first} has {fmt_value(s.iloc[first])})")
        text = inferred in ("string", "empty")
    if not text:
        return coerce_int(s, col, source)
    ids = coerce_str(s, col, source, None)
    empty = (ids.str.len() == 0).to_numpy()
    if empty.any():
        fail(source, col, ids, empty, "empty identifier")
    return ids


def sortable_ids(ids: np.ndarray | pd.Series) -> np.ndarray:
    """Identifiers as int64 codes in their sort order (text sorts as text), for np.lexsort."""
    if isinstance(ids, np.ndarray):
        return ids
    return pd.factorize(ids, sort=True)[0]


_KEY_ORDER = "__key_order__"  # where key_order keeps its answer in `cols` (no schema column has this name)


def key_order(cols: Columns) -> np.ndarray | None:
    """The stable order that sorts the rows by (`step`, `prompt_id`, `sample_idx`), or None where they are in that
    order already (a trace lssim wrote; then nothing is sorted). Computed once per `cols`: check_unique_key and
    lssim.traces.trace's sorting both read it."""
    if _KEY_ORDER not in cols:
        keys = (cols["step"], sortable_ids(cols["prompt_id"]), cols["sample_idx"])
        cols[_KEY_ORDER] = (None if is_sorted(keys) else np.lexsort(keys[::-1]), keys)
    return cols[_KEY_ORDER][0]


def is_sorted(keys: tuple[np.ndarray, ...]) -> bool:
    """Whether rows are in ascending lexicographic order of `keys` (most significant first); ties count as sorted
    (a stable sort leaves them where they are)."""
    undecided = np.ones(max(len(keys[0]) - 1, 0), dtype=bool)
    for k in keys:
        a, b = k[:-1], k[1:]
        if (undecided & (a > b)).any():
            return False
        undecided &= a == b
        if not undecided.any():
            return True
    return True


# --------------------------------------------------------------------------
# Per-column checks (driven by the schema's Column records)
# --------------------------------------------------------------------------


def check_column_range(c: Any, values: Any, source: str) -> None:
    """One column against its schema entry ``c`` (an lssim.traces.trace.Column): NaN where not allowed, ±inf,
    the bounds, the allowed values."""
    numeric = c.kind in ("int", "float") or (c.kind == "id" and isinstance(values, np.ndarray))
    if numeric and _range_holds(c, values):
        return  # two reductions said so; the masks below only name the first bad row
    if c.kind == "float":
        nan = np.isnan(values)
        if not c.allow_nan and nan.any():
            fail(source, c.name, values, nan, "NaN not allowed")
        inf = np.isinf(values)
        if inf.any():
            fail(source, c.name, values, inf, "infinite value")
    if numeric:
        with np.errstate(invalid="ignore"):
            if c.min is not None and (bad := values < c.min).any():
                fail(source, c.name, values, bad, f"must be >= {num(c.min)}")
            if c.max is not None and (bad := values > c.max).any():
                fail(source, c.name, values, bad, f"must be <= {num(c.max)}")
    if c.choices is not None:
        bad = ~values.isin(c.choices).to_numpy()
        if bad.any():
            fail(source, c.name, values, bad, f"must be one of {', '.join(c.choices)}")


def _range_holds(c: Any, values: np.ndarray) -> bool:
    """Whether a numeric column passes check_column_range, from its smallest and largest values alone (False
    also where it may not: then the row-by-row masks decide). NaN propagates through min (not allowed) and is
    skipped by fmin (allowed)."""
    if not len(values):
        return True
    if c.kind == "float":
        lo, hi = (np.fmin.reduce(values), np.fmax.reduce(values)) if c.allow_nan else (values.min(), values.max())
        if math.isinf(lo) or math.isinf(hi) or (math.isnan(lo) and not c.allow_nan):
            return False
    else:
        lo, hi = values.min(), values.max()
    return not (c.min is not None and lo < c.min) and not (c.max is not None and hi > c.max)


# --------------------------------------------------------------------------
# Cross-column checks, in the order they run
# --------------------------------------------------------------------------


def check_length_means_budget(cols: Columns, source: str) -> None:
    """`finish_reason == 'length'` implies `response_len == max_tokens`"""
    rl, mt = cols["response_len"], cols["max_tokens"]
    bad = (cols["finish_reason"] == "length").to_numpy() & (rl != mt)
    if bad.any():
        pos = int(np.flatnonzero(bad)[0])
        fail(source, "finish_reason", None, bad,
             f"finish_reason 'length' but response_len {rl[pos]} != max_tokens {mt[pos]}")


def _check_not_above(column: str, limit: str, name: str, rule: str) -> Check:
    """A check that `column <= limit` row by row (the failure names `column`); `rule` is its documented form."""
    def check(cols: Columns, source: str) -> None:
        a, b = cols[column], cols[limit]
        bad = a > b
        if bad.any():
            pos = int(np.flatnonzero(bad)[0])
            fail(source, column, None, bad, f"{column} {a[pos]} > {limit} {b[pos]}")

    check.__name__, check.__doc__ = name, rule
    return check


def _check_mark_within_response(name: str) -> Check:
    return _check_not_above(name, "response_len", f"check_{name}_within_response",
                            f"`{name}` is -1 or `0 <= {name} <= response_len`")


check_response_fits_budget = _check_not_above("response_len", "max_tokens", "check_response_fits_budget",
                                              "`response_len <= max_tokens`")
check_loop_within_response = _check_mark_within_response("loop_start")
check_collapse_within_response = _check_mark_within_response("entropy_collapse_start")
check_versions_ordered = _check_not_above("policy_version_first", "policy_version_last", "check_versions_ordered",
                                          "`policy_version_first <= policy_version_last`")


def check_times_ordered(cols: Columns, source: str) -> None:
    """`submit_time <= first_token_time <= finish_time` where both values are known"""
    for a, b in (("submit_time", "first_token_time"), ("first_token_time", "finish_time"), ("submit_time", "finish_time")):
        with np.errstate(invalid="ignore"):
            bad = cols[a] > cols[b]  # False where either is NaN
        if bad.any():
            pos = int(np.flatnonzero(bad)[0])
            fail(source, b, None, bad, f"{a} {fmt_value(cols[a][pos])} > {b} {fmt_value(cols[b][pos])}")


def check_step_timings_constant(cols: Columns, source: str) -> None:
    """`step_rollout_seconds` and `step_train_seconds` take a single value within a step (NaN ignored)"""
    step = cols["step"]
    for name in ("step_rollout_seconds", "step_train_seconds"):
        v = cols[name]
        kpos = np.flatnonzero(~np.isnan(v))
        if not len(kpos):
            continue
        g = pd.DataFrame({"step": step[kpos], "v": v[kpos], "pos": kpos}).groupby("step")
        first_v, first_pos = g["v"].transform("first").to_numpy(), g["pos"].transform("first").to_numpy()
        bad_k = v[kpos] != first_v
        if bad_k.any():
            bad = np.zeros(len(v), bool)
            bad[kpos[bad_k]] = True
            pos = int(np.flatnonzero(bad)[0])
            ref = int(first_pos[np.flatnonzero(bad_k)[0]])
            fail(source, name, v, bad, f"differs within step {step[pos]} (row {ref} has {fmt_value(v[ref])})")


def check_unique_key(cols: Columns, source: str) -> None:
    """(`step`, `prompt_id`, `sample_idx`) is unique"""
    order = key_order(cols)
    keys = cols[_KEY_ORDER][1] if order is None else tuple(k[order] for k in cols[_KEY_ORDER][1])
    # Sorted by the key, a duplicate sits right after its twin; the sort is stable, so the first of each run of
    # equal keys is the first one in input order.
    dup_sorted = np.zeros(len(keys[0]), dtype=bool)
    dup_sorted[1:] = True
    for k in keys:
        dup_sorted[1:] &= k[1:] == k[:-1]
    if not dup_sorted.any():
        return
    position = np.arange(len(dup_sorted)) if order is None else order  # input row of each sorted row
    dup_at = np.flatnonzero(dup_sorted)
    j = int(dup_at[np.argmin(position[dup_at])])  # the duplicate that comes first in the input
    run_starts = np.flatnonzero(~dup_sorted)
    first, second = int(position[run_starts[np.searchsorted(run_starts, j, side="right") - 1]]), int(position[j])
    key = ("step", "prompt_id", "sample_idx")
    kv = tuple(_at(cols[k], second) for k in key)
    kv = tuple(x if isinstance(x, str) else int(x) for x in kv)
    desc = ", ".join(f"{k}={x!r}" if isinstance(x, str) else f"{k}={x}" for k, x in zip(key, kv))
    ndup = len(dup_at)
    more = f"; {ndup} duplicate rows in all" if ndup > 1 else ""
    names = ", ".join(repr(k) for k in key)
    hint = ""
    if "group_id" in cols and cols["group_id"][first] != cols["group_id"][second]:
        hint = " (the two rows are in different groups: number a prompt's samples in one step across its groups)"
    raise TraceError(f"{source}: key columns {names}: row {second}: duplicate key ({desc}), first seen at row {first}"
                     f"{more}{hint}")


def check_measured_signals(cols: Columns, source: str) -> None:
    """rows with `signal_source` `measured` have window >= ngram >= 1, stride >= 1 and `response_len // signal_stride`
    values in `signal_repetition` (each in [0, 1]) and `signal_entropy` (each >= 0 or NaN)"""
    measured = (cols["signal_source"] == "measured").to_numpy()
    if not measured.any():
        return
    names = ("signal_window", "signal_ngram", "signal_stride", "signal_repetition", "signal_entropy")
    missing = [n for n in names if n not in cols]
    if missing:
        fail(source, "signal_source", None, measured, f"measured signals need the column(s) {', '.join(missing)}")
    window, ngram, stride = cols["signal_window"], cols["signal_ngram"], cols["signal_stride"]
    if (bad := measured & ((stride < 1) | (ngram < 1) | (window < ngram))).any():
        fail(source, "signal_stride", None, bad, "measured signals need signal_window >= signal_ngram >= 1, signal_stride >= 1")
    expected = cols["response_len"] // np.maximum(stride, 1)
    for name in ("signal_repetition", "signal_entropy"):
        lists = cols[name]
        sizes = np.fromiter((len(a) for a in lists), dtype=np.int64, count=len(lists))
        if (bad := measured & (sizes != expected)).any():
            pos = int(np.flatnonzero(bad)[0])
            fail(source, name, None, bad, f"{sizes[pos]} values where response_len // signal_stride is {expected[pos]}")
    for name, ok in (("signal_repetition", lambda a: ((a >= 0) & (a <= 1)).all()),
                     ("signal_entropy", lambda a: not (a < 0).any() and not np.isinf(a).any())):
        bad = np.fromiter((m and not ok(a) for m, a in zip(measured, cols[name])), dtype=bool, count=len(measured))
        if bad.any():
            fail(source, name, None, bad, "repetition must be in [0, 1]" if name == "signal_repetition"
                 else "entropy must be >= 0 (or NaN)")


CROSS_COLUMN_CHECKS: tuple[Check, ...] = (
    check_response_fits_budget,
    check_length_means_budget,
    check_loop_within_response,
    check_collapse_within_response,
    check_versions_ordered,
    check_times_ordered,
    check_step_timings_constant,
    check_measured_signals,
    check_unique_key,
)
"""Rules that involve more than one column, in the order they run; each one's docstring is the rule
as traces/README.md states it (lssim.traces.trace.CROSS_COLUMN_RULES)."""
