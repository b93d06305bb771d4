"""N engine instances on one host, or an engine started with speculation: how much slower each runs than the
one-instance profile, measured, and the cost model the simulated twin of such a world prices its steps with.

    fit = profile_layout(engine, "runs/v/profile.json", cpus="0|1")   # an engine of 2 instances, measured now
    layout_profile("runs/v/profile.json", 2, cpus="0|1")             # -> runs/v/profile_layout2.json (checked)
    twin_cost("runs/v/profile.json", 2, cpus="0|1")                  # -> (profile, (s_1, s_2), description)

Why: the profile (real_backend.profile) is measured on one instance with the host to itself. On this 2-core
machine a second vLLM instance shares the CPUs: the engine cores, the one front-end process that streams every
token of both, and the memory bus. Measured (2026-11-23, a probe of 128-token lockstep batches, then this
module's cells): with vLLM's automatic binding both instances' threads sit on CPU 0 and each busy instance runs
2.0-3.1x slower than the profile predicts; bound one CPU each (`cpus = "0|1"`), 1.4-1.6x while both are busy and
0.9-1.1x when one runs alone. The simulator's instances are independent, so the twin of an N-instance world
runs them on a shared clock (lssim.sim.shared_host): while b are busy each is slowed by s_b, measured here.

An engine started with speculation (a validation world where a policy drafts: vLLM fixes speculation at start) is
another engine even while it does not draft: vLLM turns async scheduling off for it, so its scheduling no longer
overlaps the model's forward pass. Its plain runs (drafting off) and the steps a policy leaves undrafted are priced
with its own layout, measured the same way with drafting off (one instance: the one factor). A speculating step's
cost over a plain step of the same engine is lssim.cost.SpeculativeCost's, fitted on that engine
(paper/experiments/measure_speculation.py), so it applies on top.

How: a cell gives each instance its own batch of n requests (distinct random prompts of P tokens, lengths drawn
from the profile's long tail, `ignore_eos`), all submitted at once, so the instances run beside each other as in
a rollout step, and each instance's batch makespan is one row; more cells run one instance alone. Under
processor sharing an instance's makespan is linear in (s_1, ..., s_N) given the profile's makespans of the
cell's batches (fit_host_slowdown), so the slow-downs are a non-negative relative least squares over every row.
Reported beside: one factor for the profile (fitted to the cells' makespans with all busy: the slowest instance,
what a step waits for), per instance and per batch size, the file of which is a plain ProfiledCostModel that
`lssim replay --profile` can use. About 40 s on this CPU.

Files, beside the one-instance profile <stem>.json: <stem>_layout<N>.json (<stem>_layout<N>_speculating.json for an
engine started with speculation; a ProfiledCostModel: the profile's coefficients times the one factor;
"measured_by" says how: the command, the layout, the base profile and its coefficients, host_slowdown s_1..s_N and
both fits' errors) and <stem>_layout<N>[_speculating]_batches.parquet (the cells).
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import numpy as np
import pandas as pd

from .cells import longtail_lengths, random_requests, time_cell

LAYOUT_BATCH_SIZES = (4, 8, 16, 32)  # per instance: a validation world's step puts 8-32 requests on each
LAYOUT_PROMPT_LENS = (8, 64)
ALONE_BATCH_SIZES = (8, 32)  # cells where one instance runs alone: s_1 of the host slow-down


def _name(n_instances: int, speculating: bool) -> str:
    return f"layout{n_instances}" + ("_speculating" if speculating else "")


def layout_path(profile, n_instances: int, speculating: bool = False) -> Path:
    """Where the measured layout of `n_instances` instances (of an engine started with speculation, if
    `speculating`) lies beside the one-instance `profile`."""
    return Path(profile).with_name(f"{Path(profile).stem}_{_name(n_instances, speculating)}.json")


def layout_batches_path(profile, n_instances: int, speculating: bool = False) -> Path:
    return Path(profile).with_name(f"{Path(profile).stem}_{_name(n_instances, speculating)}_batches.parquet")


def layout_profile(profile, n_instances: int, cpus: str | None = None, speculating: bool = False) -> str:
    """The profile the simulated twin of an engine of `n_instances` instances (threads bound as `cpus` says; started
    with speculation if `speculating`) prices its steps with: `profile` itself for one plain instance, else its
    measured layout (layout_path). ValueError, naming the file and the command that makes it, when the layout was
    not measured, was measured for other CPUs, or against other coefficients than `profile` has now."""
    from lssim.cost import ProfiledCostModel

    if n_instances <= 1 and not speculating:
        return str(profile)
    path = layout_path(profile, n_instances, speculating)
    make = (f"measure it with `lssim validate --reprofile` (it measures every layout it runs) or "
            f"`lssim profile --out {profile} --instances {n_instances}{f' --cpus {cpus}' if cpus else ''}"
            f"{' --speculating' if speculating else ''}`")
    if not path.is_file():
        what = (f"{n_instances} engine instance(s) started with speculation (vLLM runs them without async scheduling, "
                f"drafting or not)" if speculating else
                f"{n_instances} engine instances sharing this host (the simulator's instances are independent, the real "
                f"ones share the CPUs)")
        raise ValueError(f"{path}: no measured slow-down of {what} beside the one-instance profile {profile}; {make}")
    ProfiledCostModel.from_json(path)  # a bad file fails here, naming itself
    import json

    layout = json.loads(path.read_text()).get("measured_by", {}).get("layout", {})
    if layout.get("n_instances") != n_instances or layout.get("cpus") != cpus:
        raise ValueError(f"{path}: measured for {layout.get('n_instances')} instance(s) on cpus {layout.get('cpus')!r}, "
                         f"the run had {n_instances} on cpus {cpus!r}; {make}")
    base = ProfiledCostModel.from_json(profile).coefficients
    if layout.get("base_coefficients") != base:
        raise ValueError(f"{path}: measured against other coefficients than {profile} has now (re-profiled since?); {make}")
    return str(path)


def measured_layouts(profile) -> list[tuple[Path, str | None, bool]]:
    """(cells parquet, cpus, speculating) of every layout measured beside `profile`."""
    import json
    import re

    found = []
    for cells in sorted(Path(profile).parent.glob(f"{Path(profile).stem}_layout*_batches.parquet")):
        m = re.fullmatch(rf"{re.escape(Path(profile).stem)}_layout(\d+)(_speculating)?_batches\.parquet", cells.name)
        if not m:
            continue
        spec = m.group(2) is not None
        path = layout_path(profile, int(m.group(1)), spec)
        if path.is_file():
            meta = json.loads(path.read_text()).get("measured_by", {})
            found.append((cells, meta.get("layout", {}).get("cpus"), spec))
    return found


def twin_cost(profile, n_instances: int, cpus: str | None = None,
              speculating: bool = False) -> tuple[str, tuple[float, ...] | None, str]:
    """What the simulated twin of an engine of `n_instances` instances (threads bound as `cpus`; started with
    speculation if `speculating`) prices with: (cost model JSON, host slow-down per number of busy instances or
    None, a description). One plain instance: the profile alone. One instance started with speculation: its
    layout's scaled profile (one factor). Several: the profile with the layout's measured host slow-down
    (lssim.sim.shared_host), or for a layout file without one, the layout's scaled profile; errors as
    layout_profile's."""
    import json

    path = layout_profile(profile, n_instances, cpus, speculating)
    if n_instances <= 1:
        return path, None, path
    slowdown = json.loads(Path(path).read_text())["measured_by"]["layout"].get("host_slowdown")
    if slowdown is None:
        return path, None, path
    return str(profile), tuple(slowdown), f"{profile} on a shared host, slow-down {' / '.join(f'{v:.3f}' for v in slowdown)} with 1..{len(slowdown)} instances busy ({path})"


def measure_layout(engine, batch_sizes=LAYOUT_BATCH_SIZES, prompt_lens=LAYOUT_PROMPT_LENS, length: int = 256,
                   repeats: int = 2, seed: int = 0, alone_sizes=ALONE_BATCH_SIZES, between_cells=None) -> pd.DataFrame:
    """Measure an engine (nothing in flight) of several instances, or of one started with speculation (call it with
    drafting off). Rows: n_seqs (on that instance), prompt_len, spread, cut (1.0: the whole batch), lengths, seconds
    (its batch's makespan), repeat, instance, busy (instances loaded in the cell: all of them, or 1 for the cells
    of `alone_sizes` run on each of several instances alone), cell (the rows of one cell share it).
    `between_cells(i)` is called after cell i, with nothing in flight (as profile.measure's)."""
    n_inst = int(engine.n_instances)
    rng = np.random.default_rng(seed)
    vocab = engine.vocab_size
    cells = [(rep, p, n, tuple(range(n_inst))) for rep in range(repeats) for p in prompt_lens for n in batch_sizes]
    if n_inst > 1:
        cells += [(rep, min(prompt_lens), n, (i,)) for rep in range(repeats) for n in alone_sizes for i in range(n_inst)]
    cells = [cells[i] for i in rng.permutation(len(cells))]  # drift must not pass for a trend in n, P or busy
    # One cell first, not recorded: an engine's first batches of a new shape pay for kernels and allocations.
    cells = [(-1, max(prompt_lens), max(batch_sizes), tuple(range(n_inst)))] + cells
    prompts: dict[int, list[int]] = {}
    rows, rid = [], 0
    with engine.serving_exactly(prompts):
        for cell, (rep, p, n, loaded) in enumerate(cells):
            requests, lengths = [], {}
            for inst in loaded:
                lengths[inst] = longtail_lengths(rng, n, length)
                cell_prompts, made = random_requests(rng, vocab, lengths[inst], rid, p, inst)
                prompts.update(cell_prompts)
                requests += made
                rid += n
            finish = time_cell(engine, requests)
            for inst in loaded if rep >= 0 else ():
                seconds = max(finish[r.rid] for r in requests if r.instance == inst)
                rows.append({"n_seqs": n, "prompt_len": p, "spread": "longtail", "cut": 1.0, "lengths": lengths[inst],
                             "seconds": seconds, "repeat": rep, "instance": inst, "busy": len(loaded), "cell": cell})
            for r in requests:
                prompts.pop(r.rid, None)
            if between_cells is not None and cell + 1 < len(cells):
                between_cells(cell)  # a speed probe sets its own prompts and puts these back (VLLMEngine.serving_exactly)
    return pd.DataFrame(rows)


def fit_layout(base, batches: pd.DataFrame) -> dict:
    """The slow-down of instances beside each other against `base` (a ProfiledCostModel of one instance alone).
    factor: fitted on the cells where every instance is busy, to the cell's makespan (its slowest instance: what a
    rollout step waits for, and what the simulated twin predicts as the largest of its instances' makespans);
    fit_error: its makespan error on those cells. Reported beside: the factor per instance and per batch size (on
    each instance's own makespan), and of the cells run alone (each the same relative least squares)."""
    if batches is None or not len(batches):
        raise ValueError("fit_layout: no layout measurements")
    missing = {"n_seqs", "prompt_len", "lengths", "seconds", "instance", "busy", "cell"} - set(batches.columns)
    if missing:
        raise ValueError(f"fit_layout: the measurements lack columns {sorted(missing)}")
    df = batches.assign(predicted=[base.makespan(l, int(p)) for l, p in zip(batches["lengths"], batches["prompt_len"])])
    if not (np.isfinite(df["seconds"]).all() and (df["seconds"] > 0).all()):
        raise ValueError("fit_layout: column 'seconds' must be finite and > 0")
    n_inst = int(df["instance"].max()) + 1
    together = df[df["busy"] == n_inst]
    if together.empty:
        raise ValueError("fit_layout: no cell with every instance busy")
    cells = together.groupby("cell")[["predicted", "seconds"]].max()
    factor = _relative_factor(cells["predicted"].to_numpy(), cells["seconds"].to_numpy())
    ape = np.abs(factor * cells["predicted"] / cells["seconds"] - 1).to_numpy() * 100
    by = lambda key: {int(k): _relative_factor(g["predicted"].to_numpy(), g["seconds"].to_numpy())  # noqa: E731
                      for k, g in together.groupby(key)}
    alone = df[df["busy"] < n_inst]
    slowdown, sharing_ape = fit_host_slowdown(df, n_inst)
    return {"n_instances": n_inst, "factor": factor, "host_slowdown": slowdown,
            "host_slowdown_error": {"median_ape_pct": float(np.median(sharing_ape)), "p90_ape_pct": float(np.percentile(sharing_ape, 90)),
                                    "n_points": int(len(sharing_ape)), "of": "each instance's makespan in every cell, shared clock"},
            "fit_error": {"median_ape_pct": float(np.median(ape)), "p90_ape_pct": float(np.percentile(ape, 90)),
                          "max_ape_pct": float(ape.max()), "n_points": int(len(cells)),
                          "of": "cell makespan (its slowest instance), every instance busy"},
            "by_instance": by("instance"), "by_batch_size": by("n_seqs"),
            "alone_factor": _relative_factor(alone["predicted"].to_numpy(), alone["seconds"].to_numpy()) if len(alone) else None}


def fit_host_slowdown(df: pd.DataFrame, n_inst: int) -> tuple[list[float], np.ndarray]:
    """Processor sharing (lssim.sim.shared_host): while b instances are busy each runs s_b x slower than the profile.
    A cell's instances, sorted by their profiled makespans m_(1) <= ... <= m_(k) (k loaded), all progress together:
    the one of rank r finishes at sum_{j<=r} s_(k-j+1) (m_(j) - m_(j-1)), linear in s. Fitted (non-negative, relative
    least squares) to every instance's makespan in every cell. Returns ([s_1, ..., s_N], the fit's APE per row);
    an s_b no cell informs is the nearest informed one's."""
    from scipy.optimize import nnls

    rows, y = [], []
    for _, cell in df.groupby("cell"):
        m = np.sort(cell["predicted"].to_numpy(float))
        k = len(m)
        steps = np.diff(np.concatenate([[0.0], m]))  # progress made with k, k-1, ... instances busy
        for rank, seconds in enumerate(np.sort(cell["seconds"].to_numpy(float))):
            f = np.zeros(n_inst)
            for j in range(rank + 1):
                f[k - j - 1] += steps[j]
            rows.append(f)
            y.append(seconds)
    X, y = np.array(rows), np.array(y)
    informed = X.sum(axis=0) > 0
    s = np.zeros(n_inst)
    s[informed], _ = nnls(X[:, informed] / y[:, None], np.ones(len(y)))
    for b in np.flatnonzero(~informed):  # no cell with that many busy: the nearest count that was measured
        s[b] = s[np.flatnonzero(informed)[np.argmin(np.abs(np.flatnonzero(informed) - b))]]
    return [float(v) for v in s], np.abs(X @ s / y - 1) * 100


def _relative_factor(predicted: np.ndarray, measured: np.ndarray) -> float:
    """s minimising sum((s * predicted / measured - 1)^2)."""
    r = predicted / measured
    return float(r.sum() / (r * r).sum())


def scaled_model(base, factor: float, name: str):
    """`base` with every coefficient times `factor`: every engine time it prices, times `factor`; the caller's time to
    abort and resume (`abort_seconds`, `resume_seconds`: not the engine's work) as they were, as
    lssim.sim.shared_host.ScaledCost keeps them."""
    from lssim.cost import ProfiledCostModel

    return ProfiledCostModel(**{k: v * factor for k, v in base.coefficients.items()}, abort_seconds=base.abort_seconds,
                             resume_seconds=base.resume_seconds, name=name)


def speculating(engine) -> bool:
    """Whether `engine` was started with speculation (then its layout is its own: layout_path(speculating=True))."""
    return engine.speculation is not None


@contextlib.contextmanager
def drafting_off(engine):
    """No drafts while measuring an engine started with speculation (a plain step of that engine); nothing for others.
    A run sets its own limit when it starts (VLLMEngine.set_speculation)."""
    if speculating(engine):
        engine.set_draft_limit(0)
    yield


def profile_layout(engine, profile, cpus: str | None, meta: dict | None = None, **measure_kw) -> dict:
    """Measure `engine` (several instances, threads bound as `cpus`, or one started with speculation, measured with
    drafting off) against the one-instance `profile` and write what write_layout writes. Returns fit_layout's dict."""
    import sys

    t0 = time.monotonic()
    with drafting_off(engine):
        batches = measure_layout(engine, **measure_kw)
    spec = speculating(engine)
    fit = write_layout(profile, cpus, batches, {"seconds": round(time.monotonic() - t0, 1), **(meta or {})}, speculating=spec)
    n, alone = fit["n_instances"], fit["alone_factor"]
    print(f"layout of {n} instance(s){' started with speculation, drafting off' if spec else ''} (cpus {cpus}): slow-down "
          f"{' / '.join(f'{v:.2f}' for v in fit['host_slowdown'])} with 1..{n} busy (makespan error "
          f"{fit['host_slowdown_error']['median_ape_pct']:.1f}% median); one factor {fit['factor']:.2f}x with all busy"
          f"{f', {alone:.2f}x alone' if alone is not None else ''} -> {layout_path(profile, n, spec)}", file=sys.stderr)
    return fit


def write_layout(profile, cpus: str | None, batches: pd.DataFrame, meta: dict | None = None,
                 speculating: bool = False) -> dict:
    """Fit the layout measured in `batches` (measure_layout's rows) against the one-instance `profile`; write
    layout_path(profile, N, speculating) (the profile's coefficients times the factor, with how it was measured) and
    the cells beside it, each atomically. Returns fit_layout's dict."""
    from lssim.cost import ProfiledCostModel
    from lssim.results import atomic_write

    base = ProfiledCostModel.from_json(profile)
    fit = fit_layout(base, batches)
    n = fit["n_instances"]
    engine = f"{n} instance(s){', started with speculation' if speculating else ''}"
    model = scaled_model(base, fit["factor"], name=f"{base.name} x {fit['factor']:.3f} ({engine}, cpus {cpus})")
    model.fit_stats = fit["fit_error"]
    info = {"layout": {"n_instances": n, "cpus": cpus, "speculating": speculating, "base_profile": str(profile),
                       "base_coefficients": base.coefficients, **{k: v for k, v in fit.items() if k != "n_instances"},
                       "cells": layout_batches_path(profile, n, speculating).name},
            "measured": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), **(meta or {})}
    atomic_write(layout_batches_path(profile, n, speculating), lambda p: batches.to_parquet(p, index=False))
    atomic_write(layout_path(profile, n, speculating), lambda p: model.to_json(p, meta=info))
    return fit


__all__ = ["layout_path", "layout_profile", "measure_layout", "fit_layout", "scaled_model", "profile_layout", "write_layout",
           "measured_layouts", "twin_cost", "speculating", "drafting_off",
           "fit_host_slowdown"]
