"""How late a request's first token comes when many are submitted at once, against the simulated twin's price.

    python -m paper.experiments.measure_submit_latency                 # the default world's engine; ~1 minute
    python -m paper.experiments.measure_submit_latency --rounds 8 --sizes 8,32,64

Cells of n requests (8-token random prompts, 16 tokens each) submitted at once to one instance, n from `--sizes`,
`--rounds` times each in a random order. Per n: the median and the last first token after submission, against what
the twin charges before a batch's first token (the profile's prefill of all n prompts, then one decode iteration at
n), and a line fitted to the last one's lateness: a fixed part plus a part per request submitted.

Why: the twin admits a step's requests all at once; vLLM's front end takes them one by one. Measured twice on
2026-11-27 on this 2-core VM (`--rounds 4`): the last first token came 25 ms after submitting 32 requests, 34-50 ms
after 64 and 53-59 ms after 96. How late that is against the twin depends on the profile's prefill price: against
the sixth full validation's (`--profile paper/experiments/validation/full6/profile.json`) 14 / 35 / 39 ms late, 0.8 ms +
0.44 ms per request; against the shipped profile (the default) 11 / 11 / 20 ms, 1.2 ms + 0.19 ms per request. A
step that submits many requests and ends soon pays it the most: april submits 32-64 per 0.22-0.41 s step, the
baseline 32 per 0.5 s step, which is part of why the twin puts april's speedup 15-22 points above the real one
(README, "A sixth full run"). The twin does not charge it yet.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import pandas as pd

SIZES = (4, 8, 16, 32, 64, 96)


def measure(engine, profile, sizes=SIZES, rounds: int = 4, seed: int = 3) -> pd.DataFrame:
    """One row per cell: n, the median and the last first token after submission (ms), and the twin's price (ms)."""
    from lssim.loop.core import Request
    from lssim.cost import ProfiledCostModel

    from real_backend.cells import time_cell

    base = ProfiledCostModel.from_json(profile)
    rng = np.random.default_rng(seed)
    vocab = int(getattr(engine, "vocab_size", 16))
    plan = [n for _ in range(rounds) for n in sizes]
    plan = [max(sizes)] + [plan[i] for i in rng.permutation(len(plan))]  # the first: not recorded
    rows, rid = [], 0
    for j, n in enumerate(plan):
        prompts, requests = {}, []
        for _ in range(n):
            prompts[rid] = rng.integers(0, vocab, size=8).tolist()
            requests.append(Request(rid=rid, group_id=rid, step=0, prompt_id=rid, sample_idx=0, prompt_len=8,
                                    max_tokens=16, seed=int(rng.integers(1 << 30)), instance=0))
            rid += 1
        with engine.serving_exactly(prompts):
            time_cell(engine, requests)
        if j:
            first = np.array([r.first_token_time - r.submit_time for r in requests]) * 1000
            twin = (base.prefill_time(8 * n) + base.decode_time(n, 8.0 * n, 1)) * 1000
            rows.append({"n": n, "first_median_ms": float(np.median(first)), "first_last_ms": float(first.max()),
                         "twin_ms": twin})
    return pd.DataFrame(rows)


def late_table(cells: pd.DataFrame) -> tuple[pd.DataFrame, float, float]:
    """(per n: medians over the cells and how late the median and the last first token are against the twin, ms;
    the fitted fixed part, ms; the fitted part per request, ms)."""
    t = cells.groupby("n")[["first_median_ms", "first_last_ms", "twin_ms"]].median()
    t["late_median_ms"] = t["first_median_ms"] - t["twin_ms"]
    t["late_last_ms"] = t["first_last_ms"] - t["twin_ms"]
    per_request, fixed = np.polyfit(t.index.to_numpy(float), t["late_last_ms"].to_numpy(), 1) if len(t) > 1 else (np.nan, np.nan)
    return t, float(fixed), float(per_request)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m paper.experiments.measure_submit_latency", description=__doc__.split("\n\n")[0])
    p.add_argument("--world", default="default", help="a world of real_backend/validation_workloads.toml (its instance 0)")
    p.add_argument("--rounds", type=int, default=4, help="cells of each size (default 4)")
    p.add_argument("--sizes", default=",".join(map(str, SIZES)), help="requests submitted at once, comma-separated")
    p.add_argument("--profile", default="real_backend/data/profile_cpu.json", help="the profile the twin's price comes from")
    args = p.parse_args(argv)
    try:
        sizes = tuple(int(v) for v in args.sizes.split(","))
    except ValueError:
        sizes = ()
    if not sizes or min(sizes) < 1 or args.rounds < 1:
        print("error: --sizes must be integers >= 1, comma-separated, and --rounds >= 1", file=sys.stderr)
        return 2
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    from real_backend.validation_workloads import world_arg
    from real_backend.world import world_engine

    world = world_arg(args.world)
    if world is None:
        return 2
    with world_engine(world) as (_, _, _, engine):
        cells = measure(engine, args.profile, sizes, args.rounds)
    table, fixed, per_request = late_table(cells)
    print("first token after submitting n requests at once, ms (median over cells), against the twin's price")
    print(table.round(2).to_string())
    print(f"the last first token is late by ~{fixed:.2f} ms + {per_request:.3f} ms per request submitted")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
