"""Ranking runs honestly: the bounds a user states, and the Pareto front of gain against its price.

`lssim plan` and `lssim sweep` both rank candidates best first; a candidate that breaks a stated bound (trains
tokens staler than `max_staleness` versions, or a larger off-policy share than `max_off_policy`) stays in the table,
marked, and is never "best"; `pareto_mask` marks the candidates no other beats on both gain and price.
"""

from __future__ import annotations

import numpy as np
import pandas as pd


def pareto_mask(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """True where no other point has x <= and y >= with one strict (lower cost x, higher gain y)."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    dominated = ((x[None] <= x[:, None]) & (y[None] >= y[:, None]) & ((x[None] < x[:, None]) | (y[None] > y[:, None]))).any(axis=1)
    return ~dominated & np.isfinite(x) & np.isfinite(y)


def within_bounds(table: pd.DataFrame, max_staleness: int | None = None, max_off_policy: float | None = None) -> pd.Series:
    """True for the rows that keep every stated bound (None: no bound)."""
    ok = pd.Series(True, index=table.index)
    if max_staleness is not None:
        ok &= table["max_staleness"] <= max_staleness
    if max_off_policy is not None:
        ok &= table["off_policy_token_fraction"] <= max_off_policy
    return ok


def rank(table: pd.DataFrame, by: str, price: str, max_staleness: int | None = None,
         max_off_policy: float | None = None) -> pd.DataFrame:
    """`table` with `within_bounds` and `pareto` (of `by` against `price`) columns, best first: rows within the
    bounds by `by`, then the others."""
    table = table.copy()
    table["within_bounds"] = within_bounds(table, max_staleness, max_off_policy)
    table["pareto"] = pareto_mask(table[price].to_numpy(), table[by].to_numpy())
    return table.sort_values(["within_bounds", by], ascending=[False, False], kind="stable")
