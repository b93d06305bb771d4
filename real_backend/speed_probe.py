"""The machine's speed level, measured around every validation run: a fixed probe on the real engine.

    seconds = measure_probe(engine)                  # ~3 s: two fixed batches on every instance at once
    probes = probed_measurement(engine, measure, every=12)   # probes before, during and after a measurement
    write_reference(profile_json, probes)            # ... into the cost model JSON it made
    record_run_probes(run_folder, probes, i)         # the engine's probes in order; the run sat after probes[i]
    speed_factor(run.meta, profile_json)             # the run's level over the reference's: the twin's scale

Why: this 2-core VM runs the same engine 0.9-1.5x as fast from one minute to the next (other tenants, clock and
memory contention). Every step of one validation run sits at one level (within about 10%), and the level moves
between runs, so a profile measured a few minutes earlier misprices whole runs by 4-20% (measured on the 5-repeat
validation: each baseline repeat's measured / predicted ratio ranges 1.00-1.44 in one world). The probe measures
that level without looking at the run: the same work (two lockstep batches of fixed length, fresh prompts each
time so the prefix cache never answers) between every two runs, and before, during (every few cells) and after the
measurement the twin's cost model comes from. A run's level is the median of the four probes nearest it (one now and then reads
~15% slow on its own) over the median of the reference's; the twin scales its cost model by it
(real_backend.validate_twin.sim_setup). Only the engine's speed is taken from the probe, never anything
the policy did.

Files: the reference lies in the measured cost model's JSON (the profile, or the layout the twin prices with) as
measured_by.speed_probe; each run's probes in its meta.json as speed_probe. A profile or run without one (measured
before this existed, or a profile not measured in this session) leaves the twin unscaled.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np

from .cells import random_requests, time_cell
from .layout import drafting_off

# (requests, prompt tokens, tokens each): decode at a small and a typical validation batch, ~2 s in all here.
PROBE_CELLS = ((8, 64, 256), (32, 64, 256))
_SEEDS = itertools.count(1)  # every probe draws fresh prompts


def measure_probe(engine, seed: int | None = None) -> float:
    """Seconds the probe's cells take on `engine` (nothing else in flight), summed over the cells; on an engine of
    several instances every instance gets the cell's batch at once, as a run's step loads them all (a probe of one
    instance alone did not follow the two-instance runs' speed, 2026-11-24). An engine started with speculation is
    measured with drafting off (the next run sets its own limit)."""
    rng = np.random.default_rng(next(_SEEDS) if seed is None else seed)
    vocab = engine.vocab_size
    prompts: dict[int, list[int]] = {}
    total, rid = 0.0, 0
    with drafting_off(engine), engine.serving_exactly(prompts):
        for n, prompt_len, tokens in PROBE_CELLS:
            requests = []
            for instance in range(int(engine.n_instances)):
                # fresh random prompts: a repeated one would be answered from vLLM's prefix cache
                cell_prompts, made = random_requests(rng, vocab, [tokens] * n, rid, prompt_len, instance)
                prompts.update(cell_prompts)
                requests += made
                rid += n
            total += max(time_cell(engine, requests).values())
            for r in requests:
                prompts.pop(r.rid, None)
    return total


def probed_measurement(engine, measure, every: int, probes: list[float] | None = None) -> list[float]:
    """Run `measure(between_cells=...)` (profile.profile_engine's or layout.profile_layout's measurement, bound to
    `engine`) with probes before it (two, or `probes` already taken), after every `every`-th of its cells, and two
    after it: the level of the whole measurement, not of the seconds at its ends (those were 8% off it in one run).
    Returns every probe, in order."""
    probes = list(probes) if probes else [measure_probe(engine), measure_probe(engine)]
    measure(between_cells=lambda cell: probes.append(measure_probe(engine)) if cell % every == every - 1 else None)
    return probes + [measure_probe(engine), measure_probe(engine)]


def probe_record(seconds: list[float], window: list[float] | None = None, instances: int = 1) -> dict:
    """What is stored for a reference or a run: its probes' seconds, the probes its level is taken from (`window`,
    default its own) and that level, their median, the cells, and the engine's instances (all loaded)."""
    seconds = [float(s) for s in seconds]
    window = seconds if window is None else [float(s) for s in window]
    if not seconds or not window or not all(np.isfinite(s) and s > 0 for s in seconds + window):
        raise ValueError(f"speed probe: seconds must be finite and > 0, got {seconds!r} (window {window!r})")
    return {"seconds": seconds, "window": window, "level_s": float(np.median(window)),
            "cells": [list(c) for c in PROBE_CELLS], "instances": int(instances)}


def run_window(probes: list[float], i: int) -> list[float]:
    """The probes a run's level is taken from: the run sat between probes[i] and probes[i + 1] (the engine's probes in
    the order taken), and one more on each side where there is one. A probe now and then reads ~15% slow for no
    reason the runs share (5 of 40 in one validation); the median of four is not moved by one."""
    return probes[max(0, i - 1):i + 3]


def write_reference(model_json, seconds: list[float], instances: int = 1) -> None:
    """Put the probes taken around the measurement of `model_json` (a cost model JSON) into its measured_by, taken
    on an engine of `instances` instances."""
    from lssim.results import atomic_write

    path = Path(model_json)
    payload = json.loads(path.read_text())
    payload.setdefault("measured_by", {})["speed_probe"] = probe_record(seconds, instances=instances)
    atomic_write(path, lambda p: Path(p).write_text(json.dumps(payload, indent=2) + "\n"))


def record_run_probes(folder, probes: list[float], i: int, instances: int = 1) -> None:
    """Put the probes around a recorded run into its meta.json (speed_probe): the engine's probes so far (an engine of
    `instances` instances), the run between probes[i] and probes[i + 1]. Called again once later probes exist, to
    widen its window."""
    from lssim.results import atomic_write

    path = Path(folder) / "meta.json"
    payload = json.loads(path.read_text())
    payload["speed_probe"] = probe_record(probes[i:i + 2], run_window(probes, i), instances)
    atomic_write(path, lambda p: Path(p).write_text(json.dumps(payload, indent=2, default=str) + "\n"))


def reference(model_json) -> dict | None:
    """The reference probe of a cost model JSON, or None (measured without one)."""
    probe = json.loads(Path(model_json).read_text()).get("measured_by", {}).get("speed_probe")
    return _checked(probe, f"{model_json}: measured_by.speed_probe") if probe is not None else None


def speed_factor(meta: dict, model_json) -> float | None:
    """How much slower the engine ran during the run (its meta.json's probes) than while `model_json` was measured
    (its reference): the median of the run's window of probes over the reference's median. None when either has no
    probe or they probed other cells or engines of other sizes."""
    ref = reference(model_json)
    run = meta.get("speed_probe")
    if ref is None or run is None:
        return None
    run = _checked(run, "meta.json: speed_probe")
    if run["cells"] != ref["cells"] or run["instances"] != ref["instances"]:
        return None
    return run["level_s"] / ref["level_s"]


def _checked(probe, where: str) -> dict:
    if not isinstance(probe, dict) or "cells" not in probe or "seconds" not in probe:
        raise ValueError(f"{where}: expected {{seconds, window, level_s, cells}}, got {probe!r}")
    try:
        return probe_record(probe["seconds"], probe.get("window"), probe.get("instances", 1)) | {"cells": probe["cells"]}
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None


__all__ = ["PROBE_CELLS", "measure_probe", "probed_measurement", "probe_record", "run_window", "write_reference",
           "record_run_probes", "reference",
           "speed_factor"]
