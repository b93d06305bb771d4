"""What every training-cost model shares: a step's seconds by phase (TrainPhases), the checks on its inputs, the
real trainer's micro-batch packing, and reading a model's JSON file. The models are lssim.sim.training (analytic,
scaled, the loader) and lssim.sim.train_profiled (fitted on this machine)."""

from __future__ import annotations

import json
import math
import numbers
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["PHASES", "TrainPhases", "check_lengths", "check_devices", "pack_padded", "padded_shapes", "read_train_cost_file"]

PHASES = ("logprob", "reference", "update", "sync", "switch")


@dataclass(frozen=True)
class TrainPhases:
    """Seconds of one training step, phase by phase."""

    logprob: float
    reference: float
    update: float
    sync: float
    switch: float

    def __post_init__(self):
        for name in PHASES:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 <= value < math.inf:
                raise ValueError(f"TrainPhases.{name} must be a finite number >= 0, got {value!r}")

    @property
    def total(self) -> float:
        return self.logprob + self.reference + self.update + self.sync + self.switch

    def as_metrics(self) -> dict:
        """The step-record keys: logprob_seconds, reference_seconds, update_seconds, sync_seconds, switch_seconds."""
        return {f"{name}_seconds": float(getattr(self, name)) for name in PHASES}

    @classmethod
    def zero(cls) -> "TrainPhases":
        return cls(0.0, 0.0, 0.0, 0.0, 0.0)


@dataclass(frozen=True)
class StreamedUpdate:
    """One step's update when its groups stream into it one by one (hybrid: RLinf's pipelined mode, the real
    trainer's `feed`): each piece's forward seconds (log-prob recompute, reference pass) and update seconds (forward +
    backward) over its own sequences alone, and `rest`, the seconds left once every piece is in (the step's fixed
    work, its optimizer steps). Each piece pays its own micro-batches, unpadded by the others'."""

    forward: np.ndarray
    update: np.ndarray
    rest: float

    @property
    def pieces(self) -> np.ndarray:
        return self.forward + self.update

    def scaled(self, forward: float, update: float, rest: float) -> "StreamedUpdate":
        return StreamedUpdate(self.forward * forward, self.update * update, self.rest * rest)


def check_lengths(seq_lens, prompt_lens=None) -> tuple[np.ndarray, np.ndarray]:
    """Integer arrays of equal length with 0 <= prompt_len <= seq_len and seq_len >= 1; ValueError otherwise."""
    seq = np.asarray(seq_lens)
    prompt = np.zeros_like(seq) if prompt_lens is None else np.asarray(prompt_lens)
    if seq.ndim != 1 or prompt.shape != seq.shape:
        raise ValueError(f"seq_lens and prompt_lens must be 1-d arrays of one length, got shapes {seq.shape} and {prompt.shape}")
    if len(seq) and not (np.issubdtype(seq.dtype, np.integer) and np.issubdtype(prompt.dtype, np.integer)):
        raise ValueError("seq_lens and prompt_lens must hold integer token counts")
    seq, prompt = seq.astype(np.int64), prompt.astype(np.int64)
    if len(seq) and (seq.min() < 1 or prompt.min() < 0 or (prompt > seq).any()):
        raise ValueError("need seq_len >= 1 and 0 <= prompt_len <= seq_len for every sequence")
    return seq, prompt


def check_devices(n_devices) -> int:
    if isinstance(n_devices, bool) or not isinstance(n_devices, numbers.Integral) or n_devices < 1:
        raise ValueError(f"n_devices must be an int >= 1, got {n_devices!r}")
    return int(n_devices)


def pack_padded(lengths, max_tokens: int) -> list[np.ndarray]:
    """real_backend's GRPOTrainer micro-batches: sequences sorted by length (stable), filled greedily while
    (count + 1) x the longest stays within ``max_tokens`` padded tokens; one longer than that goes alone.
    Returns each micro-batch's indices into ``lengths``."""
    lengths = np.asarray(lengths, dtype=np.int64)
    out, current = [], []
    for i in np.argsort(lengths, kind="stable"):
        if current and (len(current) + 1) * int(lengths[i]) > max_tokens:  # sorted: lengths[i] is the longest
            out.append(np.array(current, dtype=np.int64))
            current = []
        current.append(int(i))
    if current:
        out.append(np.array(current, dtype=np.int64))
    return out


def padded_shapes(lengths, max_tokens: int) -> np.ndarray:
    """(k, 2) array of (sequences, padded length) for each micro-batch of :func:`pack_padded`."""
    lengths = np.asarray(lengths, dtype=np.int64)
    batches = pack_padded(lengths, max_tokens)
    return np.array([(len(b), int(lengths[b].max())) for b in batches], dtype=np.int64).reshape(-1, 2)


def read_train_cost_file(path) -> dict:
    """A training-cost JSON file's contents (lssim.sim.training.load_train_cost reads its kind); ValueError naming the
    file if it is missing or not JSON."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"trainer profile {path} does not exist (make one with "
                         f"`python -m real_backend.profile_trainer --out {path}`)")
    try:
        payload = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from None
    return payload
