"""Issue 37: each execution mode's twin against its real runs, recording by recording, with the twin as it is now:
the noise ratio, the twin's total step time against the measured (%), the same less collocated's (the machine's level
in those minutes, which every mode shares), and the speedup error over collocated (points). From recorded folders
(`lssim validate --mode ... --out DIR`), no engine; each folder is replayed as `lssim validate --mode any --runs
DIR/real/*/*/repeat* --profile DIR/profile.json` replays it.

    python -m paper.experiments.modes_bias paper/experiments/validation/modes44t paper/experiments/validation/modes44p \
        paper/experiments/validation/modes45t paper/experiments/validation/modes45p

The folders' runs say whether the trainer ran in a process of its own (meta.json setup.trainer_process): the
table's `trainer` column. Last, every mode pooled over the folders as the twin now prices them (the table
`python -m lssim.analysis.fidelity --pool` prints for the folders replayed; lssim.analysis.fidelity.modes.pool_rows).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd


def folder_rows(folder: Path) -> tuple[list[dict], pd.DataFrame]:
    """One row per mode of a recorded folder, replayed with the twin as it is now, and the replay's summary (as
    `lssim validate --mode any --runs ... --out` writes it)."""
    from real_backend.validate_modes import DEFAULT_TRAIN_PROFILE, compare_modes
    from real_backend.validate_twin import load_recorded

    runs = [load_recorded(p) for p in sorted(folder.glob("real/*/*/repeat*"))]
    if not runs:
        raise SystemExit(f"{folder}: no recorded runs under real/<mode>/<policy>/repeat<k>")
    frames = compare_modes(runs, str(folder / "profile.json"), str(DEFAULT_TRAIN_PROFILE))
    by_repeat = frames["steps_by_repeat"]
    by_repeat = by_repeat[by_repeat["in_twin"]]
    sums = by_repeat.groupby("mode")[["predicted_seconds", "measured_seconds"]].sum()
    total = (sums["predicted_seconds"] / sums["measured_seconds"] - 1) * 100
    process = {json.loads((Path(r.folder) / "meta.json").read_text())["setup"].get("trainer_process", False) for r in runs}
    rows = []
    for _, r in frames["summary"].iterrows():
        rows.append({"folder": folder.name, "trainer": "process" if process == {True} else "thread", "mode": r["mode"],
                     "noise_ratio": r["noise_ratio"], "total_pct": total[r["mode"]],
                     "speedup_error": r["speedup_error_points"]})
    level = next(row["total_pct"] for row in rows if row["mode"] == "collocated")
    for row in rows:
        row["beyond_collocated_pct"] = row["total_pct"] - level
    return rows, frames["summary"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folders", nargs="+", type=Path)
    args = ap.parse_args(argv)
    from lssim.analysis.fidelity.modes import pool_rows, pooled_text, summary_rows

    replayed = {f.name: folder_rows(f) for f in args.folders}
    table = pd.DataFrame([row for rows, _ in replayed.values() for row in rows])
    pooled = pooled_text(pool_rows(pd.concat([summary_rows(summary, name) for name, (_, summary) in replayed.items()],
                                             ignore_index=True)), len(replayed), "as the twin now prices them")
    print("| folder | trainer | mode | noise ratio | twin's total vs measured % | beyond collocated's % | speedup error (points) |")
    print("|---|---|---|---|---|---|---|")
    for _, r in table.iterrows():
        print(f"| {r['folder']} | {r['trainer']} | {r['mode']} | {r['noise_ratio']:.2f} | {r['total_pct']:+.1f} | "
              f"{r['beyond_collocated_pct']:+.1f} | {r['speedup_error']:+.1f} |")
    means = table.groupby(["trainer", "mode"])[["beyond_collocated_pct", "speedup_error"]].mean().round(1)
    print("\nmean per trainer and mode:\n" + means.to_string(), file=sys.stderr)
    print("\n" + pooled, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
