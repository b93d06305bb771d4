"""Issue 37: does a run's driver, busy in Python while it streams a rollout, slow an update on the trainer's lane by a
fixed part (the update's own Python on the driver's side: samples, the pipe, the optimizer step) or by a ratio? No
engine: the driver's streaming is stood in for by a thread that runs pure Python throughout.

    python -m paper.experiments.measure_update_gil --rounds 4

Per round and batch size (sequences, long-tailed as the trainer profile's), updates run as a run's jobs do
(GRPOTrainer.start: on the trainer's lane, then the weights' snapshot) with the passes in a process of their own
(--thread: on the lane's thread),
alone and beside the busy thread, alternating. Prints the medians per size and a least-squares line over the sizes:
beside = a + b x alone (a: the fixed part the busy driver adds; b: the ratio), and the busy thread's own rate. Run it
alone on the machine.

Found (2026-11-28): every call into torch on the lane gives up the interpreter's lock and waits up to a switch
interval to get it back. AdamW's per-tensor step (~300 calls) made an 8-sequence update 1.09 s beside the busy thread
against 0.18 s alone; with `foreach` (real_backend/trainer.py) 0.44 s for the update and its snapshot, +0.25 s fixed;
with the switch interval at 0.1 ms as well +0.04 s, the busy thread 2% slower. Runs did not gain from that interval
(real_backend.train_job set it while a lane lived, then no longer: `python -m paper.experiments.measure_switch_interval`).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time

import numpy as np


def busy_python(stop: threading.Event, done: list[float]) -> None:
    """What stands in for the driver: Python work without pause (dicts and lists, as a controller's books); appends
    its rate (iterations a second) to `done`: what the update beside it costs the driver."""
    books: dict[int, list[int]] = {}
    k, t0 = 0, time.monotonic()
    while not stop.is_set():
        books.setdefault(k % 512, []).append(k)
        if len(books[k % 512]) > 64:
            books[k % 512].clear()
        k += 1
    done.append(k / (time.monotonic() - t0))


def timed_update(trainer, rng, lengths, vocab: int) -> float:
    """One update as a run's job runs it (GRPOTrainer.start: the update, then the weights' snapshot), its own times."""
    from real_backend.profile_trainer import synthetic_batch

    trainer.prompts.tokens.clear()
    job = trainer.start(synthetic_batch(rng, lengths, trainer.prompts, vocab), 0)
    job.future.result()
    return job.end - job.start


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m paper.experiments.measure_update_gil", description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--sizes", default="8,16,32", help="sequences per update (even)")
    p.add_argument("--thread", action="store_true", help="the trainer on the lane's thread, not in a process of its own")
    p.add_argument("--threads", type=int, default=1, help="the trainer's torch threads (the runs' --trainer-threads: 1)")
    p.add_argument("--switch-interval", type=float, default=None,
                   help="sys.setswitchinterval for the measurement, seconds (default: Python's, 0.005)")
    args = p.parse_args(argv)
    if args.switch_interval is not None:
        sys.setswitchinterval(args.switch_interval)
    from real_backend.profile_trainer import _Prompts, longtail_lengths
    from real_backend.task import MODEL_DIR
    from real_backend.trainer import GRPOTrainer

    trainer = GRPOTrainer(str(MODEL_DIR), None, _Prompts(), lr=1e-6, seed=0, process=not args.thread,
                          threads=args.threads)
    vocab, rng = int(trainer.model.config.vocab_size), np.random.default_rng(0)
    sizes = [int(s) for s in args.sizes.split(",")]
    lengths = {n: longtail_lengths(rng, n) for n in sizes}
    seconds: dict[tuple[int, str], list[float]] = {}
    rates: list[float] = []  # the stand-in driver's iterations a second beside each update
    try:
        for n in sizes:  # first shapes pay for kernels and allocations: not recorded
            timed_update(trainer, rng, lengths[n], vocab)
        for rnd in range(args.rounds):
            for n in sizes:
                seconds.setdefault((n, "alone"), []).append(timed_update(trainer, rng, lengths[n], vocab))
                stop = threading.Event()
                driver = threading.Thread(target=busy_python, args=(stop, rates), daemon=True)
                driver.start()
                try:
                    seconds.setdefault((n, "beside"), []).append(timed_update(trainer, rng, lengths[n], vocab))
                finally:
                    stop.set()
                    driver.join()
            print(f"round {rnd + 1}/{args.rounds} done", flush=True)
    finally:
        trainer.close()
    alone = [statistics.median(seconds[(n, "alone")]) for n in sizes]
    beside = [statistics.median(seconds[(n, "beside")]) for n in sizes]
    for n, a, b in zip(sizes, alone, beside):
        print(f"{n:3d} sequences: alone {a:.3f} s, beside a busy Python thread {b:.3f} s ({b / a:.2f}x)")
    print(f"the busy thread beside the updates: {statistics.median(rates) / 1e6:.2f} M iterations a second (median)")
    a, b = np.linalg.lstsq(np.c_[np.ones(len(sizes)), alone], beside, rcond=None)[0]
    print(f"beside = {a:+.3f} s + {b:.2f} x alone ({'thread' if args.thread else 'process'} trainer, switch interval "
          f"{sys.getswitchinterval() * 1e3:g} ms)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
