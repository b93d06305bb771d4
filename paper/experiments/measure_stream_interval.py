"""What per-token streaming costs a two-instance rollout: the world's baseline recorded with vLLM sending each
request's tokens every N (SamplingParams.stream_interval) instead of every token.

    python -m paper.experiments.measure_stream_interval            # placed_history, N = 1, 8, 32, 4 rounds; ~4 minutes

Each round records the world's baseline once per N on one engine (interleaved, so the machine's drift reaches every N
alike). Printed per N, the median over the rounds: the rollout seconds (summed over the run's steps), the driver's
CPU per wall-second (psutil; the trainer is in it), and the std of instance 0's last finish minus instance 1's per
step (paper.experiments.measure_driver_core.instance_ends); and in how many rounds N's rollout was shorter than N = 1's.

Why: every token of every request wakes the driver (vLLM's output handler, one drain task per request, the
controller's queue), on a host where the driver shares its cores with the instances (real_backend/README.md, "Two
instances on one host"). The engine streams every token (N = 1): with N > 1 the controller would see each request's
tokens up to N-1 late, and an abort would lose up to N-1 generated tokens, which the simulated twin does not model.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import pandas as pd


def measure(world, intervals: list[int], rounds: int) -> pd.DataFrame:
    """One row per recorded run: interval, round, rollout_s, driver_cpu, finish_diff_std."""
    from .measure_cpu_share import share
    from .measure_driver_core import instance_ends
    from real_backend.world import prepare, run_real, world_engine

    rows = []
    with world_engine(world) as (setup, config, _, engine), tempfile.TemporaryDirectory() as scratch:
        prompts, policy = prepare(setup, "baseline", config)  # a throwaway run: first batches of a shape cost more
        run_real(setup, policy, config, f"{scratch}/warm", engine=engine, prompts=prompts)
        try:
            for k in range(rounds):
                for n in intervals:
                    engine.sampling_kwargs["stream_interval"] = n
                    prompts, policy = prepare(setup, "baseline", config)
                    out = f"{scratch}/{n}-{k}"
                    _, cpu = share(lambda: run_real(setup, policy, config, out, engine=engine, prompts=prompts))
                    steps = pd.read_parquet(f"{out}/steps.parquet")
                    ends = instance_ends(pd.read_parquet(f"{out}/trace.parquet"))
                    rows.append({"interval": n, "round": k, "rollout_s": steps["rollout_seconds"].sum(),
                                 "driver_cpu": cpu.get("driver"), "finish_diff_std": ends["diff"].std()})
                    print(f"N={n:3d} round {k}: rollout {rows[-1]['rollout_s']:.2f} s", flush=True)
        finally:
            engine.sampling_kwargs.pop("stream_interval", None)
    return pd.DataFrame(rows)


def summary(rows: pd.DataFrame) -> pd.DataFrame:
    """Per interval: the medians over the rounds, and the rounds whose rollout was shorter than the first interval's."""
    out = rows.groupby("interval")[["rollout_s", "driver_cpu", "finish_diff_std"]].median()
    first = rows[rows["interval"] == rows["interval"].iloc[0]].set_index("round")["rollout_s"]
    out["rounds_faster_than_first"] = [
        f"{int((g.set_index('round')['rollout_s'] < first.reindex(g['round']).values).sum())} of {len(g)}"
        for _, g in rows.groupby("interval")]
    return out.round(3)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m paper.experiments.measure_stream_interval", description=__doc__.split("\n\n")[0])
    p.add_argument("--world", default="placed_history", help="a world of two instances (default placed_history)")
    p.add_argument("--intervals", default="1,8,32", help="the stream intervals N, comma-separated (default 1,8,32)")
    p.add_argument("--rounds", type=int, default=4, help="runs per interval (default 4)")
    args = p.parse_args(argv)
    try:
        intervals = [int(x) for x in args.intervals.split(",")]
    except ValueError:
        intervals = []
    if not intervals or min(intervals) < 1:
        print(f"error: --intervals {args.intervals!r}: give whole numbers >= 1, comma-separated", file=sys.stderr)
        return 2
    if args.rounds < 1:
        print("error: --rounds must be >= 1", file=sys.stderr)
        return 2
    from real_backend.validation_workloads import world_arg

    world = world_arg(args.world, 2)
    if world is None:
        return 2
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    print(summary(measure(world, intervals, args.rounds)).to_string())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
