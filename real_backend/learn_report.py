"""What `lssim learn` reports of its runs (real_backend.learn): accuracy and time to a target accuracy per policy,
over seeds, from each run's eval.parquet and steps.parquet; learning curves as PNG and an HTML page.

Per run: initial_accuracy (pass@1 before training), final_accuracy (the last evaluation), accuracy_at_budget (the
latest evaluation at or before the equal budget: the smallest training wall-clock every run reached at its last
evaluation), time_to_target_seconds / time_to_target_steps (the first time pass@1 reaches the target, linearly
interpolated between the evaluations around it; NaN if it never does), and mean step and rollout seconds. Per
policy: the median over seeds, the spread (max - min) and a bootstrap interval of the median (`bootstrap_interval`),
the step and rollout speedups over the baseline (its median mean seconds over this policy's), the time-to-target
speedup (the baseline's median time to target over this policy's) and a verdict naming a policy faster per step and
slower to accuracy.
"""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from .evaluate import load_eval

METRICS = ("initial_accuracy", "final_accuracy", "accuracy_at_budget", "time_to_target_seconds", "time_to_target_steps",
           "mean_step_seconds", "mean_rollout_seconds", "steps", "train_seconds")


def time_to_target(x, y, target: float) -> float:
    """The first x at which y reaches `target`, linear between the points around the crossing (x ascending); the
    first x if y starts there; NaN if y never reaches it."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    for i in range(len(y)):
        if y[i] >= target:
            if i == 0:
                return float(x[0])
            x0, x1, y0, y1 = x[i - 1], x[i], y[i - 1], y[i]
            return float(x0 + (target - y0) / (y1 - y0) * (x1 - x0))
    return math.nan


def value_at(x, y, at: float) -> float:
    """y at the latest x at or before `at` (NaN if none)."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    before = np.flatnonzero(x <= at)
    return float(y[before[-1]]) if len(before) else math.nan


def bootstrap_interval(values, level: float = 0.95, n: int = 2000, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of the median of `values` (NaNs left out; one value: that value twice; none: NaN)."""
    v = np.asarray([x for x in values if x == x], float)
    if len(v) == 0:
        return math.nan, math.nan
    if len(v) == 1:
        return float(v[0]), float(v[0])
    rng = np.random.default_rng(seed)
    medians = np.median(v[rng.integers(0, len(v), size=(n, len(v)))], axis=1)
    lo, hi = np.quantile(medians, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


def run_figures(run_dir, target: float, budget: float) -> dict:
    """One run's figures (module docstring)."""
    ev = load_eval(run_dir).sort_values("step")
    steps = pd.read_parquet(Path(run_dir) / "steps.parquet")
    return {"initial_accuracy": float(ev["pass1"].iloc[0]) if len(ev) and ev["step"].iloc[0] == 0 else math.nan,
            "final_accuracy": float(ev["pass1"].iloc[-1]) if len(ev) else math.nan,
            "accuracy_at_budget": value_at(ev["train_seconds"], ev["pass1"], budget),
            "time_to_target_seconds": time_to_target(ev["train_seconds"], ev["pass1"], target),
            "time_to_target_steps": time_to_target(ev["step"], ev["pass1"], target),
            "mean_step_seconds": float(steps["step_seconds"].mean()), "mean_rollout_seconds": float(steps["rollout_seconds"].mean()),
            "steps": len(steps), "train_seconds": float(steps["step_seconds"].sum())}


def summarize(runs: dict[str, dict[int, str]], target: float | None = None, baseline: str | None = None) -> dict:
    """runs: label -> seed -> run folder. The whole result: target, budget, each run's figures, each label's summary."""
    evals = {label: {seed: load_eval(d) for seed, d in seeds.items()} for label, seeds in runs.items()}
    reached = [float(e["train_seconds"].max()) for seeds in evals.values() for e in seeds.values() if len(e)]
    budget = min(reached) if reached else math.nan
    initial = [float(e["pass1"].iloc[0]) for seeds in evals.values() for e in seeds.values() if len(e) and e["step"].iloc[0] == 0]
    default_target = float(np.median(initial)) + 0.10 if initial else math.nan
    target = default_target if target is None else target
    per_run = {label: {seed: run_figures(d, target, budget) for seed, d in seeds.items()} for label, seeds in runs.items()}
    summary = {}
    for label, seeds in per_run.items():
        summary[label] = {}
        for m in METRICS:
            values = [f[m] for f in seeds.values()]
            finite = [v for v in values if v == v]
            summary[label][m] = {"median": float(np.median(finite)) if finite else math.nan,
                                 "spread": float(max(finite) - min(finite)) if finite else math.nan,
                                 "interval": list(bootstrap_interval(values)), "n": len(finite)}
    base = baseline if baseline in summary else next(iter(summary), None)
    for label, s in summary.items():
        for what in ("step", "rollout"):
            ours, theirs = s[f"mean_{what}_seconds"]["median"], summary[base][f"mean_{what}_seconds"]["median"]
            s[f"{what}_speedup"] = theirs / ours if ours and ours == ours else math.nan
        ours, theirs = s["time_to_target_seconds"]["median"], summary[base]["time_to_target_seconds"]["median"]
        s["time_to_target_speedup"] = theirs / ours if ours and ours == ours else math.nan
        s["verdict"] = verdict(s["step_speedup"], s["time_to_target_speedup"])
    return {"target": target, "target_rule": "given" if target != default_target else "initial + 0.10",
            "budget_seconds": budget, "baseline": base, "runs": per_run, "summary": summary}


def verdict(step_speedup: float, target_speedup: float) -> str:
    """What the two speedups say together ("faster per step, slower to accuracy" is the case the table exists for).
    Within 5% counts as even."""
    if target_speedup != target_speedup:
        return "target not reached"
    step = "faster" if step_speedup > 1.05 else "slower" if step_speedup < 1 / 1.05 else "even"
    target = "faster" if target_speedup > 1.05 else "slower" if target_speedup < 1 / 1.05 else "even"
    return f"{step} per step, {target} to accuracy"


def summary_table(result: dict) -> pd.DataFrame:
    """One row per label: the medians (and the bootstrap interval of time to target) and the speedups."""
    rows = []
    for label, s in result["summary"].items():
        row = {"policy": label, "seeds": s["final_accuracy"]["n"]}
        row.update({m: s[m]["median"] for m in ("initial_accuracy", "final_accuracy", "accuracy_at_budget",
                                                  "time_to_target_seconds", "time_to_target_steps")})
        lo, hi = s["time_to_target_seconds"]["interval"]
        row.update(tts_interval=f"[{lo:.0f}, {hi:.0f}]", rollout_speedup=s["rollout_speedup"], step_speedup=s["step_speedup"],
                   time_to_target_speedup=s["time_to_target_speedup"], verdict=s["verdict"])
        rows.append(row)
    return pd.DataFrame(rows)


def curves_png(runs: dict[str, dict[int, str]], target: float) -> bytes:
    """pass@1 against training wall-clock and against steps: one line per label (the median over seeds), its seeds'
    range shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    for i, (label, seeds) in enumerate(runs.items()):
        color = f"C{i}"
        frames = [load_eval(d).sort_values("step") for d in seeds.values()]
        for ax, x in zip(axes, ("train_seconds", "step")):
            grid = np.unique(np.concatenate([f[x].to_numpy(float) for f in frames if len(f)] or [np.zeros(0)]))
            if not len(grid):
                continue
            ys = np.array([np.interp(grid, f[x], f["pass1"], right=np.nan) for f in frames if len(f)])
            ax.plot(grid, np.nanmedian(ys, axis=0), color=color, label=label)
            if len(ys) > 1:
                ax.fill_between(grid, np.nanmin(ys, axis=0), np.nanmax(ys, axis=0), color=color, alpha=0.2)
    for ax, xlabel in zip(axes, ("training wall-clock (s, evaluations excluded)", "RL steps")):
        ax.axhline(target, color="grey", linestyle=":", label=f"target {target:.3f}")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("held-out pass@1")
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()


def jsonable(value):
    """The result with NaN as None (JSON has no NaN) and numpy numbers as Python's."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, (float, np.floating)):
        return None if math.isnan(value) else float(value)
    if isinstance(value, np.integer):
        return int(value)
    return value


def write_outputs(result: dict, runs: dict[str, dict[int, str]], out_dir) -> dict[str, Path]:
    """DIR/learn.json (the result), DIR/learning_curves.png and DIR/learn.html (lssim.analysis.report's page)."""
    from lssim.analysis.report import Report, Section, render_html
    from lssim.results import atomic_write

    out = Path(out_dir)
    png = curves_png(runs, result["target"])
    paths = {"json": out / "learn.json", "png": out / "learning_curves.png", "html": out / "learn.html"}
    text = json.dumps(jsonable(result), indent=1)
    atomic_write(paths["json"], lambda p: Path(p).write_text(text))
    atomic_write(paths["png"], lambda p: Path(p).write_bytes(png))
    section = Section("Held-out accuracy", paragraphs=[
        f"Target pass@1 {result['target']:.3f} ({result['target_rule']}); equal budget {result['budget_seconds']:.0f} s of "
        f"training wall-clock (evaluations excluded); speedups over {result['baseline']}."],
        figures={"learning_curves": (png, "held-out pass@1 against training wall-clock and against steps (median over "
                                           "seeds, their range shaded)")},
        tables={"summary": summary_table(result)})
    page = render_html(Report("lssim learn", [section]))
    atomic_write(paths["html"], lambda p: Path(p).write_text(page, encoding="utf-8"))
    return paths


__all__ = ["time_to_target", "value_at", "bootstrap_interval", "run_figures", "summarize", "summary_table", "curves_png",
           "write_outputs", "jsonable", "METRICS"]
