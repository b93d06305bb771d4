"""Issue 37: what hybrid's streamed pieces cost the real rollout, read from recorded modes folders, no engine.

    python -m paper.experiments.hybrid_rollout_loss paper/experiments/validation/modes41 [FOLDER ...]

Hybrid and collocated are both on-policy with the same seeds, so their runs generate the same tokens; hybrid's
rollout less collocated's, the same repeat and step, is what the pieces beside it cost the rollout. Beside it: what the
folder's streamed factor prices at most (the profile's loss per piece-second times the pieces' wall seconds up to the
rollout's end; an upper bound, since not every piece ran beside the rollout), and the update's seconds past the
rollout's end.

Measured 2026-11-28 (mean per step over 3 repeats x 5 steps):

| folder | tokens hybrid / collocated | rollout loss s | priced at most s | update past the rollout s |
|---|---|---|---|---|
| modes41 | 2569 / 2569 | 0.097 | 0.154 | 0.100 |
| modes40 | 2569 / 2569 | 0.108 | 0.135 | 0.100 |
| modes38 | 2569 / 2569 | 0.245 | 0.513 | 0.310 |

Every step's tokens are the same in both modes (45 of 45).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd


def paired_steps(folder: Path) -> pd.DataFrame:
    """One row per hybrid step beside the collocated run's same repeat and step."""
    streamed = json.loads((folder / "profile.json").read_text())["measured_by"]["shared_host"]["streamed"]
    loss_per_second = streamed.get("lost_per_piece_second", 1 - 1 / streamed["engine_slowdown"])
    rows = []
    for hybrid_run in sorted((folder / "real" / "hybrid" / "baseline").glob("repeat*")):
        hybrid = pd.read_parquet(hybrid_run / "steps.parquet")
        collocated = pd.read_parquet(folder / "real" / "collocated" / "baseline" / hybrid_run.name / "steps.parquet")
        for (_, h), (_, c) in zip(hybrid.iterrows(), collocated.iterrows()):
            beside = min(h.trainer_update_seconds, max(0.0, h.rollout_end - h.train_start))
            rows.append({"repeat": hybrid_run.name, "step": int(h.step), "tokens_hybrid": int(h.tokens),
                         "tokens_collocated": int(c.tokens), "rollout_loss": h.rollout_seconds - c.rollout_seconds,
                         "priced_at_most": loss_per_second * beside, "past_rollout": h.train_end - h.rollout_end})
    return pd.DataFrame(rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folders", nargs="+", type=Path, help="recorded `lssim validate --mode` folders (profile.json, real/)")
    args = ap.parse_args(argv)
    print("| folder | tokens hybrid / collocated | rollout loss s | priced at most s | update past the rollout s |")
    print("|---|---|---|---|---|")
    for folder in args.folders:
        d = paired_steps(folder)
        print(f"| {folder.name} | {d.tokens_hybrid.mean():.0f} / {d.tokens_collocated.mean():.0f} | "
              f"{d.rollout_loss.mean():.3f} | {d.priced_at_most.mean():.3f} | {d.past_rollout.mean():.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
