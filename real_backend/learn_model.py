"""`lssim learn-model DIR`: fit the learning-progress model (lssim.analysis.learning_model) on a `lssim learn` folder's
real runs, and check it on each policy left out of the fit: the simulator replays the baseline's recorded trace under
that policy (and mode), the model turns the replay's steps into a time to the target accuracy, and that is compared
with the time the real runs took. Reported: each label's measured and predicted time to target, their ratio, and the
Kendall tau of the two rankings.

    lssim learn-model paper/experiments/learn/learn2 --json

The replay of label L, seed s: the real run L/s's config, seeds, data loader and mode (real_backend.validate_modes:
the CPU profile, the trainer profile), answered from the baseline run of seed s (its twin trace), for --horizon times
the baseline's steps. Writes DIR/learning_model.json.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

from .validate_modes import DEFAULT_TRAIN_PROFILE

DEFAULT_PROFILE = Path(__file__).parent / "data" / "profile_cpu.json"


def label_runs(out_dir) -> dict[str, dict[int, str]]:
    """label -> seed -> run folder, for every finished run under DIR/<label>/<seed>."""
    runs: dict[str, dict[int, str]] = {}
    for meta in sorted(Path(out_dir).glob("*/*/meta.json")):
        if json.loads(meta.read_text()).get("status") == "finished" and meta.parent.name.isdigit():
            runs.setdefault(meta.parent.parent.name, {})[int(meta.parent.name)] = str(meta.parent)
    if "baseline" not in runs:
        raise ValueError(f"{out_dir}: no finished baseline run (DIR/baseline/<seed>): `lssim learn --out {out_dir}` makes them")
    return runs


def curves(folders) -> list:
    """(steps, evals) of each run folder."""
    import pandas as pd

    from .evaluate import load_eval

    return [(pd.read_parquet(Path(f) / "steps.parquet"), load_eval(f).sort_values("step")) for f in folders]


def predicted_steps(folder: str, baseline_folder: str, profile: str, train_profile: str, horizon: float):
    """The simulated steps of the run in `folder`, answered from the baseline run in `baseline_folder`."""
    from lssim.analysis.fidelity.run import replay_run, twin_trace

    from .validate_modes import mode_sim_setup
    from .validate_twin import load_recorded, run_prompts

    run, base = load_recorded(folder), load_recorded(baseline_folder)
    setup = mode_sim_setup(run, profile, train_profile)
    steps = int(math.ceil(horizon * len(base.steps)))
    return replay_run(run, setup, run_prompts(run), trace=twin_trace(base), steps=steps).steps


def check(out_dir, profile: str = str(DEFAULT_PROFILE), train_profile: str = str(DEFAULT_TRAIN_PROFILE),
          target: float | None = None, horizon: float = 3.0, say=lambda text: None) -> dict:
    """The fit on every run, and each label predicted by a fit on the others (module docstring)."""
    from lssim.analysis.learning_model import fit, kendall_tau

    from .learn_report import summarize

    runs = label_runs(out_dir)
    measured = summarize(runs, target=target, baseline="baseline")
    target = measured["target"]
    data = {label: curves(seeds.values()) for label, seeds in runs.items()}
    full = fit([c for label in data for c in data[label]])
    rows = {}
    for label, seeds in runs.items():
        say(f"{label}: fit without it, replay its runs on the baseline's traces ...")
        model = fit([c for other in data if other != label for c in data[other]])
        predicted = []
        for seed, folder in seeds.items():
            base = runs["baseline"].get(seed) or next(iter(runs["baseline"].values()))
            predicted.append(model.time_to(target, predicted_steps(folder, base, profile, train_profile, horizon))[0])
        want = measured["summary"][label]["time_to_target_seconds"]["median"]
        got = float(np.nanmedian(predicted)) if any(p == p for p in predicted) else math.nan
        rows[label] = {"measured_seconds": want, "predicted_seconds": got, "predicted_each": predicted,
                       "ratio": got / want if want == want and want > 0 else math.nan, "fit_without": model.to_dict()}
    labels = list(rows)
    tau = kendall_tau([rows[k]["predicted_seconds"] for k in labels], [rows[k]["measured_seconds"] for k in labels])
    errors = [abs(math.log(r["ratio"])) for r in rows.values() if r["ratio"] == r["ratio"]]
    return {"target": target, "model": full.to_dict(), "labels": rows, "kendall_tau": tau,
            "median_abs_log_ratio": float(np.median(errors)) if errors else math.nan,
            "median_error": float(np.exp(np.median(errors)) - 1) if errors else math.nan,
            "profile": profile, "train_profile": train_profile, "horizon": horizon}


def table(result: dict) -> str:
    lines = [f"{'label':<18} {'measured s':>10} {'predicted s':>11} {'pred/meas':>9}"]
    for label, r in result["labels"].items():
        lines.append(f"{label:<18} {r['measured_seconds']:>10.1f} {r['predicted_seconds']:>11.1f} {r['ratio']:>9.3f}")
    m = result["model"]
    lines.append(f"target {result['target']:.3f}; fit on all: initial {m['initial']:.3f}, ceiling {m['ceiling']:.3f}, "
                 f"scale {m['scale']:.1f} groups, stale weight {m['stale_weight']:.2f}")
    lines.append(f"held out: Kendall tau {result['kendall_tau']:.3f}, median time-to-target error "
                 f"{result['median_error']:.1%} (median |log(pred/meas)| {result['median_abs_log_ratio']:.3f})")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from lssim.results import atomic_write

    from .learn_report import jsonable

    say = lambda text: print(text, file=sys.stderr, flush=True)  # noqa: E731  (stdout: the result only)
    result = check(args.dir, args.profile, args.train_profile, args.target, args.horizon, say=say)
    text = json.dumps(jsonable(result), indent=1)
    atomic_write(Path(args.dir) / "learning_model.json", lambda p: Path(p).write_text(text))
    print(text if args.json else table(result))
    return 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("dir", metavar="DIR", help="a `lssim learn --out` folder with finished runs (DIR/<label>/<seed>)")
    p.add_argument("--target", type=float, help="target pass@1 (default: as lssim learn: the initial pass@1 + 0.10)")
    p.add_argument("--profile", default=str(DEFAULT_PROFILE), metavar="JSON", help="the engine's profiled cost model")
    p.add_argument("--train-profile", default=str(DEFAULT_TRAIN_PROFILE), metavar="JSON", help="the trainer's")
    p.add_argument("--horizon", type=float, default=3.0, help="replay this many times the baseline's steps (default 3)")
    p.add_argument("--json", action="store_true", help="print the whole result as JSON")


__all__ = ["check", "label_runs", "run", "add_arguments"]
