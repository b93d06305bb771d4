"""ProfiledTrainCost: the training phase fitted to measurements of real_backend's GRPOTrainer on this machine.

Made by ``python -m real_backend.profile_trainer --out real_backend/data/profile_trainer_cpu.json``, which times the
trainer's own phases (its ``logprob_seconds`` / ``update_seconds`` metrics, and ``VLLMEngine.update_weights``)
over a grid of batch sizes x sequence lengths and fits, with non-negative least squares on relative error:

    logprob  = sum over micro-batches of  l0 + lB*B + l1*B*T + l2*B*T^2
    update   = k0 + o0 per optimizer step + sum over micro-batches of  u0 + uB*B + u1*B*T + u2*B*T^2
    sync     = s0 per weight push

where a micro-batch holds B sequences padded to T tokens, packed exactly as the trainer packs them
(lssim.sim.training.pack_padded: sorted by length, at most ``micro_batch_tokens`` padded tokens); the T^2 term is
attention. The trainer pads, so unlike verl's packed model the padding is paid here. Loaded through
``ProfiledTrainCost.from_json`` or ``lssim.sim.training.load_train_cost``.
"""

from __future__ import annotations

import json
import math
import numbers
from dataclasses import dataclass, field, fields
from pathlib import Path

import numpy as np

from lssim.loop.cost_contracts import TrainCostModel
from lssim.sim.train_batches import (StreamedUpdate, TrainPhases, check_devices, check_lengths, pack_padded,
                                     read_train_cost_file)
from lssim.cost.fitting import nnls_relative

LOGPROB_TERMS = ("l0", "lB", "l1", "l2")
UPDATE_TERMS = ("u0", "uB", "u1", "u2", "o0", "k0")
COEFFICIENTS = LOGPROB_TERMS + UPDATE_TERMS + ("s0",)
FORMS = {
    "micro_batch": "B sequences padded to T tokens, packed as lssim.sim.training.pack_padded (the trainer's rule)",
    "logprob": "sum over micro-batches of l0 + lB*B + l1*B*T + l2*B*T^2 (0 unless the trainer recomputes log-probs)",
    "update": "k0 + o0 x optimizer steps + sum over each mini-batch's micro-batches of u0 + uB*B + u1*B*T + u2*B*T^2",
    "sync": "s0 per push of the weights into the engine (one model: its size is fixed)",
    "switch": "0: on this machine the trainer and vLLM share host memory, nothing is offloaded or reloaded",
    "devices": "n > 1: data-parallel replicas, each given every n-th sequence by length (no all-reduce measured)",
}
_TRAINER_KEYS = ("micro_batch_tokens", "mini_batches", "recompute_logprobs")


@dataclass(frozen=True)
class ProfiledTrainCost(TrainCostModel):
    """Coefficients (seconds) of the forms in FORMS, and the trainer settings they are used with."""

    l0: float
    lB: float
    l1: float
    l2: float
    u0: float
    uB: float
    u1: float
    u2: float
    o0: float
    k0: float
    s0: float
    micro_batch_tokens: int = 16384
    mini_batches: int = 1
    recompute_logprobs: bool = False  # as GRPOTrainer's default: it takes vLLM's behaviour log-probs
    fit_stats: dict | None = field(default=None, compare=False, hash=False)
    meta: dict | None = field(default=None, compare=False, hash=False)

    def __post_init__(self):
        for name in COEFFICIENTS:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 <= value < math.inf:
                raise ValueError(f"ProfiledTrainCost coefficient {name} must be finite and >= 0, got {value!r}")
        for name in ("micro_batch_tokens", "mini_batches"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
                raise ValueError(f"ProfiledTrainCost.{name} must be an int >= 1, got {value!r}")
        if not isinstance(self.recompute_logprobs, bool):
            raise ValueError(f"ProfiledTrainCost.recompute_logprobs must be a bool, got {self.recompute_logprobs!r}")
        if self.u0 + self.uB + self.u1 + self.u2 <= 0:
            raise ValueError("ProfiledTrainCost: u0 + uB + u1 + u2 must be > 0 (a micro-batch's update takes time)")

    # -- the forms -----------------------------------------------------------------------------------

    def _micro(self, shapes: np.ndarray, terms: tuple[str, ...]) -> float:
        if not len(shapes):
            return 0.0
        B, T = shapes[:, 0].astype(float), shapes[:, 1].astype(float)
        c0, cB, c1, c2 = (getattr(self, t) for t in terms)
        return float(np.sum(c0 + cB * B + c1 * B * T + c2 * B * T * T))

    def step_seconds(self, lengths, mini_batches: int | None = None, micro_batch_tokens: int | None = None) -> tuple[float, float]:
        """(logprob, update) seconds of one trainer step over these sequences on one device, mini-batches split in
        the given order (the trainer splits at random; for equal lengths it makes no difference)."""
        lengths = np.asarray(lengths, dtype=np.int64)
        if not len(lengths):
            return 0.0, 0.0
        mbt = micro_batch_tokens or self.micro_batch_tokens
        features = step_features(lengths, mini_batches or self.mini_batches, mbt)
        logprob = self._priced(features, LOGPROB_TERMS) if self.recompute_logprobs else 0.0
        return logprob, self._priced(features, UPDATE_TERMS)

    def _priced(self, features: dict[str, float], terms: tuple[str, ...]) -> float:
        """The seconds of `terms` over step_features' sums: each coefficient times its feature."""
        return float(sum(getattr(self, t) * features[t] for t in terms))

    @staticmethod
    def _share(seq: np.ndarray, n: int) -> np.ndarray:
        """The busiest replica's sequences: every n-th by length, from the longest (it dominates the others')."""
        order = np.argsort(-seq, kind="stable")
        share = seq[order[::min(n, len(seq))]]
        if len(share) > 1:  # the trainer splits mini-batches at random: a fixed shuffle stands for that
            share = share[np.random.default_rng(0).permutation(len(share))]
        return share

    # -- TrainCostModel --------------------------------------------------------------------------------

    def phases(self, seq_lens, prompt_lens, n_devices: int, *, collocated: bool) -> TrainPhases:
        seq, _ = check_lengths(seq_lens, prompt_lens)
        n = check_devices(n_devices)
        if not len(seq):
            return TrainPhases.zero()
        logprob, update = self.step_seconds(self._share(seq, n))
        return TrainPhases(logprob, 0.0, update, self.s0, 0.0)

    def micro_batch_seconds(self, seq_lens, n_devices: int = 1, *, forward_only: bool = False) -> float:
        seq, _ = check_lengths(seq_lens)
        n = check_devices(n_devices)
        if not len(seq):
            return 0.0
        share = self._share(seq, n)
        shape = np.array([[len(share), int(share.max())]])
        return self._micro(shape, LOGPROB_TERMS if forward_only else UPDATE_TERMS[:4])

    def optimizer_step_seconds(self, n_devices: int = 1) -> float:
        check_devices(n_devices)
        return self.o0

    def streamed_update(self, pieces, n_devices: int = 1) -> StreamedUpdate:
        """Each piece packed into micro-batches of its own (the trainer's `feed` runs one group's forward and backward
        on its own): their micro-batch terms, log-prob ones where the trainer recomputes; the rest is the step's
        fixed k0 and its optimizer steps."""
        n = check_devices(n_devices)
        forward, update = np.zeros(len(pieces)), np.zeros(len(pieces))
        for i, piece in enumerate(pieces):
            seq, _ = check_lengths(piece)
            if not len(seq):
                continue
            features = step_features(self._share(seq, n), 1, self.micro_batch_tokens)
            if self.recompute_logprobs:
                forward[i] = self._priced(features, LOGPROB_TERMS)
            update[i] = self._priced(features, UPDATE_TERMS[:4])  # the micro-batches' terms: no k0, no optimizer step
        return StreamedUpdate(forward, update, self.k0 + self.o0 * self.mini_batches)

    # -- fit -------------------------------------------------------------------------------------------

    @classmethod
    def fit(cls, measurements, *, micro_batch_tokens: int = 16384, mini_batches: int = 1, meta: dict | None = None,
            source: str = "measurements", clock: str = "cpu") -> "ProfiledTrainCost":
        """Fit to the rows of ``measurements`` (a frame as real_backend.profile_trainer writes it) whose split is
        "fit", on the trainer's CPU time (``clock="cpu"``: what a phase costs on an idle core; the shared VM's wall
        time adds waiting) or wall time; s0 is the median push (wall: the push runs in vLLM's processes). The error
        of every row against both clocks, fit and held out, goes into fit_stats."""
        steps, syncs = split_measurements(measurements, source)
        train = steps[steps["split"] == "fit"]
        feats = [step_features(r.lengths, int(r.mini_batches), int(r.micro_batch_tokens)) for r in train.itertuples()]
        coef = {}
        for terms, col in zip((LOGPROB_TERMS, UPDATE_TERMS), CLOCKS[clock]):
            X = np.array([[f[t] for t in terms] for f in feats], dtype=float)
            coef.update(zip(terms, nnls_relative(X, train[col].to_numpy(float), f"{source}: {col}")))
        fit_syncs = syncs[syncs["split"] == "fit"]["sync_seconds"].to_numpy(float)
        if not len(fit_syncs):
            raise ValueError(f"{source}: no sync measurements (rows with kind='sync') to fit s0")
        coef["s0"] = float(np.median(fit_syncs))
        model = cls(**coef, micro_batch_tokens=micro_batch_tokens, mini_batches=mini_batches, meta=meta)
        stats = {"fitted_on": clock, **{c: model.error(measurements, source, clock=c) for c in CLOCKS}}
        stats["sync"] = ape_summary(np.full(len(syncs), model.s0), syncs["sync_seconds"].to_numpy(float))
        return _with(model, fit_stats=stats)

    def error(self, measurements, source: str = "measurements", clock: str = "cpu") -> dict:
        """Absolute percentage error of each phase's prediction against each measured step (CPU or wall clock),
        by split ("fit", "held_out")."""
        steps, _ = split_measurements(measurements, source)
        model = self if self.recompute_logprobs else _with(self, recompute_logprobs=True)
        pred = np.array([model.step_seconds(r.lengths, int(r.mini_batches), int(r.micro_batch_tokens))
                         for r in steps.itertuples()]).reshape(-1, 2)
        out, (lcol, ucol) = {}, CLOCKS[clock]
        for split in ("fit", "held_out"):
            rows = (steps["split"] == split).to_numpy()
            if not rows.any():
                continue
            lp, up = pred[rows, 0], pred[rows, 1]
            ml, mu = steps.loc[rows, lcol].to_numpy(float), steps.loc[rows, ucol].to_numpy(float)
            out[split] = {"logprob": ape_summary(lp, ml), "update": ape_summary(up, mu),
                          "logprob_plus_update": ape_summary(lp + up, ml + mu)}
        return out

    # -- persistence -----------------------------------------------------------------------------------

    def to_dict(self) -> dict:
        return {"kind": "ProfiledTrainCost", "version": 1, "units": "seconds", "forms": dict(FORMS),
                "coefficients": {c: getattr(self, c) for c in COEFFICIENTS},
                "trainer": {k: getattr(self, k) for k in _TRAINER_KEYS},
                "fit_error": self.fit_stats, "measured_by": self.meta}

    def to_json(self, path) -> None:
        """Written beside ``path`` and renamed into place: never half a file."""
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(self.to_dict(), indent=2) + "\n")
        tmp.replace(path)

    @classmethod
    def from_dict(cls, payload: dict, source: str = "ProfiledTrainCost", **overrides) -> "ProfiledTrainCost":
        """``overrides``: trainer settings to use the fit with (micro_batch_tokens, mini_batches, recompute_logprobs)."""
        if not isinstance(payload, dict) or payload.get("kind") != "ProfiledTrainCost":
            raise ValueError(f"{source}: not a trainer profile (missing kind='ProfiledTrainCost')")
        if payload.get("version") != 1:
            raise ValueError(f"{source}: unsupported version {payload.get('version')!r} (this lssim reads version 1)")
        unknown = sorted(set(payload) - {"kind", "version", "units", "forms", "coefficients", "trainer", "fit_error", "measured_by"})
        if unknown:
            raise ValueError(f"{source}: unknown keys {unknown}")
        if payload.get("forms", FORMS) != FORMS:
            raise ValueError(f"{source}: its forms differ from this lssim's (refit with `python -m real_backend.profile_trainer`)")
        coef, trainer = payload.get("coefficients"), payload.get("trainer") or {}
        if not isinstance(coef, dict) or set(coef) != set(COEFFICIENTS):
            have = sorted(coef) if isinstance(coef, dict) else coef
            raise ValueError(f"{source}: 'coefficients' must hold exactly {list(COEFFICIENTS)}, got {have}")
        bad = sorted(set(trainer) - set(_TRAINER_KEYS)) + sorted(set(overrides) - set(_TRAINER_KEYS))
        if bad:
            raise ValueError(f"{source}: unknown trainer settings {bad}; known: {list(_TRAINER_KEYS)}")
        try:
            return cls(**coef, **{**trainer, **overrides}, fit_stats=payload.get("fit_error"), meta=payload.get("measured_by"))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{source}: {exc}") from None

    @classmethod
    def from_json(cls, path, **overrides) -> "ProfiledTrainCost":
        payload = read_train_cost_file(path)
        kind = payload.get("kind") if isinstance(payload, dict) else None
        if kind == "AnalyticTrainCost":
            raise ValueError(f"{path}: an analytic model, not a trainer profile")
        if kind != "ProfiledTrainCost":
            raise ValueError(f"{path}: not a training-cost file (kind must be 'ProfiledTrainCost' or 'AnalyticTrainCost', "
                             f"got {kind!r})")
        model = cls.from_dict(payload, str(path))
        return _with(model, **overrides) if overrides else model

    def describe(self) -> dict:
        return {"kind": "profiled", "forms": dict(FORMS), "coefficients": {c: getattr(self, c) for c in COEFFICIENTS},
                "coefficients_source": "fitted (NNLS on relative error) to the measurements named in measured_by",
                "trainer": {k: getattr(self, k) for k in _TRAINER_KEYS}, "fit_error": self.fit_stats,
                "measured_by": self.meta}


def _with(model: ProfiledTrainCost, **changes) -> ProfiledTrainCost:
    bad = sorted(set(changes) - set(_TRAINER_KEYS) - {"fit_stats"})
    if bad:
        raise ValueError(f"unknown trainer settings {bad}; known: {list(_TRAINER_KEYS)}")
    values = {f.name: getattr(model, f.name) for f in fields(model)}
    return ProfiledTrainCost(**{**values, **changes})


def step_features(lengths, mini_batches: int, micro_batch_tokens: int) -> dict[str, float]:
    """The sums the forms multiply: logprob over the whole batch, update per mini-batch (split in order)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    f = dict.fromkeys(LOGPROB_TERMS + UPDATE_TERMS, 0.0)
    if not len(lengths):
        return f
    for terms, groups in ((LOGPROB_TERMS, [lengths]),
                          (UPDATE_TERMS, [s for s in np.array_split(lengths, min(mini_batches, len(lengths))) if len(s)])):
        for g in groups:
            for b in pack_padded(g, micro_batch_tokens):
                B, T = float(len(b)), float(g[b].max())
                for t, v in zip(terms[:4], (1.0, B, B * T, B * T * T)):
                    f[t] += v
    f["o0"] = float(min(mini_batches, len(lengths)))
    f["k0"] = 1.0
    return f


def ape_summary(predicted, measured) -> dict:
    """Median / p90 / max absolute percentage error (%) and the number of points."""
    ape = np.abs(np.asarray(predicted, float) - np.asarray(measured, float)) / np.asarray(measured, float) * 100.0
    return {"median_ape_pct": float(np.median(ape)), "p90_ape_pct": float(np.percentile(ape, 90)),
            "max_ape_pct": float(ape.max()), "n_points": int(len(ape))}


CLOCKS = {"cpu": ("logprob_cpu_seconds", "update_cpu_seconds"), "wall": ("logprob_seconds", "update_seconds")}
MEASUREMENT_COLUMNS = ("kind", "split", "lengths", "mini_batches", "micro_batch_tokens", "logprob_seconds",
                       "update_seconds", "logprob_cpu_seconds", "update_cpu_seconds", "sync_seconds")


def split_measurements(df, source: str):
    """(step rows, sync rows) of a measurements frame, checked: ValueError naming the column and row."""
    missing = [c for c in MEASUREMENT_COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(f"{source}: missing columns {missing}")
    bad_kind = ~df["kind"].isin(["step", "sync"])
    if bad_kind.any():
        raise ValueError(f"{source}: column 'kind' must be 'step' or 'sync' (row {int(np.flatnonzero(bad_kind)[0])})")
    bad_split = ~df["split"].isin(["fit", "held_out"])
    if bad_split.any():
        raise ValueError(f"{source}: column 'split' must be 'fit' or 'held_out' (row {int(np.flatnonzero(bad_split)[0])})")
    steps, syncs = df[df["kind"] == "step"], df[df["kind"] == "sync"]
    for col, frame in [(c, steps) for c in CLOCKS["cpu"] + CLOCKS["wall"]] + [("sync_seconds", syncs)]:
        v = frame[col].to_numpy(float)
        bad = ~(np.isfinite(v) & (v > 0))
        if bad.any():
            raise ValueError(f"{source}: column {col!r} must be finite and > 0 (row {frame.index[np.flatnonzero(bad)[0]]})")
    return steps, syncs
