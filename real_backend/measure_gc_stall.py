"""How long a full garbage collection in the driver stops the token streams, with the heap as it is and frozen.

    python -m real_backend.measure_gc_stall            # the default world, 2 rounds; about 1 minute

Each rollout submits 16 requests of 256 tokens on the world's engine, and 0.3 s in another thread forces
gc.collect(); printed: how long the collection took and the largest gap between two items of the token streams
(real_backend.engine's queue), with the heap as Python leaves it (gc.unfreeze) and after freeze_heap().

Why: the driver holds ~0.9 million objects once vLLM and torch are loaded, and a collection holds the GIL while it
scans them, so the asyncio thread that drains the streams waits. Python starts such a full collection by itself
now and then: 5 of 5280 steps recorded before the fix began with every first token 0.37-0.75 s late, on every
instance at once (`runs/*/real`). (Not this: the ~1 s first-token waits of a few of seer's resubmissions, which
were on one instance while the other's tokens kept arriving.) Measured 2026-11-27 on this
2-core VM (this script): as left, 716 thousand objects, the collection took 0.48 s and 0.46 s and the streams stopped
for 0.49 s and 0.47 s; frozen, the collection took under 1 ms and the largest gap was 0.005-0.006 s, the streams'
usual spacing. Engines and real runs now freeze the heap (real_backend.engine.freeze_heap).
"""

from __future__ import annotations

import argparse
import gc
import os
import queue
import sys
import threading
import time


def rollout_with_a_collection(engine, prompts, rid0: int, at: float = 0.3) -> tuple[float, float]:
    """(seconds the forced gc.collect() took, the largest gap between stream items) over one rollout."""
    from lssim.core import Request

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
    p = argparse.ArgumentParser(prog="python -m real_backend.measure_gc_stall", description=__doc__.split("\n\n")[0])
    p.add_argument("--world", default="default", help="the validation world (real_backend/validation_workloads.toml)")
    p.add_argument("--rounds", type=int, default=2, help="rollouts per setting (default 2)")
    args = p.parse_args(argv)
    if args.rounds < 1:
        print("error: --rounds must be >= 1", file=sys.stderr)
        return 2
    from .validation_workloads import load_workloads

    worlds = load_workloads().worlds
    if args.world not in worlds:
        print(f"error: no world {args.world!r}; the worlds: {', '.join(worlds)}", file=sys.stderr)
        return 2
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    from .engine import freeze_heap
    from .world import world_engine

    with world_engine(worlds[args.world]) as (_, _, prompts, engine):
        stream_queue = engine._q
        try:
            for k in range(args.rounds):
                for setting in ("as left", "frozen"):
                    gc.unfreeze() if setting == "as left" else freeze_heap()
                    tracked = len(gc.get_objects())
                    took, gap = rollout_with_a_collection(engine, prompts, rid0=10_000 * (k + 1) + (500 if setting == "frozen" else 0))
                    print(f"{setting:8s} objects scanned {tracked:8d}  gc.collect() {took:.3f} s  "
                          f"largest gap between stream items {gap:.3f} s", flush=True)
        finally:
            engine._q = stream_queue
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
