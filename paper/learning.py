"""The paper's learning numbers: `lssim learn`'s committed comparison (paper/experiments/learn/learn2/learn.json) and
the learning-progress model's check on it (learning_model.json beside it, `lssim learn-model`)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from .render import table

LEARN = Path("paper") / "experiments" / "learn" / "learn2"
LEARN_COMMAND = ("lssim learn --policies baseline,april,hadb,breaker,dapo,vade,g2tp,baseline@async:1,baseline@async:2 "
                 "--repeats 3 --budget-seconds 120 --eval-every 5 --json --out paper/experiments/learn/learn2")
MODEL_COMMAND = "lssim learn-model paper/experiments/learn/learn2 --json"


def learning_numbers(root: Path) -> tuple[dict, dict]:
    """Per label: accuracies, time to target and the three speedups side by side (with the verdict), and the model's
    held-out prediction; the headline scalars."""
    folder = root / LEARN
    for name, command in (("learn.json", LEARN_COMMAND), ("learning_model.json", MODEL_COMMAND)):
        if not (folder / name).is_file():
            raise FileNotFoundError(f"{folder / name}: missing; `{command}` writes it")
    result = json.loads((folder / "learn.json").read_text())
    model = json.loads((folder / "learning_model.json").read_text())
    rows = []
    for label, s in result["summary"].items():
        predicted = model["labels"].get(label, {})
        lo, hi = s["time_to_target_seconds"]["interval"]
        rows.append({"policy": label, "seeds": s["final_accuracy"]["n"], "initial": s["initial_accuracy"]["median"],
                     "at budget": s["accuracy_at_budget"]["median"], "to target s": s["time_to_target_seconds"]["median"],
                     "interval": f"[{_num(lo)}, {_num(hi)}]", "rollout x": s["rollout_speedup"], "step x": s["step_speedup"],
                     "to target x": s["time_to_target_speedup"], "verdict": s["verdict"],
                     "predicted s": predicted.get("predicted_seconds")})
    frame = pd.DataFrame(rows)
    base = result["summary"][result["baseline"]]
    numbers = {"learn.command": LEARN_COMMAND, "learn.model_command": MODEL_COMMAND, "learn.target": result["target"], "learn.budget": result["budget_seconds"],
               "learn.baseline_initial": base["initial_accuracy"]["median"],
               "learn.baseline_at_budget": base["accuracy_at_budget"]["median"],
               "learn.baseline_to_target": base["time_to_target_seconds"]["median"],
               "learn.labels": len(rows), "learn.model_tau": model["kendall_tau"], "learn.model_error": model["median_error"],
               "learn.model_scale": model["model"]["scale"], "learn.model_stale_weight": model["model"]["stale_weight"],
               "learn.model_ceiling": model["model"]["ceiling"],
               "learn.faster_step_slower_target": sum(r["verdict"].startswith("faster per step, slower") for r in rows)}
    formats = {"policy": "", "seeds": "d", "initial": ".3f", "at budget": ".3f", "to target s": ".0f", "interval": "",
               "rollout x": ".2f", "step x": ".2f", "to target x": ".2f", "verdict": "", "predicted s": ".0f"}
    return numbers, {"learning": table(frame, formats)}


def _num(value) -> str:
    return "-" if value is None or value != value else f"{value:.0f}"


__all__ = ["learning_numbers", "LEARN", "LEARN_COMMAND", "MODEL_COMMAND"]
