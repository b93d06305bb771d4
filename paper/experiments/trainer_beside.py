"""Issue 37: the trainer's slow-down beside a rollout, as the profile measured it and as the runs show it, and each
mode's twin at both. From recorded modes folders (`lssim validate --mode ... --out DIR`), no engine.

    python -m paper.experiments.trainer_beside paper/experiments/validation/modes48p paper/experiments/validation/modes50p

The runs' own factor: a disaggregated run's update over a collocated run's in the steps where both trained the same
tokens (on-policy collocated and one-step-off disaggregated start from the same weights and seeds, so their first
batches, and often later ones, are the same), the median over those steps of the repeats' medians; in such a step
the update runs beside the next rollout throughout. The profile's factor: `measured_by.shared_host.trainer_slowdown`
of the folder's profile.json (real_backend/host_sharing.py), what the twin prices with. Each folder is then replayed
(`real_backend.validate_modes.compare_modes`) with either, everything else as recorded.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import numpy as np
import pandas as pd


def runs_factor(runs) -> tuple[float, list[int]]:
    """The runs' own trainer factor and the steps it was read from (the same trained tokens in both modes)."""
    def medians(mode: str, column: str) -> np.ndarray:
        frames = [r.steps[column].to_numpy(float) for r in runs if r.meta["mode"]["mode"] == mode]
        if not frames:
            raise SystemExit(f"no {mode} runs: the factor needs collocated and disaggregated runs of one recording")
        return np.median(np.vstack(frames), axis=0)

    same = np.flatnonzero(medians("disaggregated", "trainer_tokens") == medians("collocated", "trainer_tokens"))
    ratio = medians("disaggregated", "update_seconds")[same] / medians("collocated", "update_seconds")[same]
    return float(np.median(ratio)), [int(s) for s in same]


def replayed(runs, profile: str, trainer_slowdown: float | None) -> pd.DataFrame:
    """compare_modes' summary per mode, the host's trainer factor replaced where given."""
    from real_backend import validate_modes

    host_pricing = validate_modes.host_pricing

    def priced(runs_, profile_):
        share, driver, said = host_pricing(runs_, profile_)
        if trainer_slowdown is not None:
            share = dataclasses.replace(share, trainer_slowdown=trainer_slowdown)
        return share, driver, said

    validate_modes.host_pricing = priced
    try:
        frames = validate_modes.compare_modes(runs, profile, str(validate_modes.DEFAULT_TRAIN_PROFILE))
    finally:
        validate_modes.host_pricing = host_pricing
    return frames["summary"].set_index("mode")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m paper.experiments.trainer_beside", description=__doc__.split("\n\n")[0])
    p.add_argument("folders", nargs="+", type=Path, help="recorded modes folders (profile.json, real/<mode>/<policy>/repeat<k>)")
    args = p.parse_args(argv)
    from real_backend.validate_twin import load_recorded

    rows = []
    for folder in args.folders:
        runs = [load_recorded(f) for f in sorted(folder.glob("real/*/*/repeat*"))]
        profile = folder / "profile.json"
        own, steps = runs_factor(runs)
        measured = json.loads(profile.read_text())["measured_by"]["shared_host"]["trainer_slowdown"]
        at = {"profile": replayed(runs, str(profile), None), "runs": replayed(runs, str(profile), own)}
        for mode in at["profile"].index:
            rows.append({"folder": folder.name, "trainer x profile": round(measured, 2), "trainer x runs": round(own, 2),
                         "steps": ",".join(map(str, steps)), "mode": mode,
                         **{f"{k} {c}": round(float(at[k].loc[mode, col]), 2) for k in at
                            for c, col in (("noise ratio", "noise_ratio"), ("signed %", "step_median_signed_pct"),
                                           ("speedup error", "speedup_error_points"))}})
    print(pd.DataFrame(rows).to_string(index=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
