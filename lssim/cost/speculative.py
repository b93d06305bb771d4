"""Speculative decoding / layer skip at small batch, as a wrapper around any cost model; the measured variant
fitted to a real engine (SpecFit, fit_speculation) and the live on/off switch a policy flips (SpeculationSwitch)."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from lssim.loop.core import Speculation
from lssim.cost.protocol import settle_iterations
from lssim.loop.cost_contracts import CostModel

__all__ = ["SpeculativeCost", "SpecFit", "SpeculationSwitch", "MeasuredSpeculation", "fit_speculation",
           "load_spec_fit", "accepted_per_draft"]


def accepted_per_draft(alpha: float, gamma: int) -> float:
    """Mean accepted tokens per draft of gamma tokens, each accepted with probability alpha until the first
    rejection: alpha (1 - alpha^gamma) / (1 - alpha) (the inverse of Speculation.alpha_from_counts)."""
    return float(gamma) if alpha >= 1.0 else alpha * (1.0 - alpha ** gamma) / (1.0 - alpha)


@dataclass(frozen=True)
class SpecFit:
    """What speculation costs and yields on one engine, measured (paper/experiments/measure_speculation.py) and fitted
    (`fit_speculation`). A speculating engine step at n running sequences costs

        (1 + overhead) * t(n * (1 + verify_weight * draft_rate * draft_len))

    (t: the base model's plain step; each drafted token verified costs like `verify_weight` more decoding sequences,
    plus a fixed `overhead` share for the proposer, the rejection sampler and the bookkeeping), and yields
    1 + draft_rate * accepted tokens per sequence (accepted per draft: from the Speculation's alpha and gamma).
    draft_rate: the share of sequence-steps whose n-gram lookup found a draft; draft_len: drafted tokens per draft.
    """

    overhead: float
    verify_weight: float
    draft_rate: float = 1.0
    draft_len: float = 4.0

    def __post_init__(self):
        for name in ("overhead", "verify_weight", "draft_len"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ValueError(f"SpecFit.{name} must be a finite number >= 0, got {v!r}")
        if not 0.0 < self.draft_rate <= 1.0:
            raise ValueError(f"SpecFit.draft_rate must be in (0, 1], got {self.draft_rate!r}")

    @classmethod
    def from_dict(cls, d: dict, where: str = "SpecFit") -> "SpecFit":
        names = {f.name for f in fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise ValueError(f"{where}: unknown keys {sorted(unknown)} (known: {sorted(names)})")
        return cls(**d)


class SpeculationSwitch:
    """Speculation's live state, shared by a policy (which writes `max_batch`) and the engine (which applies it from
    its next iteration on and hands its counters in through `counters`). max_batch 0: off; otherwise speculate while
    an instance runs at most that many sequences (never above the Speculation's own max_batch)."""

    def __init__(self, max_batch: int):
        self.max_batch = int(max_batch)
        self.counters = None  # set by an engine that counts drafts: () -> dict (real_backend VLLMEngine.spec_counters)

    def __getstate__(self):  # a checkpointed policy carries the setting, not the engine's bound method
        return {"max_batch": self.max_batch, "counters": None}

    def __repr__(self) -> str:
        return f"SpeculationSwitch(max_batch={self.max_batch})"


@dataclass(slots=True, frozen=True)
class MeasuredSpeculation(Speculation):
    """A Speculation with what a real engine measured (`fit`: priced by SpeculativeCost with it) and, for a policy
    that turns speculation on and off while it runs, its live `switch` (not part of equality: two runs asking for
    the same speculation ask the same engine)."""

    fit: SpecFit | None = None
    switch: SpeculationSwitch | None = field(default=None, compare=False, hash=False, repr=False)

    def __post_init__(self):
        Speculation.__post_init__(self)
        if self.fit is not None and not isinstance(self.fit, SpecFit):
            raise ValueError(f"MeasuredSpeculation.fit must be a SpecFit or None, got {self.fit!r}")
        if self.fit is not None and self.method == "layer_skip":
            raise ValueError("a measured speculation fit is for the lossless methods (ngram, draft), not layer_skip")


def load_spec_fit(path) -> tuple[SpecFit, dict]:
    """The SpecFit and the measured figures of a speculation profile (real_backend/data/speculation_cpu.json)."""
    try:
        d = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot read the speculation profile {path}: {e}") from e
    if d.get("kind") != "speculation_profile" or "fit" not in d:
        raise ValueError(f"{path} is not a fitted speculation profile (kind 'speculation_profile' with a 'fit'; "
                         f"made by python -m paper.experiments.measure_speculation, fitted by lssim.cost.speculative.fit_speculation)")
    return SpecFit.from_dict(d["fit"]["params"], where=f"{path} fit.params"), d


class SpeculativeCost(CostModel):
    """A cost model with speculation (lssim.loop.core.Speculation) applied while ``n_seqs <= max_batch``.

    Speculation changes the time per generated token by a factor that depends on the running batch only,
    ``factor(n)``; within a span ``n`` is constant, so a span of ``k`` iterations costs exactly
    ``factor(n) * base.decode_time(n, ctx, k)`` (an "iteration" stays one generated token per sequence, now
    at the expected speculative cost) and ``iterations_within`` inverts it exactly.

    Lossless methods (ngram, draft), per generated token, relative to plain decoding at batch ``n``:

        factor(n) = (1 - alpha) (gamma * draft_cost + verify(n)) / (1 - alpha^(gamma+1))

    i.e. T_SD = (1 - alpha)(D + T)/(1 - alpha^(gamma+1)) with D = gamma * draft_cost * t(n) and
    T = verify(n) * t(n), where ``verify(n) = t(n*(gamma+1)) / t(n)``, ``t(m) = base.decode_time(m, 0, 1)``:
    verifying gamma+1 tokens for each of n sequences is priced as one iteration of n*(gamma+1) sequences that
    reads the weights once. It is ~1 while the model is memory-bound and grows to gamma+1 once compute-bound:
    why speculation pays only at small batch. This idealized engine does not speculate where it would be slower
    (TLT's adaptive engine picks "no speculation" for such batches), so the factor applied is min(1, factor).

    Measured (the Speculation is a MeasuredSpeculation with a `fit`, SpecFit): the engine's own step costs, fitted
    to paper/experiments/measure_speculation.py's per-step measurements of vLLM,

        factor(n) = (1 + overhead) t(n (1 + verify_weight * draft_rate * draft_len)) / ((1 + draft_rate * a) t(n))

    with a = accepted_per_draft(alpha, gamma); t at fractional batch sizes interpolated linearly. Not capped at 1:
    vLLM speculates where it is slower too (measured on this CPU: slower at every batch size), and a policy
    that avoids that (policies/tlt.py) does so by switching it off.

    A live switch (MeasuredSpeculation.switch, SpeculationSwitch) turns speculation off above its max_batch
    (0: everywhere) from the next priced span on.

    layer_skip: factor(n) = layer_fraction (lossy, no verification).

    The factor is made non-decreasing in ``n`` (a running maximum, which leaves it alone where it already grows
    with ``n``, as it does for the cost models here), so ``decode_time`` stays non-decreasing in ``n_seqs``
    below the threshold and the lower bound (lssim.sim.bounds) stays valid when priced with this model.
    """

    def __init__(self, base: CostModel, speculation) -> None:
        self.base, self.speculation = base, speculation
        spec = speculation
        self.max_batch = spec.max_batch
        measured = isinstance(spec, MeasuredSpeculation)  # a plain Speculation has neither a fit nor a live switch
        self.fit = spec.fit if measured else None
        self.switch = spec.switch if measured else None
        factors = [1.0]  # index 0 unused (an idle instance decodes nothing)
        for n in range(1, spec.max_batch + 1):
            f = self._raw_factor(n)
            if self.fit is None:
                f = min(1.0, f)
            factors.append(max(f, factors[-1] if n > 1 else 0.0))
        self._factors = factors
        self.name = f"{base.name}+{spec.method}" + ("(measured)" if self.fit is not None else "")

    def _t(self, m: float) -> float:
        """The base model's plain iteration at zero context for m sequences, linear between whole batch sizes."""
        lo = max(1, int(math.floor(m)))
        t_lo = self.base.decode_time(lo, 0, 1)
        if m <= lo:
            return t_lo
        return t_lo + (m - lo) * (self.base.decode_time(lo + 1, 0, 1) - t_lo)

    def _raw_factor(self, n: int) -> float:
        spec, fit = self.speculation, self.fit
        if not spec.lossless:
            return spec.layer_fraction
        if fit is None:
            verify = self._t(n * (spec.gamma + 1)) / self._t(n)
            return (spec.gamma * spec.draft_cost + verify) / spec.tokens_per_verification()
        accepted = min(accepted_per_draft(spec.alpha, spec.gamma), fit.draft_len)
        step = (1.0 + fit.overhead) * self._t(n * (1.0 + fit.verify_weight * fit.draft_rate * fit.draft_len))
        step += spec.gamma * spec.draft_cost * self._t(n)
        return step / ((1.0 + fit.draft_rate * accepted) * self._t(n))

    def factor(self, n_seqs: int) -> float:
        """Time per generated token with speculation over time without, at ``n_seqs`` running sequences (1.0 where
        it is off: above max_batch, or above the live switch's)."""
        if not 0 < n_seqs <= self.max_batch:
            return 1.0
        if self.switch is not None and n_seqs > self.switch.max_batch:
            return 1.0
        return self._factors[n_seqs]

    def decode_time(self, n_seqs: int, ctx_tokens: float, n_iters: int) -> float:
        return self.factor(n_seqs) * self.base.decode_time(n_seqs, ctx_tokens, n_iters)

    def iterations_within(self, n_seqs: int, ctx_tokens: float, seconds: float) -> int:
        f = self.factor(n_seqs)
        if f == 1.0:
            return self.base.iterations_within(n_seqs, ctx_tokens, seconds)
        if seconds <= 0.0:
            return 0
        k = self.base.iterations_within(n_seqs, ctx_tokens, seconds / f)
        # the division may round either way: settle against the forward formula
        return settle_iterations(self.decode_time, n_seqs, ctx_tokens, seconds, k)

    def prefill_time(self, n_tokens: int) -> float:
        return self.base.prefill_time(n_tokens)

    def departure_time(self, n_leaving: int) -> float:
        return self.base.departure_time(n_leaving)

    def abort_time(self, n_aborted: int) -> float:
        return self.base.abort_time(n_aborted)

    def resume_time(self, n_resumed: int) -> float:
        return self.base.resume_time(n_resumed)

    def work_time(self, tokens: float, context_reads: float, max_num_seqs: int) -> float:
        # every iteration costs at least the smallest factor times its plain cost
        return min(self._factors[1:] + [1.0]) * self.base.work_time(tokens, context_reads, max_num_seqs)

    def describe(self) -> dict:
        spec = {f.name: getattr(self.speculation, f.name) for f in fields(self.speculation) if f.name != "switch"}
        if self.fit is not None:
            spec["fit"] = asdict(self.fit)
        return {"kind": "speculative", "name": self.name, "base": self.base.describe(), "speculation": spec,
                "factor": {n: self.factor(n) for n in sorted({1, 8, 16, self.max_batch}) if n <= self.max_batch}}

    def __repr__(self) -> str:
        return f"SpeculativeCost({self.base!r}, {self.speculation!r})"



# -- fitting the measured model ------------------------------------------------------------------------------------
def _decode_only(iterations):
    """Engine steps that only decoded: no prompt tokens, not a cell's first (its time includes the prefill)."""
    it = iterations
    return it[(it["prompt_tokens"] == 0) & (it["step_index"] > 0) & (it["running"] > 0)]


def measured_acceptance(iterations, gamma: int) -> dict:
    """The proposer's figures over the speculating decode steps: draft_rate (drafts per sequence-step), draft_len
    (drafted tokens per draft), accepted_per_draft, and alpha (Speculation.alpha_from_counts)."""
    on = _decode_only(iterations)
    on = on[on["mode"] == "on"]
    drafts, seqsteps = float(on["drafts"].sum()), float(on["running"].sum())
    if drafts == 0 or seqsteps == 0:
        raise ValueError("no drafts in the measured speculating steps: nothing to fit the acceptance to")
    accepted = float(on["accepted_tokens"].sum())
    return {"draft_rate": min(1.0, drafts / seqsteps), "draft_len": float(on["draft_tokens"].sum()) / drafts,
            "accepted_per_draft": accepted / drafts,
            "alpha": Speculation.alpha_from_counts(drafts, accepted, gamma)}


def step_ratios(iterations):
    """Per running batch n: the median speculating step's seconds over the median plain step's, and how many
    steps of each it rests on (n with fewer than 3 of either are left out). From the "alt" cells when there are
    (speculation switched on and off every few steps of one batch: both kinds under the same load, a step
    speculating when it verified drafted tokens), else the "on" cells' steps against the "off" cells'."""
    import pandas as pd

    d = _decode_only(iterations)
    alt = d[d["mode"] == "alt"]
    rows = _ratio_rows(alt, alt["draft_tokens"].gt(0).map({True: "on", False: "off"}))
    if not rows:  # no alt cells, or none with both kinds of steps at one batch size
        rows = _ratio_rows(d, d["mode"])
    return pd.DataFrame(rows, columns=["n", "ratio", "weight"])


def _ratio_rows(d, kind) -> list[dict]:
    rows = []
    for n, g in d.groupby("running"):
        on, off = g.loc[kind[g.index] == "on", "seconds"], g.loc[kind[g.index] == "off", "seconds"]
        if len(on) >= 3 and len(off) >= 3:
            rows.append({"n": int(n), "ratio": float(on.median() / off.median()), "weight": min(len(on), len(off))})
    return rows


def _fit_step_cost(ratios, base: CostModel, draft_rate: float, draft_len: float) -> tuple[float, float]:
    """(overhead, verify_weight) minimizing the weighted squared log error of the speculating step's cost over the
    plain one's: (1 + overhead) t(n (1 + w * draft_rate * draft_len)) / t(n). w on a grid, overhead in closed form
    (the weighted mean log residual) for each."""
    import numpy as np

    if len(ratios) == 0:
        raise ValueError("no running batch size with enough speculating and plain steps to fit the step cost to")
    probe = SpeculativeCost(base, Speculation(max_batch=1))  # only for its interpolated t(m)
    n, logr, wt = ratios["n"].to_numpy(), np.log(ratios["ratio"].to_numpy(float)), np.sqrt(ratios["weight"].to_numpy(float))
    best = None
    for w in np.linspace(0.0, 3.0, 301):
        shape = np.log([probe._t(k * (1.0 + w * draft_rate * draft_len)) / probe._t(k) for k in n])
        log_o = max(0.0, float(np.average(logr - shape, weights=wt)))
        err = float(np.average((logr - shape - log_o) ** 2, weights=wt))
        if best is None or err < best[0]:
            best = (err, math.expm1(log_o), float(w))
    return best[1], best[2]


def predicted_speedup(cost: SpeculativeCost, lengths, prompt_len: int = 7) -> float:
    """A batch of responses of these lengths submitted at once, plain over speculating time as the simulator prices
    it: the same prefill and departures, then each iteration at the running batch (plain or speculating)."""
    import numpy as np

    lengths = np.sort(np.asarray(lengths, dtype=int))
    base, n0 = cost.base, len(lengths)
    plain = spec = base.prefill_time(n0 * prompt_len) + sum(base.departure_time(1) for _ in lengths)
    done = 0
    for i, length in enumerate(lengths):  # between two finishes the batch runs n = n0 - i sequences
        k = int(length) - done
        if k > 0:
            n, ctx = n0 - i, (n0 - i) * (prompt_len + done)
            plain += base.decode_time(n, ctx, k)
            spec += cost.decode_time(n, ctx, k)
            done = int(length)
    return plain / spec


def _leave_one_batch_out(ratios, base: CostModel, acc: dict) -> dict:
    """The step-cost model's error on each running batch size it was not fitted on: fitted to the others, its
    speculating-over-plain step ratio at the one left out against the measured (percent)."""
    import numpy as np

    probe = SpeculativeCost(base, Speculation(max_batch=1))
    rows = []
    for i, row in ratios.iterrows():
        rest = ratios.drop(index=i)
        if len(rest) < 2:
            continue
        overhead, w = _fit_step_cost(rest, base, acc["draft_rate"], acc["draft_len"])
        n = int(row["n"])
        predicted = (1 + overhead) * probe._t(n * (1 + w * acc["draft_rate"] * acc["draft_len"])) / probe._t(n)
        rows.append({"n": n, "measured": float(row["ratio"]), "predicted": float(predicted), "weight": int(row["weight"]),
                     "error_pct": float(100 * (predicted / row["ratio"] - 1))})
    err = np.abs([r["error_pct"] for r in rows])
    return {"points": rows, "median_abs_pct": float(np.median(err)) if len(rows) else None,
            "p90_abs_pct": float(np.percentile(err, 90)) if len(rows) else None}


def fit_speculation(cells, iterations, base: CostModel, gamma: int, train=None) -> tuple[SpecFit, dict]:
    """Fit a SpecFit to measure_speculation.py's frames; `train` (cell ids) fits on those cells only. Returns the fit
    and what it rests on: the acceptance figures, the step ratios, and per cell not in `train` (all if None) the
    measured and predicted speedup."""
    import numpy as np

    it = iterations if train is None else iterations[iterations["cell"].isin(train)]
    acc = measured_acceptance(it, gamma)
    ratios = step_ratios(it)
    overhead, weight = _fit_step_cost(ratios, base, acc["draft_rate"], acc["draft_len"])
    fit = SpecFit(overhead=overhead, verify_weight=weight, draft_rate=acc["draft_rate"], draft_len=acc["draft_len"])
    test = cells if train is None else cells[~cells["cell"].isin(train)]
    rows = []
    for cell, g in test.groupby("cell"):
        on, off = g[g["mode"] == "on"].iloc[0], g[g["mode"] == "off"].iloc[0]
        b = int(on["batch"])
        cost = SpeculativeCost(base, MeasuredSpeculation(alpha=acc["alpha"], gamma=gamma, max_batch=max(b, 1), fit=fit))
        rows.append({"cell": int(cell), "batch": b, "measured": float(off["seconds"] / on["seconds"]),
                     "predicted": predicted_speedup(cost, list(on["lengths"]))})
    errors = np.array([r["predicted"] - r["measured"] for r in rows]) * 100
    return fit, {**acc, "ratios": ratios.to_dict(orient="records"), "cells": rows,
                 "step_ratio_held_out": _leave_one_batch_out(ratios, base, acc),
                 "speedup_error_points": {"median_abs": float(np.median(np.abs(errors))) if len(rows) else None,
                                          "max_abs": float(np.max(np.abs(errors))) if len(rows) else None}}
