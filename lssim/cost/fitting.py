"""Measurement tables for the profiled model: loading and checking them, the NNLS fit, the error summary."""

from __future__ import annotations

from pathlib import Path

from lssim.cost.protocol import INF

_BATCH_COLUMNS = ("n_seqs", "prompt_len", "lengths", "seconds")
DECODE_COLUMNS = ("n_seqs", "ctx_tokens", "seconds")
PREFILL_COLUMNS = ("prefill_tokens", "seconds")


def ape_summary(predicted, measured) -> dict:
    """Median / p90 / max absolute percentage error (in %) of predictions against measurements, and their count."""
    import numpy as np

    ape = np.abs(predicted - measured) / measured * 100.0
    return {"median_ape_pct": float(np.median(ape)), "p90_ape_pct": float(np.percentile(ape, 90)),
            "max_ape_pct": float(ape.max()), "n_points": int(len(ape))}

def load_batches(data):
    """Batch makespan measurements, checked (see ProfiledCostModel.fit_makespans)."""
    import pandas as pd

    df = pd.read_parquet(data) if isinstance(data, (str, Path)) else data
    source = str(data) if isinstance(data, (str, Path)) else "batch measurements"
    missing = [c for c in _BATCH_COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(f"{source}: missing column(s) {missing}; need {list(_BATCH_COLUMNS)}")
    if len(df) == 0:
        raise ValueError(f"{source}: no rows")
    bad = [i for i, (l, n) in enumerate(zip(df["lengths"], df["n_seqs"])) if len(l) != n or min(l) < 1]
    if bad:
        raise ValueError(f"{source}: row {bad[0]}: 'lengths' must hold n_seqs lengths, each >= 1")
    if not (df["seconds"] > 0).all():
        raise ValueError(f"{source}: column 'seconds' must be > 0 (measured times)")
    return df, source


def load_table(data, required: tuple[str, ...], what: str):
    """A DataFrame from ``data`` (DataFrame or .csv/.parquet/.json path), checked: required columns
    present, numeric, finite, non-negative, ``seconds`` > 0. Returns (df, label for messages)."""
    import pandas as pd

    if isinstance(data, (str, Path)):
        source = str(data)
        suffix = Path(data).suffix.lower()
        if not Path(data).exists():
            raise ValueError(f"{source}: {what} file not found")
        reader = {".csv": pd.read_csv, ".parquet": pd.read_parquet, ".json": pd.read_json}.get(suffix)
        if reader is None:
            raise ValueError(f"{source}: unsupported file type {suffix!r} (use .csv, .parquet or .json)")
        df = reader(data)
    elif isinstance(data, pd.DataFrame):
        df = data
        source = df.attrs.get("source", f"{what} DataFrame")
    else:
        raise ValueError(f"{what}: expected a pandas DataFrame or a file path, got {type(data).__name__}")
    missing = [c for c in required if c not in df.columns]
    if missing:
        raise ValueError(f"{source}: missing column(s) {missing}; need {list(required)}, have {list(df.columns)}")
    if len(df) == 0:
        raise ValueError(f"{source}: too few points (no rows)")
    for col in required:
        values = pd.to_numeric(df[col], errors="coerce")
        if values.isna().any():
            raise ValueError(f"{source}: column {col!r} has missing or non-numeric values")
        if not values.abs().lt(INF).all():
            raise ValueError(f"{source}: column {col!r} has infinite values")
        if (values < 0).any():
            raise ValueError(f"{source}: column {col!r} has negative values")
    if (df["seconds"] <= 0).any():
        raise ValueError(f"{source}: column 'seconds' must be > 0 (measured times)")
    return df, source


def nnls_relative(X, y, source: str):
    """Non-negative least squares minimising relative error: rows scaled by 1/y, columns
    normalised for conditioning and un-normalised after."""
    import numpy as np
    from scipy.optimize import nnls

    if len(y) < X.shape[1]:
        raise ValueError(f"{source}: too few points ({len(y)}) to fit {X.shape[1]} coefficients")
    if (y <= 0).any() or not np.isfinite(y).all():
        raise ValueError(f"{source}: measured seconds must be finite and > 0")
    A = X / y[:, None]
    scale = np.abs(A).max(axis=0)
    scale[scale == 0] = 1.0
    coef, _ = nnls(A / scale, np.ones_like(y))
    return coef / scale

