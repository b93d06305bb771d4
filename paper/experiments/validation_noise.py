"""How much of the real-engine validation's error is the machine's noise, and does the speed probe help, pooled
over every validation whose outputs are kept.

    python -m paper.experiments.validation_noise                       # the pooled folders of validations.toml
    python -m paper.experiments.validation_noise runs/v1 runs/v2       # any `lssim validate --out` folders

Per folder and policy: the step error (median / p90 %) with the profile alone and at the probed speed level
(summary.csv), and the noise floor, what an exact model would score against the same repeats
(lssim.analysis.fidelity.noise_floor, from steps_by_repeat.parquet), with the repeats it would need to meet the goal. Then,
over all rows: how often each prediction meets the goal, and its typical error; and how often a speedup error is
within the goal, and within the 95% bound of an exact model's speedup error (lssim.analysis.fidelity.speedup_noise_floor).
Nothing is replayed: it reads the folders' files, so it runs in seconds without vLLM.
"""

from __future__ import annotations

import argparse
import sys
import tomllib
from pathlib import Path

import numpy as np
import pandas as pd

from lssim.analysis.fidelity.compare import finish_profile
from lssim.analysis.fidelity.noise import TARGET_SPEEDUP_POINTS, step_errors_within_goal
from lssim.analysis.fidelity.pool import read_folder

MANIFEST = Path(__file__).with_name("validations.toml")


def manifest(path=MANIFEST) -> list[dict]:
    """The entries of the validation manifest (validations.toml), in its order: name, path, command, date, commit,
    measured, pooled, and where known headline and note."""
    with open(path, "rb") as f:
        return tomllib.load(f)["validation"]


def pooled_folders(path=MANIFEST) -> list[str]:
    """The folders the manifest marks pooled, as paths from the repository root, in its order."""
    return [entry["path"] for entry in manifest(path) if entry["pooled"]]


def folder_table(folder) -> pd.DataFrame:
    """One row per policy of a validation folder (read by lssim.analysis.fidelity.pool.read_folder): its errors, its
    noise floor and whether it meets the goal."""
    read = read_folder(folder)
    summary = read.summary
    out = pd.DataFrame({"world": summary["world"],
                        "median": summary["makespan_median_ape_pct"], "p90": summary["makespan_p90_ape_pct"],
                        "probed_median": summary.get("probed_median_ape_pct", np.nan),
                        "probed_p90": summary.get("probed_p90_ape_pct", np.nan),
                        "speedup_error": summary.get("speedup_error_points", np.nan),
                        **{c: summary.get(c, np.nan) for c in ("speedup_noise_floor_points", "speedup_noise_bound_points")}
                        }).join(read.exact_model())
    speedup_ok = out["speedup_error"].abs().fillna(0) <= TARGET_SPEEDUP_POINTS
    out["meets"] = step_errors_within_goal(out["median"], out["p90"]) & speedup_ok
    out["meets_probed"] = step_errors_within_goal(out["probed_median"], out["probed_p90"]) & speedup_ok
    out["exact_would_meet"] = step_errors_within_goal(out["noise_floor_median_pct"], out["noise_floor_p90_pct"])
    return out.assign(folder=str(read.path))


def speedups_pooled(rows: pd.DataFrame) -> pd.DataFrame:
    """Over the policies of every folder (baselines have no speedup error): how often the speedup error is within
    the goal, and within the 95% bound of an exact model's (lssim.analysis.fidelity.speedup_noise_floor), beside how often an
    exact model would typically be within the goal on those repeats."""
    r = rows.dropna(subset=["speedup_error", "speedup_noise_bound_points"])
    err = r["speedup_error"].abs()
    return pd.DataFrame([{"policies": len(r), "median |error| (points)": err.median(),
                          "exact model's typical (points)": r["speedup_noise_floor_points"].median(),
                          "exact model's 95% bound (points)": r["speedup_noise_bound_points"].median(),
                          f"within {TARGET_SPEEDUP_POINTS:.0f} points": int((err <= TARGET_SPEEDUP_POINTS).sum()),
                          "within the bound": int((err <= r["speedup_noise_bound_points"]).sum()),
                          "within either": int(((err <= TARGET_SPEEDUP_POINTS) | (err <= r["speedup_noise_bound_points"])).sum()),
                          f"exact model typically within {TARGET_SPEEDUP_POINTS:.0f}":
                              int((r["speedup_noise_floor_points"] <= TARGET_SPEEDUP_POINTS).sum())}]).set_index("policies")


def pooled(rows: pd.DataFrame) -> pd.DataFrame:
    """Over all rows (policies and baselines of every folder): the typical error of each prediction and how often
    it meets the goal, beside the exact model's."""
    probed = rows.dropna(subset=["probed_median"])
    return pd.DataFrame([
        {"prediction": "profile alone", "rows": len(probed), "median of medians %": probed["median"].median(),
         "mean of medians %": probed["median"].mean(), "median of p90s %": probed["p90"].median(),
         "meets the goal": int(probed["meets"].sum())},
        {"prediction": "at the probed level", "rows": len(probed), "median of medians %": probed["probed_median"].median(),
         "mean of medians %": probed["probed_median"].mean(), "median of p90s %": probed["probed_p90"].median(),
         "meets the goal": int(probed["meets_probed"].sum())},
        {"prediction": "an exact model (noise floor)", "rows": len(probed),
         "median of medians %": probed["noise_floor_median_pct"].median(),
         "mean of medians %": probed["noise_floor_median_pct"].mean(),
         "median of p90s %": probed["noise_floor_p90_pct"].median(),
         "meets the goal": int(probed["exact_would_meet"].sum())},
    ]).set_index("prediction")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m paper.experiments.validation_noise", description=__doc__.split("\n\n")[0])
    p.add_argument("folders", nargs="*", help="`lssim validate --out` folders (default: those validations.toml pools that exist)")
    args = p.parse_args(argv)
    folders = args.folders or [f for f in pooled_folders() if Path(f, "summary.csv").is_file()]
    try:
        rows = pd.concat([folder_table(f) for f in folders])
    except ValueError as e:
        print(f"validation_noise: {e}", file=sys.stderr)
        return 2
    cols = ["world", "median", "p90", "probed_median", "probed_p90", "noise_floor_median_pct", "noise_floor_p90_pct",
            "repeats_for_goal", "meets", "meets_probed", "speedup_error", "speedup_noise_bound_points"]
    with pd.option_context("display.width", 200, "display.max_rows", 500):
        for folder, t in rows.groupby("folder", sort=False):
            print(f"\n{folder}: step error median / p90 % (profile alone; at the probed level), an exact model's, the "
                  f"repeats it needs for the goal; the speedup error (points) and an exact model's 95% bound")
            print(t[cols].to_string(float_format=lambda v: f"{v:.1f}"))
        print(f"\npooled over {len(folders)} validations (rows with a probed level):")
        print(pooled(rows).to_string(float_format=lambda v: f"{v:.2f}"))
        print(f"\nspeedups, pooled over the same validations (policies with a baseline in their world):")
        print(speedups_pooled(rows).to_string(float_format=lambda v: f"{v:.1f}"))
        for folder in folders:  # where in a step the twin is off, where the responses were kept
            if Path(folder, "responses.parquet").is_file():
                print(f"\n{folder}: measured / predicted finish time, by where a response finished in its step "
                      f"(lssim.analysis.fidelity.finish_profile)")
                print(finish_profile(pd.read_parquet(Path(folder, "responses.parquet"))).to_string(float_format=lambda v: f"{v:.3f}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
