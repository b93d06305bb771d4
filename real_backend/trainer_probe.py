"""The trainer's speed level, measured around every modes validation run: a fixed GRPO update timed on this host.

    probe = TrainerProbe(setup)                   # a GRPOTrainer of the run's model, with no engine
    seconds = probe.measure()                     # ~1.2 s: the median of three updates of PROBE_SEQUENCES sequences
    record_trainer_probes(run_folder, seconds, i) # the probes in order; the run sat after seconds[i]
    trainer_level(run.meta, train_cost)           # the run's probes over the trainer profile's price of that update

Why: the engine's speed probe (real_backend.speed_probe) does not tell the trainer's speed. The trainer profile is
measured once and shipped (real_backend/data/profile_trainer_cpu.json); on this 2-core VM the same update has taken
0.39 s of CPU in one hour and 0.61 s in another while the engine's probe read the opposite way (modes38 against
modes39: the collocated runs' updates at 1.1-1.3x the profile's price in the first, 0.65-0.72x in the second, the
engine probe at 1.09-1.27 and 1.08-1.11). So the trainer is probed on its own: the same update of fixed synthetic
sequences (the median of three) between every two runs, and its level is the median of the four probes nearest the
run over what the twin's trainer profile prices that update at. No reference measurement is needed: the profile's
own price is the reference.
Only the trainer's speed is taken from the probe, never anything the run trained.
File: each run's probes in its meta.json as trainer_probe.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from .speed_probe import run_window

PROBE_SEQUENCES = 20  # one step's trained sequences in the modes validation (groups of 2 here: 10 groups)
PROBE_SEED = 7
# One update's time on this host moves by +-25% from one to the next (modes40: 0.34-0.55 s for the same update
# within minutes); each probe is the median of three (about 1.2 s).
UPDATES_PER_PROBE = 3


def probe_lengths() -> list[int]:
    """The probe update's sequence lengths (prompt + response), the same every time."""
    from .profile_trainer import longtail_lengths

    return [int(n) for n in longtail_lengths(np.random.default_rng(PROBE_SEED), PROBE_SEQUENCES)]


class TrainerProbe:
    """A GRPO trainer of the run's model, with no engine, that times one fixed update when asked. Its weights move
    with every probe; an update's time does not depend on them."""

    def __init__(self, setup):
        from .profile_trainer import _Prompts
        from .trainer import GRPOTrainer

        self.trainer = GRPOTrainer(setup.model_dir, None, _Prompts(), lr=1e-6, threads=setup.trainer_threads, seed=0,
                                   process=setup.trainer_process)
        self.lengths = probe_lengths()
        self._rng = np.random.default_rng(PROBE_SEED)

    def measure(self, updates: int = UPDATES_PER_PROBE) -> float:
        """The median seconds of `updates` updates, one after another."""
        from .profile_trainer import synthetic_batch

        seconds = []
        for _ in range(updates):
            self.trainer.prompts.tokens.clear()
            batch = synthetic_batch(self._rng, self.lengths, self.trainer.prompts, int(self.trainer.model.config.vocab_size))
            t0 = time.monotonic()
            self.trainer.update(batch, 0)
            seconds.append(time.monotonic() - t0)
        return float(np.median(seconds))


def trainer_probe_record(seconds: list[float], window: list[float], lengths: list[int]) -> dict:
    """What a run's meta.json holds: its probes, the window its level is taken from, their median, the update's lengths."""
    seconds, window = [float(s) for s in seconds], [float(s) for s in window]
    if not window or not all(np.isfinite(s) and s > 0 for s in seconds + window):
        raise ValueError(f"trainer probe: seconds must be finite and > 0, got {seconds!r} (window {window!r})")
    return {"seconds": seconds, "window": window, "level_s": float(np.median(window)), "lengths": [int(n) for n in lengths]}


def record_trainer_probes(folder, probes: list[float], i: int, lengths: list[int]) -> None:
    """Put the trainer probes around a recorded run into its meta.json (trainer_probe): the run sat between probes[i]
    and probes[i + 1]. Called again once later probes exist, to widen its window (speed_probe.run_window)."""
    from lssim.results import atomic_write

    path = Path(folder) / "meta.json"
    payload = json.loads(path.read_text())
    payload["trainer_probe"] = trainer_probe_record(probes[i:i + 2], run_window(probes, i), lengths)
    atomic_write(path, lambda p: Path(p).write_text(json.dumps(payload, indent=2, default=str) + "\n"))


def trainer_level(meta: dict, train_cost) -> float | None:
    """How much slower the run's trainer ran than `train_cost` (a TrainCostModel) prices: the median of its window of
    probes over the price of the probe's update (one device, not beside a rollout). None for a run without probes."""
    from .profile_trainer import PROMPT_LEN

    probe = meta.get("trainer_probe")
    if probe is None:
        return None
    if not isinstance(probe, dict) or not {"window", "lengths"} <= set(probe):
        raise ValueError(f"meta.json: trainer_probe: expected {{seconds, window, level_s, lengths}}, got {probe!r}")
    record = trainer_probe_record(probe.get("seconds", probe["window"]), probe["window"], probe["lengths"])
    lengths = np.asarray(record["lengths"])
    phases = train_cost.phases(lengths, np.full(len(lengths), PROMPT_LEN), 1, collocated=False)
    priced = phases.logprob + phases.update
    if not priced > 0:
        raise ValueError(f"the trainer profile prices the probe's update at {priced!r} s: cannot take a level from it")
    return record["level_s"] / priced


__all__ = ["PROBE_SEQUENCES", "UPDATES_PER_PROBE", "probe_lengths", "TrainerProbe", "trainer_probe_record", "record_trainer_probes",
           "trainer_level"]
