"""How much an engine instance slows down beside another one on the same host, by how loaded the other one is.

    python -m paper.experiments.measure_neighbour              # the placed world's two instances; ~1 minute
    python -m paper.experiments.measure_neighbour --rounds 8 --out runs/neighbour.parquet
    python -m paper.experiments.measure_neighbour --grid --rounds 2   # every pair of loads 1..32 x 0..32; ~2 minutes

Instance 0 runs the same cell every time, 2 requests of 256 tokens (the few sequences a step's tail leaves on an
instance), while instance 1 is idle ("alone"), runs 2 requests of 256 tokens ("light"), 16 of 256 ("heavy"), or 16 of
40 and then idles ("stagger": instance 0 alone after a busy start, as in a step's tail). The kinds run in a random
order, `--rounds` times each. Printed: instance 0's median iteration time (paper.experiments.measure_run_vs_cell's
IterationLog) while the other instance produced tokens within 10 ms ("beside a busy one") and while it did not.

Why: the simulated twin of a two-instance world (lssim.sim.shared_host) slows every busy instance by one factor s_2 however
busy the other one is. Measured 2026-11-27 on this 2-core VM (`--rounds 5`): instance 0 iterates in 2.09 ms alone,
3.08 ms beside a light instance (1.5x), 3.89 ms beside a heavy one (1.9x), and 2.27 ms once the other has finished
("stagger", 1.09x). The layout's cells (real_backend/layout.py) load both instances alike, so they cannot tell light
from heavy. The twin keeps its one factor: one that grows with the other instances' running sequences (fitted to these
ratios) did not predict two recorded validations' runs better when they were replayed with it (issue 16's note).

`--grid`: every pair of loads, n0 <= n1 sequences of 256 tokens on the two instances (1, 2, 4, ..., 32; and each n0
alone), and every iteration of both instances with the other's running sequences at its start. Printed: the median
ms per iteration by (own sequences, the other's), and over alone. Measured twice 2026-11-27 (`--grid --rounds 2`, 55
cells in ~1 minute each): beside one to four sequences an instance runs 1.43-1.67x slower than alone (median over its
own loads), beside 16 or 32, 1.84-2.24x; the dependence on its own load is weaker and noisy. Against the profile an instance
alone iterates at 0.90-1.07x its price at every load, where the layout's makespan fit says s_1 = 1.28 (a makespan
also pays prefills, departures and the scheduler's gaps, which an iteration median leaves out). A twin priced with
this grid, anchored to the layout's s_1 and s_2, moved seer's error around rather than down when three recorded
validations were replayed with it (issue 16's note), so the twin keeps s_b.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import pandas as pd

KINDS = {  # instance 1's load: (requests, tokens each); instance 0 always runs 2 x 256
    "alone": (0, 0),
    "light": (2, 256),
    "heavy": (16, 256),
    "stagger": (16, 40),
}
MINE = (2, 256)
BUSY_WITHIN = 0.01  # seconds: the other instance is busy if it produced a token this close to an iteration's start


def measure(engine, rounds: int, seed: int = 5):
    """Run every kind `rounds` times (random order) on a two-instance engine: (cells, iterations). cells: kind, round,
    instance-0 and instance-1 makespans; iterations: IterationLog's rows of instance 0, each with `other_busy`."""
    from lssim.loop.core import Request

    from real_backend.cells import time_cell
    from .measure_run_vs_cell import IterationLog

    rng = np.random.default_rng(seed)
    vocab = int(getattr(engine, "vocab_size", 16))
    log = IterationLog(engine)
    plan = [kind for _ in range(rounds) for kind in KINDS]
    plan = [plan[i] for i in rng.permutation(len(plan))]  # drift must not pass for a kind's effect
    plan = ["heavy"] + plan  # not recorded: an engine's first batches of a new shape pay for kernels and allocations
    cells, rid = [], 0
    for j, kind in enumerate(plan):
        prompts, requests = {}, []
        for inst, (n, tokens) in ((0, MINE), (1, KINDS[kind])):
            for _ in range(n):
                prompts[rid] = rng.integers(0, vocab, size=8).tolist()
                requests.append(Request(rid=rid, group_id=rid, step=0, prompt_id=rid, sample_idx=0, prompt_len=8,
                                        max_tokens=tokens, seed=int(rng.integers(1 << 30)), instance=inst))
                rid += 1
        log.tag = f"{kind}.{j}" if j else None
        with engine.serving_exactly(prompts):
            finish = time_cell(engine, requests)
        log.tag = None
        if j:
            ends = [max((finish[r.rid] for r in requests if r.instance == i), default=0.0) for i in (0, 1)]
            cells.append({"kind": kind, "cell": j, "instance0_seconds": ends[0], "instance1_seconds": ends[1]})
    return pd.DataFrame(cells), with_other_busy(log)


GRID_SIZES = (1, 2, 4, 8, 16, 32)


def measure_grid(engine, rounds: int, sizes=GRID_SIZES, seed: int = 7) -> pd.DataFrame:
    """Cells of n0 and n1 requests of 256 tokens on instances 0 and 1 (every n0 <= n1 of `sizes`, and every n0 with
    the other idle), each `rounds` times in a random order: `with_other_load`'s iterations."""
    from lssim.loop.core import Request

    from real_backend.cells import time_cell
    from .measure_run_vs_cell import IterationLog

    rng = np.random.default_rng(seed)
    vocab = int(getattr(engine, "vocab_size", 16))
    log = IterationLog(engine)
    plan = [(a, b) for _ in range(rounds) for a in sizes for b in (0, *sizes) if b == 0 or a <= b]
    plan = [(max(sizes), max(sizes))] + [plan[i] for i in rng.permutation(len(plan))]  # the first: not recorded
    rid = 0
    for j, loads in enumerate(plan):
        prompts, requests = {}, []
        for inst, n in enumerate(loads):
            for _ in range(n):
                prompts[rid] = rng.integers(0, vocab, size=8).tolist()
                requests.append(Request(rid=rid, group_id=rid, step=0, prompt_id=rid, sample_idx=0, prompt_len=8,
                                        max_tokens=256, seed=int(rng.integers(1 << 30)), instance=inst))
                rid += 1
        log.tag = f"{loads[0]}_{loads[1]}.{j}" if j else None
        with engine.serving_exactly(prompts):
            time_cell(engine, requests)
        log.tag = None
    return with_other_load(log)


def with_other_load(log) -> pd.DataFrame:
    """Every iteration of both instances (IterationLog.iterations) with other_n: the sequences of the other
    instance's latest iteration while that one still produces tokens (from its first token, less BUSY_WITHIN, as the
    instances of a cell start together, to its last), else 0."""
    it = log.iterations()
    tokens = pd.DataFrame(log.rows, columns=["tag", "instance", "t", "key"]).groupby(["tag", "instance"])["t"]
    first, last = tokens.min(), tokens.max()
    other_n = np.zeros(len(it), int)
    for (tag, inst), idx in it.groupby(["tag", "instance"]).groups.items():
        other = it[(it["tag"] == tag) & (it["instance"] != inst)].sort_values("t")
        if other.empty:
            continue
        key = (tag, other["instance"].iloc[0])
        t = it.loc[idx, "t"].to_numpy()
        j = np.clip(np.searchsorted(other["t"].to_numpy(), t, side="right") - 1, 0, len(other) - 1)
        running = (t >= first[key] - BUSY_WITHIN) & (t <= last[key])
        other_n[it.index.get_indexer(idx)] = np.where(running, other["n_seqs"].to_numpy()[j], 0)
    return it.assign(other_n=other_n)


def grid_table(iterations: pd.DataFrame, sizes=GRID_SIZES) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(median ms per iteration by own sequences x the other's, the same over each row's alone column): only the
    grid's loads (an instance draining its cell, or an iteration that caught half a burst, is not one of them)."""
    it = iterations[iterations["n_seqs"].isin(sizes) & iterations["other_n"].isin((0, *sizes))]
    ms = it.groupby(["n_seqs", "other_n"])["seconds"].median().unstack() * 1000
    return ms, ms.div(ms[0], axis=0) if 0 in ms else ms * np.nan


def with_other_busy(log) -> pd.DataFrame:
    """Instance 0's iterations, each marked `other_busy` when instance 1 produced a token within BUSY_WITHIN of its start."""
    rows = pd.DataFrame(log.rows, columns=["tag", "instance", "t", "key"])
    it = log.iterations()
    it = it[it["instance"] == 0].copy()
    busy = np.zeros(len(it), bool)
    for tag, idx in it.groupby("tag").groups.items():
        other = np.sort(rows.loc[(rows["tag"] == tag) & (rows["instance"] == 1), "t"].to_numpy())
        if len(other):
            t = it.loc[idx, "t"].to_numpy()
            j = np.clip(np.searchsorted(other, t), 1, len(other) - 1) if len(other) > 1 else np.zeros(len(t), int)
            near = np.minimum(np.abs(t - other[np.maximum(j - 1, 0)]), np.abs(other[j] - t))
            busy[it.index.get_indexer(idx)] = near < BUSY_WITHIN
    it["other_busy"] = busy
    it["kind"] = it["tag"].str.split(".").str[0]
    return it


def table(iterations: pd.DataFrame) -> pd.DataFrame:
    """Median ms per iteration of instance 0 by kind, beside a busy instance and not, with the iterations counted."""
    g = iterations.groupby(["kind", "other_busy"])["seconds"]
    return pd.DataFrame({"median_ms": g.median() * 1000, "iterations": g.size()}).round(2)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m paper.experiments.measure_neighbour", description=__doc__.split("\n\n")[0])
    p.add_argument("--world", default="placed", help="a world of two instances in real_backend/validation_workloads.toml")
    p.add_argument("--rounds", type=int, default=5, help="cells of each kind (default 5)")
    p.add_argument("--out", help="also write the iterations here (parquet)")
    p.add_argument("--grid", action="store_true", help="every pair of loads 1..32 (module docstring)")
    args = p.parse_args(argv)
    if args.rounds < 1:
        print("error: --rounds must be >= 1", file=sys.stderr)
        return 2
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    from real_backend.validation_workloads import world_arg
    from real_backend.world import world_engine

    world = world_arg(args.world, 2)
    if world is None:
        return 2
    if args.grid:
        with world_engine(world) as (_, _, _, engine):
            iterations = measure_grid(engine, args.rounds)
        ms, over_alone = grid_table(iterations)
        print("median ms per iteration, by the instance's sequences (rows) and the other's (columns; 0: idle)")
        print(ms.round(2).to_string())
        print("\nover the same instance alone\n" + over_alone.round(2).to_string())
        print("\nmedian over own loads: " + ", ".join(f"beside {m}: {v:.2f}x" for m, v in over_alone.median().items() if m))
    else:
        with world_engine(world) as (_, _, _, engine):
            cells, iterations = measure(engine, args.rounds)
        _print_kinds(cells, iterations)
    if args.out:
        from lssim.results import atomic_write

        atomic_write(args.out, lambda path: iterations.to_parquet(path, index=False))
    return 0


def _print_kinds(cells: pd.DataFrame, iterations: pd.DataFrame) -> None:
    print("instance 0 (2 x 256 tokens): median ms per iteration, by what instance 1 ran")
    print(table(iterations).to_string())
    print("\nmakespans, median s:\n" + cells.groupby("kind")[["instance0_seconds", "instance1_seconds"]].median().round(3).to_string())


if __name__ == "__main__":
    raise SystemExit(main())
