"""The driver's price for a twin (lssim.sim.shared_host.DriverPrice): what a run's driver spends beyond what the
profile's cells already hold, per request submitted, per token streamed and per response finished, fitted on a
world's reference runs.

Why: on a shared host the driver's own work (the controller, the policy, rewards, the submit and abort calls) is time
the engine loses. The profile is fitted to the makespans of cells whose driver also submits and streams, so a
cell's share of it is in the cost model already (issue 16: 1.3% of a one-request cell, 3.2% at 32 requests); a run
adds the controller's and the policy's work per response. So the price is the excess: each reference step's
recorded `driver_seconds` less what the cells' driver would take for that step (a fit of the cells' own
`driver_seconds` per request and per token), fitted by non-negative least squares on the step's requests, tokens
and finishes. Per step: the seconds from one step's weights to the next rollout's start (the driver records the
step, tells its observers and plans the next; the twin had none there), the median over the reference runs whose
steps ran one after another (`step_gaps`); the first step's apart (the run's start-up up to its first rollout).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

STEP_COLUMNS = ("driver_seconds", "responses_in", "tokens", "finished", "truncated")
GAP_COLUMNS = ("step_seconds", "rollout_start", "train_end")
OVERLAP_TOLERANCE = 1e-3  # seconds: a rollout starting this much before the last step's end still counts as after it
CELL_COLUMNS = ("driver_seconds", "n_seqs", "lengths", "cut")


def cells_driver(cells: pd.DataFrame) -> tuple[float, float] | None:
    """(seconds per request, per token) of the profile cells' own driver, fitted on the whole batches (cut 1.0:
    every request submitted, streamed and finished); None where the cells did not record it."""
    if cells is None or any(c not in cells for c in CELL_COLUMNS):
        return None
    whole = cells[(cells["cut"] == 1.0) & np.isfinite(cells["driver_seconds"])]
    if len(whole) < 3:
        return None
    X = np.column_stack([whole["n_seqs"].to_numpy(float), whole["lengths"].map(sum).to_numpy(float)])
    coef = _nnls(X, whole["driver_seconds"].to_numpy(float))
    return float(coef[0]), float(coef[1])


def step_features(steps: pd.DataFrame) -> np.ndarray:
    """Per step: requests submitted (responses_in), tokens streamed, responses finished (finished + truncated)."""
    return np.column_stack([steps["responses_in"].to_numpy(float), steps["tokens"].to_numpy(float),
                            (steps["finished"] + steps["truncated"]).to_numpy(float)])


def step_gaps(steps: pd.DataFrame) -> np.ndarray | None:
    """Per step, the seconds from the previous step's end (its weights ready; the run's start for the first) to
    the rollout's start: step_seconds less the span from the rollout's start to the step's end. None where the run
    did not record the times, or where its steps overlap (a rollout started before the previous step's weights:
    the modes that train beside the rollout), which leaves no such gap to read."""
    if any(c not in steps for c in GAP_COLUMNS) or not len(steps):
        return None
    start, end = steps["rollout_start"].to_numpy(float), steps["train_end"].to_numpy(float)
    if not np.isfinite(start).all() or not np.isfinite(end).all() or (start[1:] < end[:-1] - OVERLAP_TOLERANCE).any():
        return None
    return steps["step_seconds"].to_numpy(float) - (end - start)


def fit_driver_price(reference_steps: list[pd.DataFrame], cells: pd.DataFrame | None):
    """The DriverPrice of the excess driver time in `reference_steps` (each a run's steps.parquet frame) over the
    cells' (`cells_driver`); (None, why) where the runs or the cells did not record the driver, else (price, fit)
    with fit: the cells' per-request and per-token seconds, the steps fitted and the excess's median share of them."""
    from lssim.sim.shared_host import DriverPrice

    frames = [s for s in reference_steps if all(c in s for c in STEP_COLUMNS)]
    steps = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    steps = steps[np.isfinite(steps["driver_seconds"])] if len(steps) else steps
    if len(steps) < 3:
        return None, "the reference runs did not record the driver's seconds (steps.parquet driver_seconds)"
    cell = cells_driver(cells)
    if cell is None:
        return None, "the profile's cells did not record their driver's seconds (re-profile: `lssim profile`)"
    X = step_features(steps)
    excess = steps["driver_seconds"].to_numpy(float) - (cell[0] * X[:, 0] + cell[1] * X[:, 1])
    coef = _nnls(X, excess)
    gaps = [g for g in map(step_gaps, frames) if g is not None]
    later = np.concatenate([g[1:] for g in gaps]) if gaps else np.empty(0)
    per_step = max(0.0, float(np.median(later))) if len(later) else 0.0
    first_step = max(0.0, float(np.median([g[0] for g in gaps]))) if gaps else 0.0
    price = DriverPrice(per_request=float(coef[0]), per_token=float(coef[1]), per_finish=float(coef[2]), per_step=per_step,
                        first_step=first_step)
    return price, {"cells_per_request": cell[0], "cells_per_token": cell[1], "steps": int(len(steps)),
                   "excess_share_median": float(np.median(excess / steps["driver_seconds"].to_numpy(float))),
                   "per_step_runs": len(gaps)}


def fit_against_cells(reference_steps: list[pd.DataFrame], cells_path):
    """fit_driver_price against the profile cells in `cells_path` (a profile's <stem>_batches.parquet, as
    real_backend.profile.measurement_files names it; absent: the cells are taken as not recording the driver)."""
    from pathlib import Path

    cells = pd.read_parquet(cells_path) if Path(cells_path).is_file() else None
    return fit_driver_price(reference_steps, cells)


def _nnls(X: np.ndarray, y: np.ndarray) -> np.ndarray:
    from scipy.optimize import nnls

    return nnls(X, y)[0]


__all__ = ["fit_driver_price", "fit_against_cells", "cells_driver", "step_features", "step_gaps"]
