"""How long a full garbage collection stops the token streams, in the driver and in vLLM's worker processes, with
the heap as Python leaves it and frozen.

    python -m paper.experiments.measure_gc_stall                  # the default world (one instance), 2 rounds; ~1 minute
    python -m paper.experiments.measure_gc_stall --world placed   # two instances

Each rollout submits 16 requests of 256 tokens on the world's engine, and 0.3 s in another thread forces
gc.collect(), in the driver or in every instance's worker at once (collective_rpc); printed: how long the collection
took and the largest gap between two items of the token streams (real_backend.engine's queue), with every heap as
Python leaves it (gc.unfreeze) and after VLLMEngine.freeze_heaps().

Why: once vLLM and torch are loaded the driver and each worker hold 0.7-0.9 million objects, and a collection holds
its process's GIL while it scans them: in the driver the thread that drains the streams waits, in a worker its
instance stops generating. Python starts such a full collection by itself now and then: 5 of 5280 steps recorded
before the fix began with every first token 0.37-0.75 s late on every instance at once (`runs/*/real`), and in 3
steps of seer runs one instance made no progress for 0.5-1.0 s while the other's tokens kept arriving.

Measured 2026-11-27 on this 2-core VM (this script), the collection's seconds and the streams' largest gap:

| world | where | heap as left | frozen |
|---|---|---|---|
| default (1 instance) | driver | 0.46-0.48 s, gap 0.47-0.49 s | under 1 ms, gap 0.005-0.006 s |
| placed (2 instances) | driver | 0.83-1.32 s, gap 0.85-1.36 s | under 1 ms, gap 0.007-0.009 s |
| placed (2 instances) | workers | 0.55-0.58 s, gap 0.44-0.46 s | under 1 ms, gap 0.008 s |

A gap of 5-9 ms is the streams' usual spacing. Engines and real runs now freeze every heap
(real_backend.engine.freeze_heap, VLLMEngine.freeze_heaps).
"""

from __future__ import annotations

import argparse
import gc
import itertools
import os
import queue
import sys
import threading
import time


def _worker_collect(worker) -> float:
    """gc.collect() in a vLLM worker process (run there by collective_rpc): the seconds it took."""
    t = time.monotonic()
    gc.collect()
    return time.monotonic() - t


def _worker_unfreeze(worker) -> None:
    gc.unfreeze()


def rollout_with_a_collection(engine, prompts, rid0: int, where: str = "driver", at: float = 0.3) -> tuple[float, float]:
    """(seconds the forced gc.collect() took, the largest gap between stream items) over one rollout; `where`: in
    the driver, or in every instance's worker at once ("workers"; the seconds are the first worker's)."""
    from lssim.loop.core import Request

    stamps: list[float] = []

    class Stamped(queue.SimpleQueue):  # the engine's stream queue, each item's arrival time noted
        def put(self, item, block=True, timeout=None):
            stamps.append(time.monotonic())
            super().put(item)

    engine._q = Stamped()
    ids = sorted(prompts.prompts)[:16]
    engine.submit([Request(rid=rid0 + i, group_id=i, step=0, prompt_id=p, sample_idx=0, prompt_len=prompts.prompt_len(p),
                           max_tokens=256, seed=i) for i, p in enumerate(ids)])
    took: list[float] = []

    def collect():
        time.sleep(at)
        if where == "workers":
            took.append(engine._call(engine._llm.collective_rpc(_worker_collect))[0])
            return
        t = time.monotonic()
        gc.collect()
        took.append(time.monotonic() - t)

    thread = threading.Thread(target=collect)
    thread.start()
    while engine.next_events():
        pass
    thread.join()
    return took[0], max(b - a for a, b in zip(stamps, stamps[1:]))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m paper.experiments.measure_gc_stall", description=__doc__.split("\n\n")[0])
    p.add_argument("--world", default="default", help="the validation world (real_backend/validation_workloads.toml)")
    p.add_argument("--rounds", type=int, default=2, help="rollouts per setting (default 2)")
    args = p.parse_args(argv)
    if args.rounds < 1:
        print("error: --rounds must be >= 1", file=sys.stderr)
        return 2
    from real_backend.validation_workloads import world_arg

    world = world_arg(args.world)
    if world is None:
        return 2
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    from real_backend.world import world_engine

    with world_engine(world) as (_, _, prompts, engine):
        stream_queue = engine._q
        try:
            rid = itertools.count(10_000, 100)
            for k in range(args.rounds):
                for where in ("driver", "workers"):
                    for setting in ("as left", "frozen"):
                        if setting == "as left":
                            gc.unfreeze()
                            engine._call(engine._llm.collective_rpc(_worker_unfreeze))
                        else:
                            engine.freeze_heaps()
                        took, gap = rollout_with_a_collection(engine, prompts, next(rid), where)
                        print(f"gc.collect() in the {where:7s}, heap {setting:7s}: took {took:.3f} s, "
                              f"largest gap between stream items {gap:.3f} s", flush=True)
        finally:
            engine._q = stream_queue
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
