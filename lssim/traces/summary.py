"""Summaries of a trace: the statistics `lssim trace info` prints (a JSON-serializable dict) and their
human-readable rendering.

    from lssim.traces.summary import trace_info, format_trace_info
    print(format_trace_info(trace_info(df), title="my trace"))
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from lssim.loop.core import FINISH_REASONS
from lssim.traces.trace import validate_trace

__all__ = ["trace_info", "format_trace_info"]


def _f(x: Any) -> float | None:
    """JSON-friendly float (None for NaN/inf)."""
    x = float(x)
    return x if math.isfinite(x) else None


def _corr(a: np.ndarray, b: np.ndarray) -> float | None:
    if len(a) < 3 or np.std(a) == 0 or np.std(b) == 0:
        return None
    return _f(np.corrcoef(a, b)[0, 1])


def trace_info(df: pd.DataFrame, *, validate: bool = True, source: str = "<frame>") -> dict[str, Any]:
    """Summary statistics of a trace, as a JSON-serializable dict.

    Keys: ``rows``, ``steps``, ``step_min``, ``step_max``, ``prompts``,
    ``groups`` (rows sharing step, prompt_id and group_id), ``group_size`` (int if every group has the same size, else
    None), ``group_size_min``/``group_size_max``, ``max_tokens`` (int if
    constant, else None) and ``max_tokens_max``, ``prompt_len_mean``,
    ``response_len`` (dict of mean, p10, p50, p90, p99, max), per-step tail
    ``step_max_over_median`` and ``step_p99_over_p50`` (medians over steps),
    ``max_over_median`` (overall), ``finish_reason`` (fraction of rows per
    reason), ``truncated_fraction`` (finish_reason == 'length'),
    ``loop_fraction`` (loop_start >= 0), ``reward_mean``, ``trained_fraction``
    (rows trained on), ``reward_mean_short`` /
    ``reward_mean_long`` (rows below / above their group's median length),
    ``persistence_spearman`` / ``persistence_pearson_log`` (correlation of a
    prompt's mean log(1+response_len) between consecutive appearances) and
    ``persistence_pairs`` (how many such pairs), and ``timed_fraction``
    (rows with a known finish_time).
    """
    if validate:
        df = validate_trace(df, source=source)
    rl = df["response_len"].to_numpy()
    step = df["step"].to_numpy()
    pid = df["prompt_id"].to_numpy()
    info: dict[str, Any] = {"rows": int(len(df))}
    info.update(_shape(df, step, pid))
    info.update(_lengths(rl, step))
    info.update(_reasons_and_rewards(df, rl, step, pid))
    info.update(_persistence(pid, step, rl))
    info["timed_fraction"] = _f((~np.isnan(df["finish_time"].to_numpy())).mean())
    return info


def _shape(df: pd.DataFrame, step: np.ndarray, pid: np.ndarray) -> dict[str, Any]:
    """Steps, prompts, groups (rows sharing step, prompt_id, group_id) and budgets."""
    steps = np.unique(step)
    gsize = df.groupby(["step", "prompt_id", "group_id"], sort=False).size().to_numpy()
    mt = df["max_tokens"].to_numpy()
    return {
        "steps": int(len(steps)), "step_min": int(steps[0]), "step_max": int(steps[-1]),
        "prompts": int(len(np.unique(pid))), "groups": int(len(gsize)),
        "group_size": int(gsize[0]) if gsize.min() == gsize.max() else None,
        "group_size_min": int(gsize.min()), "group_size_max": int(gsize.max()),
        "max_tokens": int(mt[0]) if mt.min() == mt.max() else None, "max_tokens_max": int(mt.max()),
        "prompt_len_mean": _f(df["prompt_len"].mean()),
    }


def _lengths(rl: np.ndarray, step: np.ndarray) -> dict[str, Any]:
    """Response-length quantiles and the tail, overall and per step."""
    q = np.quantile(rl, [0.1, 0.5, 0.9, 0.99])
    info: dict[str, Any] = {"response_len": {
        "mean": _f(rl.mean()), "p10": _f(q[0]), "p50": _f(q[1]), "p90": _f(q[2]), "p99": _f(q[3]), "max": int(rl.max()),
    }}
    info["max_over_median"] = _f(rl.max() / q[1]) if q[1] > 0 else None
    g = pd.Series(rl.astype("float64")).groupby(step)
    smax, smed, sp99 = g.max(), g.median(), g.quantile(0.99)
    with np.errstate(divide="ignore", invalid="ignore"):
        r1 = (smax / smed).replace([np.inf, -np.inf], np.nan).dropna()
        r2 = (sp99 / smed).replace([np.inf, -np.inf], np.nan).dropna()
    info["step_max_over_median"] = _f(r1.median()) if len(r1) else None
    info["step_p99_over_p50"] = _f(r2.median()) if len(r2) else None
    return info


def _reasons_and_rewards(df: pd.DataFrame, rl: np.ndarray, step: np.ndarray, pid: np.ndarray) -> dict[str, Any]:
    """Finish reasons, loops, and rewards (on the trace's own scale) overall and for short / long members."""
    fr = df["finish_reason"].value_counts(normalize=True)
    info: dict[str, Any] = {"finish_reason": {r: _f(fr.get(r, 0.0)) for r in FINISH_REASONS}}
    info["truncated_fraction"] = info["finish_reason"]["length"]
    info["loop_fraction"] = _f((df["loop_start"].to_numpy() >= 0).mean())
    reward = df["reward"].to_numpy()
    info["reward_mean"] = _f(reward.mean())
    info["trained_fraction"] = _f(df["trained"].to_numpy().mean())
    gmed = pd.Series(rl.astype("float64")).groupby([step, pid, df["group_id"].to_numpy()]).transform("median").to_numpy()
    short, long_ = rl < gmed, rl > gmed
    info["reward_mean_short"] = _f(reward[short].mean()) if short.any() else None
    info["reward_mean_long"] = _f(reward[long_].mean()) if long_.any() else None
    return info


def _persistence(pid: np.ndarray, step: np.ndarray, rl: np.ndarray) -> dict[str, Any]:
    """How a prompt's mean log-length at one appearance predicts it at the next."""
    m = (
        pd.DataFrame({"prompt_id": pid, "step": step, "ll": np.log1p(rl)})
        .groupby(["prompt_id", "step"], sort=True)["ll"]
        .mean()
        .reset_index()
    )
    same = m["prompt_id"].to_numpy()[1:] == m["prompt_id"].to_numpy()[:-1]
    a = m["ll"].to_numpy()[:-1][same]
    b = m["ll"].to_numpy()[1:][same]
    return {
        "persistence_pairs": int(len(a)),
        "persistence_pearson_log": _corr(a, b),
        "persistence_spearman": _corr(pd.Series(a).rank().to_numpy(), pd.Series(b).rank().to_numpy()) if len(a) else None,
    }


def format_trace_info(info: dict[str, Any], title: str | None = None) -> str:
    """Human-readable multi-line rendering of :func:`trace_info`'s dict."""

    def num(x: Any, fmt: str = ".3g") -> str:
        return "n/a" if x is None else format(x, fmt)

    rlq = info["response_len"]
    gs = info["group_size"] if info["group_size"] is not None else f"{info['group_size_min']}..{info['group_size_max']}"
    mt = info["max_tokens"] if info["max_tokens"] is not None else f"varies (max {info['max_tokens_max']})"
    fr = ", ".join(f"{k} {100 * v:.2f}%" for k, v in info["finish_reason"].items() if v)
    lines = []
    if title:
        lines.append(title)
    lines += [
        f"rows            {info['rows']:,}",
        f"steps           {info['steps']} (step {info['step_min']}..{info['step_max']})",
        f"prompts         {info['prompts']:,}   groups {info['groups']:,}   group size {gs}",
        f"max_tokens      {mt}   mean prompt_len {num(info['prompt_len_mean'], '.1f')}",
        "response_len    mean {m}  p10 {p10}  p50 {p50}  p90 {p90}  p99 {p99}  max {mx}".format(
            m=num(rlq["mean"], ".0f"), p10=num(rlq["p10"], ".0f"), p50=num(rlq["p50"], ".0f"),
            p90=num(rlq["p90"], ".0f"), p99=num(rlq["p99"], ".0f"), mx=rlq["max"],
        ),
        f"tail            max/median {num(info['max_over_median'], '.1f')} overall; per step (median over steps): "
        f"max/median {num(info['step_max_over_median'], '.1f')}, p99/p50 {num(info['step_p99_over_p50'], '.2f')}",
        f"finish_reason   {fr}",
        f"truncated       {100 * info['truncated_fraction']:.2f}%   loops {100 * info['loop_fraction']:.2f}%   "
        f"trained {100 * info['trained_fraction']:.1f}%",
        f"reward          mean {num(info['reward_mean'], '.3f')}  (shorter than group median "
        f"{num(info['reward_mean_short'], '.3f')}, longer {num(info['reward_mean_long'], '.3f')})",
        f"persistence     spearman {num(info['persistence_spearman'], '.3f')}  pearson(log) "
        f"{num(info['persistence_pearson_log'], '.3f')}  over {info['persistence_pairs']:,} consecutive appearances",
        f"timed rows      {100 * info['timed_fraction']:.1f}%",
    ]
    return "\n".join(lines)
