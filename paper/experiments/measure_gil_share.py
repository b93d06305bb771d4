"""Issue 37: how much slower the real trainer's streamed pieces run on its lane while the caller's thread (a run's
driver) works in Python part of the time: the two threads share the interpreter's lock. No engine.

    python -m paper.experiments.measure_gil_share [--rounds 5]

Two synthetic groups of 4 responses (150-256 tokens, the reference model; real_backend.host_sharing.piece_group)
are fed to the lane as hybrid feeds them (GRPOTrainer.stream_group); meanwhile the caller's thread runs a Python
loop for `busy` of every 10 ms and sleeps the rest. Each duty cycle's median over the rounds, against the caller
idle.

Measured 2026-11-28 09:55 UTC (the VM otherwise quiet; sys.getswitchinterval() 5 ms):

| the caller busy in Python | pieces, s | over the caller idle |
|---|---|---|
| 0% | 0.145 | 1.00x |
| 10% | 0.172 | 1.19x |
| 30% | 0.213 | 1.46x |
| 100% | 3.527 | 24.29x |

The pieces are mostly Python-level work around small tensors (the reference model is tiny), and each time the lane
needs the lock back while the caller holds it, it waits up to the switch interval. A run's driver is busy 2.5-8% of
its rollout (`python -m paper.experiments.modes_driver`), in bursts as events arrive.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

DUTIES = (0.0, 0.1, 0.3, 1.0)


class _Prompts:
    def __init__(self):
        self.tokens: dict[int, list[int]] = {}

    def prompt_tokens(self, pid: int) -> list[int]:
        return self.tokens[pid]


def _busy_until_done(futures, duty: float) -> None:
    """The caller's Python loop for `duty` of every 10 ms, asleep the rest, until the lane's work is done."""
    x = 0
    while not all(f.done() for f in futures):
        t0 = time.monotonic()
        while time.monotonic() - t0 < 0.010 * duty:
            for i in range(200):
                x += i * i
        if duty < 1.0:
            time.sleep(0.010 * (1.0 - duty))


def measure(rounds: int) -> dict[float, float]:
    from real_backend.host_sharing import piece_group
    from real_backend.train_stream import GradientStream
    from real_backend.trainer import GRPOTrainer

    prompts = _Prompts()
    trainer = GRPOTrainer("real_backend/reference_model", None, prompts, threads=1, seed=0)
    rng = np.random.default_rng(0)
    groups = [piece_group(rng, [150, 200, 250, 256], prompts, 18) for _ in range(2)]

    def pieces(duty: float) -> float:
        stream, t0 = GradientStream(0), time.monotonic()
        futures = [trainer.lane.submit(trainer.stream_group, stream, g) for g in groups]
        if duty > 0:
            _busy_until_done(futures, duty)
        for f in futures:
            f.result()
        return time.monotonic() - t0

    pieces(0.0)  # the first shapes pay for their allocations
    seconds = {duty: [] for duty in DUTIES}
    for _ in range(rounds):
        for duty in DUTIES:
            seconds[duty].append(pieces(duty))
    trainer.finish_jobs()
    return {duty: statistics.median(s) for duty, s in seconds.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    medians = measure(args.rounds)
    print("| the caller busy in Python | pieces, s | over the caller idle |")
    print("|---|---|---|")
    for duty, s in medians.items():
        print(f"| {duty:.0%} | {s:.3f} | {s / medians[0.0]:.2f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
