"""Issue 37: how much of async's speedup error is the groups its last step trains? From recorded modes folders, no
engine: per folder, async's groups trained per run at the last step, measured and in the twin (modes_steps_by_repeat
.parquet), the responses dropped stale at that step in both (the twin replayed), and async's speedup over collocated
(total seconds over total groups, sums, not the summary's medians of steps) with the twin's groups, with the runs' own,
and over the steps before the last.

    python -m paper.experiments.async_groups paper/experiments/validation/modes52p [FOLDER ...]

Measured 2026-11-29 on modes52p-56p: the twin trains 1-2 more groups per run at the last step (modes56p: 5 / 7 / 4
measured, 6 / 8 / 8 in the twin) and its last step drops fewer responses stale (modes56p: 12 / 4 / 16 measured, 8 /
0 / 0 in the twin): more of the real runs' responses are still in flight when the weights arrive, as their slower
rollouts would leave them. Async's speedup error on the mean of the five, these sums: +7.3 points with the twin's
groups, +2.7 with the runs' own; over the steps before the last, +6.7 (so the last step's count is not all of it).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd


def _speedup_error(steps: pd.DataFrame, groups: str) -> float:
    """Async's predicted minus measured speedup over collocated, in points: seconds per group, summed over `steps`,
    the predicted side over `groups` ("predicted_groups" or the runs' "measured_groups")."""
    s = steps.groupby("mode")[list(dict.fromkeys(["measured_seconds", "predicted_seconds", "measured_groups", groups]))].sum()
    measured = (s.measured_seconds / s.measured_groups).loc[["collocated", "async"]]
    predicted = (s.predicted_seconds / s[groups]).loc[["collocated", "async"]]
    return 100 * (predicted["collocated"] / predicted["async"] - measured["collocated"] / measured["async"])


def last_step_drops(folder: Path) -> tuple[list[int], list[int]]:
    """Responses dropped stale at async's last step, per run: measured and in the twin (replayed as validated)."""
    from lssim.analysis.fidelity.run import replay_run
    from real_backend.validate_modes import DEFAULT_TRAIN_PROFILE, host_pricing, mode_sim_setup
    from real_backend.validate_twin import load_recorded, run_prompts

    profile = str(folder / "profile.json")
    runs = [load_recorded(p) for p in sorted((folder / "real").glob("*/baseline/repeat*"))]
    share, driver, _ = host_pricing(runs, profile)
    measured, twin = [], []
    for run in [r for r in runs if (r.meta.get("mode") or {}).get("mode") == "async"]:
        replayed = replay_run(run, mode_sim_setup(run, profile, str(DEFAULT_TRAIN_PROFILE), share, driver),
                              run_prompts(run)).steps
        measured.append(int(run.steps["dropped_stale"].iloc[-1]))
        twin.append(int(replayed["dropped_stale"].iloc[-1]))
    return measured, twin


def folder_row(folder: Path) -> dict:
    steps = pd.read_parquet(folder / "modes_steps_by_repeat.parquet")
    last = steps[(steps["mode"] == "async") & (steps.step == steps.step.max())].sort_values("repeat")
    dropped, dropped_twin = last_step_drops(folder)
    return {"folder": folder.name, "last step groups": " / ".join(map(str, last.measured_groups.astype(int))),
            "twin": " / ".join(map(str, last.predicted_groups.astype(int))),
            "dropped stale": " / ".join(map(str, dropped)), "twin dropped": " / ".join(map(str, dropped_twin)),
            "error, twin's groups": _speedup_error(steps, "predicted_groups"),
            "error, runs' groups": _speedup_error(steps, "measured_groups"),
            "error, before the last step": _speedup_error(steps[steps.step < steps.step.max()], "predicted_groups")}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m paper.experiments.async_groups", description=__doc__.split("\n\n")[0])
    p.add_argument("folders", nargs="+", type=Path, help="modes folders (lssim validate --mode ... --out)")
    rows = pd.DataFrame([folder_row(f) for f in p.parse_args(argv).folders])
    print(rows.round(1).to_string(index=False))
    means = rows[["error, twin's groups", "error, runs' groups", "error, before the last step"]].mean()
    print("\nmean speedup error, points: " + ", ".join(f"{name.removeprefix('error, ')} {v:+.1f}" for name, v in means.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
