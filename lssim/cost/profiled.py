"""The profiled cost model: a least-squares fit to per-iteration (or whole-batch) measurements of a real engine.

The model and its JSON form live here; reading and checking measurement tables, the NNLS solve and the
error summaries live in :mod:`lssim.cost.fitting`.
"""

from __future__ import annotations

import json
import math
import numbers
from pathlib import Path

from lssim.cost.fitting import DECODE_COLUMNS, PREFILL_COLUMNS, ape_summary, load_batches, load_table, nnls_relative
from lssim.loop.cost_contracts import CostModel
from lssim.cost.protocol import INF, ramp_count, settle_iterations, no_time_to_run

__all__ = ["ProfiledCostModel", "batch_features"]

_DECODE_FORM = "t_iter = c0 + c1*n_seqs + c2*ctx_tokens + c3*n_seqs^2"
_PREFILL_FORM = "t_prefill = p0 + p1*prefill_tokens (0 when prefill_tokens == 0)"
_DEPARTURE_FORM = "t_departure = f0 + f1*leaving (0 when leaving == 0): k sequences leave the batch at one iteration"
_ABORT_FORM = "t_abort = a1*aborted: the caller blocked while the serving API aborts them (not engine time)"
_RESUME_FORM = "t_resume = r1*resumed: requests resubmitted with tokens, beyond their re-prefill, before they reach the engine"
_COEFFICIENTS = ("c0", "c1", "c2", "c3", "p0", "p1", "f0", "f1")


class ProfiledCostModel(CostModel):
    """Table-driven model fitted to per-iteration measurements of a real engine (the Vidur approach).

    Per decode iteration ``t = c0 + c1*n + c2*ctx + c3*n^2``; per prefill ``t = p0 + p1*tokens``; when
    ``k`` sequences leave the batch (finish or abort) ``t = f0 + f1*k``; the caller is blocked ``a1`` seconds for each
    request it aborts (``abort_seconds``, measured apart from the batches: lssim.cost.protocol's ``abort_time``), and
    ``r1`` for each it resubmits with tokens already generated (``resume_seconds``: ``resume_time``).
    ``n`` is constant over a span and ``ctx`` ramps linearly, so a span of ``k`` iterations is
    ``k*a + c2*n*k*(k-1)/2`` with ``a`` the first iteration's time: exact, and exactly invertible.
    Coefficients are non-negative (fitted with NNLS), which makes every method monotone.
    ``c3`` (a superlinear batch term) is fitted only with ``fit(..., quadratic_n=True)``; if it is
    positive, throughput can fall at large batches (see :func:`peak_tokens_per_second`).

    Two ways to fit: :meth:`fit` to per-iteration and prefill measurements, or :meth:`fit_makespans` to the
    makespans of whole batches with known lengths, the quantity the simulator predicts: a batch's makespan
    under this model is linear in all eight coefficients (:func:`batch_features`), so NNLS fits them at once.
    """

    def __init__(
        self,
        c0: float,
        c1: float,
        c2: float,
        c3: float = 0.0,
        p0: float = 0.0,
        p1: float = 0.0,
        f0: float = 0.0,
        f1: float = 0.0,
        *,
        abort_seconds: float = 0.0,
        resume_seconds: float = 0.0,
        fit_stats: dict | None = None,
        name: str = "profiled",
    ) -> None:
        coeffs = {"c0": c0, "c1": c1, "c2": c2, "c3": c3, "p0": p0, "p1": p1, "f0": f0, "f1": f1}
        for key, value in coeffs.items():
            if isinstance(value, bool) or not (isinstance(value, numbers.Real) and 0 <= value < INF):
                raise ValueError(f"ProfiledCostModel coefficient {key} must be finite and >= 0, got {value!r}")
        if c0 + c1 + c3 <= 0:
            raise ValueError("ProfiledCostModel: c0 + c1 + c3 must be > 0 (an iteration must take time)")
        for label, value in (("abort_seconds (a1)", abort_seconds), ("resume_seconds (r1)", resume_seconds)):
            if isinstance(value, bool) or not (isinstance(value, numbers.Real) and 0 <= value < INF):
                raise ValueError(f"ProfiledCostModel {label} must be finite and >= 0, got {value!r}")
        self.c0, self.c1, self.c2, self.c3, self.p0, self.p1, self.f0, self.f1 = (float(v) for v in coeffs.values())
        self.abort_seconds, self.resume_seconds = float(abort_seconds), float(resume_seconds)
        self.fit_stats = dict(fit_stats) if fit_stats else None  # fit_error() at fit time
        self.name = name

    # -- hot path ------------------------------------------------------------------------------

    def decode_time(self, n_seqs: int, ctx_tokens: float, n_iters: int) -> float:
        if n_iters <= 0 or n_seqs <= 0:
            return 0.0
        a = self.c0 + (self.c1 + self.c3 * n_seqs) * n_seqs + self.c2 * ctx_tokens
        return n_iters * (a + self.c2 * n_seqs * (n_iters - 1) * 0.5)

    def iterations_within(self, n_seqs: int, ctx_tokens: float, seconds: float) -> int:
        if no_time_to_run(n_seqs, seconds):
            return 0
        a = self.c0 + (self.c1 + self.c3 * n_seqs) * n_seqs + self.c2 * ctx_tokens
        k = int(ramp_count(a, self.c2 * n_seqs, seconds))
        return settle_iterations(self.decode_time, n_seqs, ctx_tokens, seconds, k)

    def prefill_time(self, n_tokens: int) -> float:
        if n_tokens <= 0:
            return 0.0
        return self.p0 + self.p1 * n_tokens

    def departure_time(self, n_leaving: int) -> float:
        if n_leaving <= 0:
            return 0.0
        return self.f0 + self.f1 * n_leaving

    def abort_time(self, n_aborted: int) -> float:
        return self.abort_seconds * n_aborted if n_aborted > 0 else 0.0

    def resume_time(self, n_resumed: int) -> float:
        return self.resume_seconds * n_resumed if n_resumed > 0 else 0.0

    def work_time(self, tokens: float, context_reads: float, max_num_seqs: int) -> float:
        # Summed over I iterations with n_i sequences: c0*I + c1*T + c3*sum(n_i^2) + c2*W, and sum(n_i^2) >= T^2/I
        # (Cauchy-Schwarz); c0*I + c3*T^2/I is least at I = T*sqrt(c3/c0), held within [T/max_num_seqs, T].
        if tokens <= 0:
            return 0.0
        lo, hi = tokens / max_num_seqs, float(tokens)
        best = tokens * math.sqrt(self.c3 / self.c0) if self.c0 > 0 else hi
        iters = min(max(best, lo), hi)
        return self.c0 * iters + self.c3 * tokens * tokens / iters + self.c1 * tokens + self.c2 * context_reads

    @property
    def coefficients(self) -> dict[str, float]:
        return {k: getattr(self, k) for k in _COEFFICIENTS}

    def makespan(self, lengths, prompt_len: int) -> float:
        """Seconds from submission to the last token of a batch of requests admitted at once, one per entry
        of ``lengths`` (tokens each generates), each with a prompt of ``prompt_len``: what the simulator gives."""
        f = batch_features(lengths, prompt_len)
        return sum(getattr(self, k) * v for k, v in f.items())

    # -- fitting -------------------------------------------------------------------------------

    @classmethod
    def fit(cls, decode_df, prefill_df=None, *, quadratic_n: bool = False, name: str = "profiled") -> "ProfiledCostModel":
        """Fit to measurements. ``decode_df``: one row per decode iteration with columns
        ``n_seqs``, ``ctx_tokens``, ``seconds``; ``prefill_df`` (optional; prefill is free without
        it): columns ``prefill_tokens``, ``seconds``. Each may be a DataFrame or a path to a
        .csv/.parquet/.json file. Minimises squared *relative* error (rows weighted by 1/seconds,
        matching the percentage-error report) with non-negative coefficients (scipy NNLS).
        Raises ValueError naming the file and column on missing columns, non-finite or
        non-positive times, or too few distinct points."""
        import numpy as np

        ddf, dsrc = load_table(decode_df, DECODE_COLUMNS, "decode measurements")
        n = ddf["n_seqs"].to_numpy(float)
        ctx = ddf["ctx_tokens"].to_numpy(float)
        y = ddf["seconds"].to_numpy(float)
        columns = [np.ones_like(n), n, ctx] + ([n * n] if quadratic_n else [])
        if len(np.unique(n)) < (3 if quadratic_n else 2) or len(np.unique(ctx)) < 2:
            raise ValueError(
                f"{dsrc}: too few distinct points to fit {_DECODE_FORM}: need >= {3 if quadratic_n else 2} "
                "distinct n_seqs and >= 2 distinct ctx_tokens values"
            )
        c = nnls_relative(np.column_stack(columns), y, dsrc)
        c0, c1, c2 = c[:3]
        c3 = c[3] if quadratic_n else 0.0

        p0 = p1 = 0.0
        if prefill_df is not None:
            pdf, psrc = load_table(prefill_df, PREFILL_COLUMNS, "prefill measurements")
            tok = pdf["prefill_tokens"].to_numpy(float)
            if len(np.unique(tok)) < 2:
                raise ValueError(f"{psrc}: too few distinct points: need >= 2 distinct prefill_tokens values")
            if (tok <= 0).any():
                raise ValueError(f"{psrc}: column 'prefill_tokens' must be > 0")
            p0, p1 = nnls_relative(np.column_stack([np.ones_like(tok), tok]), pdf["seconds"].to_numpy(float), psrc)

        if c0 + c1 + c3 <= 0:
            raise ValueError(f"{dsrc}: fit gave zero time for an iteration; check the 'seconds' column units")
        model = cls(float(c0), float(c1), float(c2), float(c3), float(p0), float(p1), name=name)
        model.fit_stats = model.fit_error(ddf)
        return model

    @classmethod
    def fit_makespans(cls, batches, *, quadratic_n: bool = True, name: str = "profiled") -> "ProfiledCostModel":
        """Fit every coefficient to measured batch makespans. ``batches``: rows with ``n_seqs``, ``prompt_len``,
        ``lengths`` (the list of tokens each request generated) and ``seconds`` (submission to last token).
        Minimises squared relative error with non-negative coefficients; ``fit_stats`` is the makespan error
        (:meth:`makespan_error`). The design must vary the batch size, the prompt length and how the lengths
        spread (a batch whose requests all finish together says nothing about departures)."""
        import numpy as np

        df, src = load_batches(batches)
        terms = [k for k in _COEFFICIENTS if quadratic_n or k != "c3"]
        X = np.array([[f[k] for k in terms] for f in (batch_features(l, p) for l, p in zip(df["lengths"], df["prompt_len"]))])
        if len(np.unique(df["n_seqs"])) < 3 or len(np.unique(df["prompt_len"])) < 2:
            raise ValueError(f"{src}: too few distinct points: need >= 3 distinct n_seqs and >= 2 distinct prompt_len values")
        coef = dict(zip(terms, nnls_relative(X, df["seconds"].to_numpy(float), src)))
        if coef["c0"] + coef["c1"] + coef.get("c3", 0.0) <= 0:
            raise ValueError(f"{src}: fit gave zero time for an iteration; check the 'seconds' column units")
        model = cls(**{k: float(coef.get(k, 0.0)) for k in _COEFFICIENTS}, name=name)
        model.fit_stats = model.makespan_error(df)
        return model

    def makespan_error(self, batches) -> dict:
        """Median / p90 / max absolute percentage error (in %) of :meth:`makespan` over measured batches."""
        import numpy as np

        df, _ = load_batches(batches)
        pred = np.array([self.makespan(l, p) for l, p in zip(df["lengths"], df["prompt_len"])])
        return {**ape_summary(pred, df["seconds"].to_numpy(float)), "of": "batch makespan"}

    def fit_error(self, decode_df) -> dict:
        """Median / p90 / max absolute percentage error (in %) of the per-iteration time predicted
        for the rows of ``decode_df`` (same columns as :meth:`fit`), and the number of points."""
        ddf, _ = load_table(decode_df, DECODE_COLUMNS, "decode measurements")
        n = ddf["n_seqs"].to_numpy(float)
        y = ddf["seconds"].to_numpy(float)
        pred = self.c0 + (self.c1 + self.c3 * n) * n + self.c2 * ddf["ctx_tokens"].to_numpy(float)
        return ape_summary(pred, y)

    # -- persistence ---------------------------------------------------------------------------

    def to_json(self, path, meta: dict | None = None) -> None:
        """Write the coefficients, the functional form and the fit error to ``path``; ``meta`` (how and
        where it was measured: command, engine, machine) is kept under "measured_by"."""
        payload = {
            "kind": "ProfiledCostModel",
            "name": self.name,
            "units": "seconds",
            "decode_form": _DECODE_FORM,
            "prefill_form": _PREFILL_FORM,
            "decode_coefficients": {"c0": self.c0, "c1": self.c1, "c2": self.c2, "c3": self.c3},
            "prefill_coefficients": {"p0": self.p0, "p1": self.p1},
            "departure_form": _DEPARTURE_FORM,
            "departure_coefficients": {"f0": self.f0, "f1": self.f1},
            "abort_form": _ABORT_FORM,
            "abort_coefficients": {"a1": self.abort_seconds},
            "resume_form": _RESUME_FORM,
            "resume_coefficients": {"r1": self.resume_seconds},
            "fit_error": self.fit_stats,
            **({"measured_by": meta} if meta else {}),
        }
        Path(path).write_text(json.dumps(payload, indent=2) + "\n")

    @classmethod
    def from_json(cls, path) -> "ProfiledCostModel":
        """Read a model written by :meth:`to_json`; ValueError naming the file when it is missing or bad."""
        if not Path(path).is_file():
            raise ValueError(f"profile {path} does not exist (make one with `lssim profile --out {path}`)")
        try:
            payload = json.loads(Path(path).read_text())
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: not valid JSON ({exc})") from None
        if not isinstance(payload, dict) or payload.get("kind") != "ProfiledCostModel":
            raise ValueError(f"{path}: not a ProfiledCostModel file (missing kind='ProfiledCostModel')")
        if payload.get("decode_form", _DECODE_FORM) != _DECODE_FORM:
            raise ValueError(f"{path}: unsupported decode_form {payload.get('decode_form')!r}")
        try:
            d = payload["decode_coefficients"]
            p = payload.get("prefill_coefficients") or {"p0": 0.0, "p1": 0.0}
            f = payload.get("departure_coefficients") or {"f0": 0.0, "f1": 0.0}
            a = payload.get("abort_coefficients") or {"a1": 0.0}  # profiles measured before it: 0
            r = payload.get("resume_coefficients") or {"r1": 0.0}
            return cls(d["c0"], d["c1"], d["c2"], d.get("c3", 0.0), p["p0"], p["p1"], f["f0"], f["f1"],
                       abort_seconds=a["a1"], resume_seconds=r["r1"], fit_stats=payload.get("fit_error"), name=payload.get("name", "profiled"))
        except KeyError as exc:
            raise ValueError(f"{path}: missing key {exc.args[0]!r}") from None
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from None

    def describe(self) -> dict:
        return {
            "kind": "profiled",
            "name": self.name,
            "decode_form": _DECODE_FORM,
            "prefill_form": _PREFILL_FORM,
            "c0": self.c0, "c1": self.c1, "c2": self.c2, "c3": self.c3,
            "p0": self.p0, "p1": self.p1,
            "departure_form": _DEPARTURE_FORM,
            "f0": self.f0, "f1": self.f1,
            "abort_form": _ABORT_FORM, "a1": self.abort_seconds,
            "resume_form": _RESUME_FORM, "r1": self.resume_seconds,
            "fit_error": self.fit_stats,
        }

    def __repr__(self) -> str:
        return (f"ProfiledCostModel(c0={self.c0:.4g}, c1={self.c1:.4g}, c2={self.c2:.4g}, "
                f"c3={self.c3:.4g}, p0={self.p0:.4g}, p1={self.p1:.4g}, f0={self.f0:.4g}, f1={self.f1:.4g}, a1={self.abort_seconds:.4g}, "
                f"r1={self.resume_seconds:.4g})")

def batch_features(lengths, prompt_len: int) -> dict[str, float]:
    """A batch admitted at once (one request per entry of ``lengths``, prompts of ``prompt_len``), run as the
    simulator runs it: one prefill of all prompts, then spans of decode iterations between finishes, a
    departure where requests finish (the last one ends the batch, so it adds nothing). Its makespan under a
    ProfiledCostModel is ``sum(coefficient * feature)``; these are the features, named after the coefficients."""
    L = sorted(int(x) for x in lengths)
    n = len(L)
    f = dict.fromkeys(_COEFFICIENTS, 0.0)
    if not n:
        return f
    f["p0"], f["p1"] = 1.0, float(n * prompt_len)
    ctx, done, i = float(n * prompt_len), 0, 0
    while i < n:
        k = L[i] - done  # iterations until the next finish, at n - i running sequences
        m = n - i
        if k > 0:
            f["c0"] += k
            f["c1"] += m * k
            f["c3"] += m * m * k
            f["c2"] += k * ctx + m * k * (k - 1) / 2
            ctx += m * k
            done = L[i]
        j = i
        while j < n and L[j] == L[i]:
            ctx -= prompt_len + L[j]
            j += 1
        if j < n:
            f["f0"] += 1.0
            f["f1"] += j - i
        i = j
    return f

