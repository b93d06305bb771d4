"""Synthetic rollout-length traces.

:func:`synthesize` draws a trace (see :mod:`lssim.traces.trace`) from a small
generative model with the knobs a scheduling researcher cares about:

* **Prompt sampling.** A pool of ``n_prompts`` prompts is shuffled every epoch
  and cut into consecutive batches of ``prompts_per_step`` prompts, one batch
  per step; a last partial batch is dropped (verl's dataloader with
  ``drop_last=True``).  Each prompt of a step gets ``group_size`` responses.
* **Per-prompt length.** Each prompt has a latent standard-normal score
  ``u`` per epoch that follows an AR(1) across epochs with coefficient
  ``persistence`` (stationary: ``u' = rho*u + sqrt(1-rho^2)*eps``).  It is
  mapped to the prompt's *typical* response length through a spliced
  distribution: a lognormal body (median ``length_median``, log-sd
  ``length_sigma``) for the lowest ``1 - tail_fraction`` of prompts and a
  Pareto tail (shape ``tail_alpha``) above that quantile.  In the body the
  prompt's log-length is exactly an AR(1) across its appearances.  The typical
  length is multiplied by ``(1 + drift_per_100_steps) ** (step / 100)``.
* **Within a group.** Each response's natural length is the prompt's typical
  length times ``exp(group_sigma * N(0, 1))``, rounded, at least 1.
* **Truncation.** A natural length above ``max_tokens`` is cut to
  ``max_tokens`` (``finish_reason='length'``, reward 0).
* **Loops.** A fraction ``loop_fraction`` of responses degenerate into a
  repetition loop starting at a uniformly drawn token of the response and then
  run to ``max_tokens`` (``finish_reason='length'``, reward 0, ``loop_start``
  set, low entropy).
* **Entropy collapse.** A fraction ``collapse_fraction`` (default 0) of the
  responses that do not loop collapse into low-entropy rambling at a uniform
  token and run to ``max_tokens`` (``entropy_collapse_start`` set, reward 0).
* **Rewards.** Each prompt has a solve probability ``p ~ Beta(reward_a,
  reward_b)``.  A response longer than its prompt's typical length ``L`` is
  right with probability ``p * (len / L) ** -length_penalty``; otherwise with
  ``p``.  Rewards are 0/1.

Everything is vectorized numpy driven by ``np.random.default_rng(seed)``, so a
given config always gives the identical frame.  ``PRESETS`` holds two
reference configurations, ``math7b`` and ``longtail32k``.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, fields
from typing import Any, Mapping

import numpy as np
import pandas as pd

from lssim.traces.trace import validate_trace

__all__ = ["SynthConfig", "synthesize", "PRESETS", "get_preset"]


@dataclass(frozen=True)
class SynthConfig:
    """Parameters of the synthetic trace generator (all validated on creation).

    Defaults describe a 7B math-reasoning GRPO run (the ``math7b`` preset).
    Build from a mapping with :meth:`from_dict` (unknown keys are an error)
    and derive variants with :meth:`replace`.
    """

    seed: int = 0
    """Seed of ``np.random.default_rng``; the same config gives the same trace."""

    # ---- run shape ----------------------------------------------------------
    steps: int = 40
    """Number of RL steps (policy versions) to generate, numbered 0..steps-1."""
    n_prompts: int = 2048
    """Size of the prompt pool (the dataset); prompt ids are 0..n_prompts-1."""
    prompts_per_step: int = 256
    """Prompts per step (train batch size); at most ``n_prompts``.  Each epoch
    yields ``n_prompts // prompts_per_step`` steps (the remainder is dropped)."""
    group_size: int = 8
    """Responses per prompt per step (GRPO's G / verl's ``rollout.n``)."""
    max_tokens: int = 16384
    """Response-token cap; longer responses are truncated (finish 'length')."""

    # ---- prompt lengths -----------------------------------------------------
    prompt_len_median: float = 180.0
    """Median prompt length in tokens (lognormal across prompts, fixed per prompt)."""
    prompt_len_sigma: float = 0.45
    """Log-sd of prompt length across prompts (>= 0)."""
    prompt_len_max: int = 2048
    """Prompt lengths are clipped to [1, prompt_len_max]."""

    # ---- response lengths ---------------------------------------------------
    length_median: float = 1900.0
    """Median over prompts of a prompt's typical response length at step 0 (tokens)."""
    length_sigma: float = 0.6
    """Log-sd of the typical response length across prompts (lognormal body, >= 0)."""
    tail_fraction: float = 0.10
    """Fraction of prompts (per epoch) whose typical length lies in the Pareto
    tail instead of the lognormal body; in [0, 1).  0 = pure lognormal."""
    tail_alpha: float = 1.2
    """Pareto shape of the tail (> 0); smaller = heavier.  The tail starts at the
    body's ``1 - tail_fraction`` quantile, so the distribution is continuous."""
    group_sigma: float = 0.45
    """Log-sd of a response's length around its prompt's typical length
    (within-group spread, >= 0)."""
    persistence: float = 0.8
    """AR(1) coefficient rho in [0, 1] of a prompt's latent length score across
    epochs: 1 = a prompt keeps its length rank forever, 0 = redrawn every epoch."""
    drift_per_100_steps: float = 0.3
    """Multiplicative drift of all lengths: factor ``(1 + d) ** (step / 100)``
    (> -1; 0.3 = lengths grow 30% per 100 steps)."""

    # ---- rewards ------------------------------------------------------------
    reward_a: float = 1.5
    """Beta(a, b) shape a (> 0) of the per-prompt solve probability."""
    reward_b: float = 1.2
    """Beta(a, b) shape b (> 0) of the per-prompt solve probability."""
    length_penalty: float = 0.7
    """Exponent lambda >= 0: a response ``r`` times longer than its prompt's
    typical length (r > 1) is right with probability ``p * r ** -lambda``."""

    # ---- degenerate loops ---------------------------------------------------
    loop_fraction: float = 0.015
    """Fraction of responses in [0, 1] that fall into a repetition loop and run
    to ``max_tokens`` (finish 'length', reward 0, ``loop_start`` set)."""
    collapse_fraction: float = 0.0
    """Fraction of the responses that do not loop, in [0, 1], whose entropy
    collapses (low-entropy rambling without exact repetition) at a uniform
    token and that then run to ``max_tokens`` (finish 'length', reward 0,
    ``entropy_collapse_start`` set, ``entropy_mean`` ~0.08)."""

    # ------------------------------------------------------------------------
    def __post_init__(self) -> None:
        def need(cond: bool, name: str, what: str) -> None:
            if not cond:
                raise ValueError(f"SynthConfig.{name} must be {what}, got {getattr(self, name)!r}")

        for f in fields(self):
            v = getattr(self, f.name)
            if f.type in ("int", int):
                if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
                    raise ValueError(f"SynthConfig.{f.name} must be an integer, got {v!r}")
                object.__setattr__(self, f.name, int(v))
            else:
                if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
                    raise ValueError(f"SynthConfig.{f.name} must be a number, got {v!r}")
                if not math.isfinite(float(v)):
                    raise ValueError(f"SynthConfig.{f.name} must be finite, got {v!r}")
                object.__setattr__(self, f.name, float(v))
        need(self.seed >= 0, "seed", ">= 0")
        for name in ("steps", "n_prompts", "prompts_per_step", "group_size", "max_tokens", "prompt_len_max"):
            need(getattr(self, name) >= 1, name, ">= 1")
        need(self.prompts_per_step <= self.n_prompts, "prompts_per_step", f"<= n_prompts ({self.n_prompts})")
        need(self.prompt_len_median > 0, "prompt_len_median", "> 0")
        need(self.length_median > 0, "length_median", "> 0")
        for name in ("prompt_len_sigma", "length_sigma", "group_sigma", "length_penalty"):
            need(getattr(self, name) >= 0, name, ">= 0")
        need(0 <= self.tail_fraction < 1, "tail_fraction", "in [0, 1)")
        need(self.tail_alpha > 0, "tail_alpha", "> 0")
        need(0 <= self.persistence <= 1, "persistence", "in [0, 1]")
        need(self.drift_per_100_steps > -1, "drift_per_100_steps", "> -1")
        need(self.reward_a > 0, "reward_a", "> 0")
        need(self.reward_b > 0, "reward_b", "> 0")
        need(0 <= self.loop_fraction <= 1, "loop_fraction", "in [0, 1]")
        need(0 <= self.collapse_fraction <= 1, "collapse_fraction", "in [0, 1]")

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], base: "SynthConfig | None" = None) -> "SynthConfig":
        """Config from a mapping (over ``base``'s values, or the defaults).

        Unknown keys raise ``ValueError`` naming them."""
        unknown = sorted(set(d) - set(cls.field_names()))
        if unknown:
            raise ValueError(
                f"unknown SynthConfig key(s): {', '.join(unknown)}; valid keys: {', '.join(cls.field_names())}"
            )
        return dataclasses.replace(base if base is not None else cls(), **d)

    def replace(self, **overrides: Any) -> "SynthConfig":
        """A copy with some fields changed (unknown names raise ``ValueError``)."""
        return type(self).from_dict(overrides, base=self)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def steps_per_epoch(self) -> int:
        return self.n_prompts // self.prompts_per_step


PRESETS: dict[str, SynthConfig] = {
    # 7B math-reasoning GRPO (DAPO-Math-like): 16k cap, G=8, 256 prompts/step.
    "math7b": SynthConfig(),
    # Harsher long-CoT run: 32k cap, G=16, 128 prompts/step, much heavier tail.
    "longtail32k": SynthConfig(
        steps=30,
        n_prompts=1024,
        prompts_per_step=128,
        group_size=16,
        max_tokens=32768,
        prompt_len_median=220.0,
        length_median=1700.0,
        length_sigma=0.7,
        tail_fraction=0.12,
        tail_alpha=1.0,
        group_sigma=0.55,
        persistence=0.75,
        drift_per_100_steps=0.5,
        reward_a=1.2,
        reward_b=1.5,
        length_penalty=0.8,
        loop_fraction=0.02,
    ),
}
"""Reference configurations (see traces/README.md for the traces made from them)."""


def get_preset(name: str) -> SynthConfig:
    """The preset called ``name`` (``ValueError`` listing the known ones if none)."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; known presets: {', '.join(sorted(PRESETS))}") from None


def _norm_cdf_upper(x: np.ndarray) -> np.ndarray:
    """P(Z > x) for a standard normal Z, accurate in the upper tail."""
    from scipy.special import ndtr

    return ndtr(-x)


def _norm_ppf(q: float) -> float:
    from statistics import NormalDist

    return NormalDist().inv_cdf(q)


def _typical_length(u: np.ndarray, cfg: SynthConfig) -> np.ndarray:
    """Map latent N(0,1) scores to typical lengths (lognormal body + Pareto tail)."""
    mu = math.log(cfg.length_median)
    body = np.exp(mu + cfg.length_sigma * u)
    f = cfg.tail_fraction
    if f <= 0:
        return body
    z_t = _norm_ppf(1.0 - f)
    x_t = math.exp(mu + cfg.length_sigma * z_t)
    tail = u > z_t
    if tail.any():
        sf = _norm_cdf_upper(u[tail])  # in (0, f)
        sf = np.maximum(sf, 1e-300)
        body[tail] = x_t * (sf / f) ** (-1.0 / cfg.tail_alpha)
    return body


def synthesize(cfg: SynthConfig | None = None, **overrides: Any) -> pd.DataFrame:
    """Draw a synthetic trace from ``cfg`` (default: ``SynthConfig()``).

    Keyword ``overrides`` replace fields of ``cfg`` (unknown names raise
    ``ValueError``).  Returns a validated, normalized trace frame (see
    :func:`lssim.traces.trace.validate_trace`), deterministic in ``cfg.seed``.
    """
    if cfg is None:
        cfg = SynthConfig()
    if overrides:
        cfg = cfg.replace(**overrides)
    with np.errstate(over="ignore", divide="ignore", under="ignore", invalid="ignore"):
        return _synthesize(cfg)


def _synthesize(cfg: SynthConfig) -> pd.DataFrame:
    rng = np.random.default_rng(cfg.seed)
    n, P, G, S = cfg.n_prompts, cfg.prompts_per_step, cfg.group_size, cfg.steps
    spe = cfg.steps_per_epoch
    n_epochs = -(-S // spe)

    # ---- per-prompt fixed attributes ---------------------------------------
    prompt_len = np.clip(
        np.rint(cfg.prompt_len_median * np.exp(cfg.prompt_len_sigma * rng.standard_normal(n))), 1, cfg.prompt_len_max
    ).astype(np.int64)
    p_solve = rng.beta(cfg.reward_a, cfg.reward_b, size=n)

    # ---- latent length score: AR(1) across epochs ----------------------------
    u = _epoch_scores(rng, n_epochs, n, cfg.persistence)

    # ---- epoch-wise sampling without replacement ------------------------------
    perms = rng.permuted(np.tile(np.arange(n, dtype=np.int64), (n_epochs, 1)), axis=1)
    sel = perms[:, : spe * P].reshape(n_epochs * spe, P)[:S]  # (S, P) prompt ids
    step_of = np.repeat(np.arange(S, dtype=np.int64), P)  # per (step, prompt) group
    epoch_of = step_of // spe
    pid_g = sel.reshape(-1)
    drift = (1.0 + cfg.drift_per_100_steps) ** (step_of / 100.0)
    typical_g = _typical_length(u[epoch_of, pid_g], cfg) * drift

    # ---- responses --------------------------------------------------------------
    m = S * P * G
    step = np.repeat(step_of, G)
    pid = np.repeat(pid_g, G)
    sample_idx = np.tile(np.arange(G, dtype=np.int64), S * P)
    typical = np.repeat(typical_g, G)
    ratio = np.exp(cfg.group_sigma * rng.standard_normal(m))  # response / prompt's typical length
    natural = np.maximum(1.0, np.rint(np.minimum(typical * ratio, 1e15)))
    T = cfg.max_tokens
    truncated = natural > T
    response_len = np.minimum(natural, T).astype(np.int64)

    loops = rng.random(m) < cfg.loop_fraction
    loop_start = np.full(m, -1, dtype=np.int64)
    loop_u = rng.random(m)
    loop_start[loops] = np.floor(loop_u[loops] * response_len[loops]).astype(np.int64)
    response_len[loops] = T

    p_eff = p_solve[pid] * np.where(ratio > 1.0, ratio, 1.0) ** (-cfg.length_penalty)
    reward = (rng.random(m) < p_eff).astype(np.float64)
    at_cap = truncated | loops
    reward[at_cap] = 0.0

    entropy = np.where(loops, 0.15 + 0.05 * rng.standard_normal(m), 0.55 + 0.12 * rng.standard_normal(m))
    collapse_start, at_cap, entropy = _entropy_collapse(rng, cfg, loops, response_len, reward, at_cap, entropy)
    finish = np.where(at_cap, "length", "stop")
    entropy = np.round(np.clip(entropy, 0.01, None), 3)

    df = pd.DataFrame({
        "step": step, "prompt_id": pid, "sample_idx": sample_idx, "prompt_len": prompt_len[pid], "response_len": response_len,
        "reward": reward, "finish_reason": finish, "max_tokens": np.full(m, T, dtype=np.int64), "loop_start": loop_start,
        "entropy_mean": entropy, "entropy_collapse_start": collapse_start,
    })
    return validate_trace(df, source=f"synthesize(seed={cfg.seed})")


def _epoch_scores(rng: np.random.Generator, n_epochs: int, n: int, rho: float) -> np.ndarray:
    """Each prompt's latent length score per epoch, an AR(1) across epochs with correlation `rho`: (n_epochs, n)."""
    eps = rng.standard_normal((n_epochs, n))
    u = np.empty((n_epochs, n))
    u[0] = eps[0]
    s = math.sqrt(max(0.0, 1.0 - rho * rho))
    for e in range(1, n_epochs):
        u[e] = rho * u[e - 1] + s * eps[e]
    return u


def _entropy_collapse(rng: np.random.Generator, cfg: SynthConfig, loops: np.ndarray, response_len: np.ndarray,
                      reward: np.ndarray, at_cap: np.ndarray, entropy: np.ndarray) -> tuple:
    """Entropy collapse, drawn last, so a config without it gives the same trace as before the knob: a collapsed
    response runs to the cap with reward 0 (response_len and reward changed in place). Returns (collapse_start,
    at_cap, entropy)."""
    m = len(loops)
    collapse_start = np.full(m, -1, dtype=np.int64)
    if cfg.collapse_fraction > 0:
        collapses = (rng.random(m) < cfg.collapse_fraction) & ~loops
        collapse_u = rng.random(m)
        collapse_start[collapses] = np.floor(collapse_u[collapses] * response_len[collapses]).astype(np.int64)
        response_len[collapses] = cfg.max_tokens
        reward[collapses] = 0.0
        at_cap = at_cap | collapses
        entropy = np.where(collapses, 0.08 + 0.03 * rng.standard_normal(m), entropy)
    return collapse_start, at_cap, entropy
