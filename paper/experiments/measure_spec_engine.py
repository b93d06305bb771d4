"""How much slower an engine started with speculation runs with drafting off than a plain engine, measured in the
same minutes: both engines up at once, their layout cells (real_backend.layout.measure_layout) run in turn, each
round's factor against one profile, the order flipped every round so drift reaches both alike.

    python -m paper.experiments.measure_spec_engine --rounds 3      # ~3 minutes here

Why: vLLM turns async scheduling off for n-gram speculation, so the validation's speculation world runs on another
engine than the profile's even where nothing drafts. `lssim validate --reprofile` measures that engine against the
profile minutes later (<profile>_layout1_speculating.json), which folds the machine's drift in those minutes into the
factor; this script separates the two.
"""

from __future__ import annotations

import argparse
import os
import sys

import pandas as pd


def measure(profile: str, rounds: int, length: int = 256) -> pd.DataFrame:
    """Rows: round, engine ("plain" or "speculating"), factor (its cells' makespans over `profile`'s)."""
    from lssim.loop.controller import RunConfig
    from lssim.cost import ProfiledCostModel

    from real_backend.layout import drafting_off, fit_layout, measure_layout
    from real_backend.world import RealSetup, prepare, start_engine

    base = ProfiledCostModel.from_json(profile)
    config = RunConfig(steps=1, groups_per_step=1, group_size=2, max_tokens=length)
    engines = {}
    for name, policy in (("plain", "baseline"), ("speculating", "spec_tail")):
        setup = RealSetup(temperature=0.0)  # greedy: the CPU build speculates correctly only so; both alike
        prompts, _ = prepare(setup, policy, config)
        engines[name] = start_engine(setup, prompts, seed=0)
    rows = []
    try:
        for k in range(rounds):
            for name in (("plain", "speculating") if k % 2 == 0 else ("speculating", "plain")):
                with drafting_off(engines[name]):
                    cells = measure_layout(engines[name], repeats=1, seed=k, length=length)
                rows.append({"round": k, "engine": name, "factor": fit_layout(base, cells)["factor"]})
                print(f"round {k} {name:12s} {rows[-1]['factor']:.3f}x the profile", file=sys.stderr, flush=True)
    finally:
        for engine in engines.values():
            engine.close()
    return pd.DataFrame(rows)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m paper.experiments.measure_spec_engine", description=__doc__.split("\n\n")[0])
    p.add_argument("--profile", default="paper/experiments/validation/profile.json", help="the plain engine's profile")
    p.add_argument("--rounds", type=int, default=3, help="rounds of both engines (default: 3)")
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error("--rounds must be >= 1")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    df = measure(args.profile, args.rounds)
    wide = df.pivot(index="round", columns="engine", values="factor")
    wide["speculating / plain"] = wide["speculating"] / wide["plain"]
    print(wide.round(3).to_string())
    print(f"median speculating / plain: {wide['speculating / plain'].median():.3f} over {len(wide)} rounds")
    return 0


if __name__ == "__main__":
    sys.exit(main())
