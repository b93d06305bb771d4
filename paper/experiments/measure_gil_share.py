"""Issue 37: how much slower the real trainer's streamed pieces run on its lane while the caller's thread (a run's
driver) works in Python part of the time: the two threads share the interpreter's lock. No engine.

    python -m paper.experiments.measure_gil_share [--rounds 5] [--engine]

Two synthetic groups of 4 responses (150-256 tokens, the reference model; real_backend.host_sharing.piece_group)
are fed to the lane as hybrid feeds them (GRPOTrainer.stream_group); meanwhile the caller's thread runs a Python
loop for `busy` of every 10 ms and sleeps the rest. Each duty cycle's median over the rounds, against the caller
idle.

Measured 2026-11-28 ~09:55 UTC, two runs (`--rounds 5`, then `--rounds 5 --engine`; the VM otherwise quiet;
sys.getswitchinterval() 5 ms):

| the caller busy in Python | pieces, s | over the caller idle |
|---|---|---|
| 0% | 0.145 / 0.153 | 1.00x |
| 10% | 0.172 / 0.162 | 1.19x / 1.06x |
| 30% | 0.213 / 0.203 | 1.46x / 1.33x |
| 100% | 3.527 / 3.648 | 24.3x / 23.9x |

Also measured, to rule them out: the same pieces on the lane against the caller's own thread (0.98x), and with
`--engine`, the pieces right after a vLLM cell (32 long-tailed requests of up to 256 tokens) against 1.5 s later
(0.97x: the engine's threads do not slow them once its requests are done).

With `--switch-interval S` (sys.setswitchinterval first; 2026-11-28 ~10:45 UTC, `--rounds 5`): 5 ms 1.04x / 1.25x /
19.0x at 10% / 30% / 100% busy, 0.5 ms 1.07x / 1.18x / 2.91x, 0.1 ms 1.03x / 1.15x / 1.71x: at a run's duty the
interval hardly matters.

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


def measure(rounds: int, engine: bool = False) -> dict[float, float]:
    from real_backend.host_sharing import piece_group
    from real_backend.profile_trainer import _Prompts  # the synthetic prompts host_sharing's pieces use
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

    def on_caller() -> float:
        stream, t0 = GradientStream(0), time.monotonic()
        for g in groups:
            trainer.stream_group(stream, g)
        return time.monotonic() - t0

    pieces(0.0), on_caller()  # the first shapes pay for their allocations
    seconds = {duty: [] for duty in DUTIES}
    caller = []
    for _ in range(rounds):
        for duty in DUTIES:
            seconds[duty].append(pieces(duty))
        caller.append(on_caller())
    if engine:
        after, later = _after_cells(pieces, rounds, rng)
        print(f"pieces right after a vLLM cell {after:.3f} s, 1.5 s later {later:.3f} s: {after / later:.2f}x")
    trainer.finish_jobs()
    medians = {duty: statistics.median(s) for duty, s in seconds.items()}
    print(f"pieces on the lane {medians[0.0]:.3f} s, on the caller's thread {statistics.median(caller):.3f} s: "
          f"{medians[0.0] / statistics.median(caller):.2f}x")
    return medians


def _after_cells(pieces, rounds: int, rng) -> tuple[float, float]:
    """Median pieces right after a vLLM cell and 1.5 s later (the engine idle), `rounds` of each."""
    from lssim.loop.core import Request
    from real_backend.cells import longtail_lengths, time_cell
    from real_backend.engine import VLLMEngine
    from real_backend.engine_config import VLLMConfig

    engine, cell_prompts, after, later = VLLMEngine(VLLMConfig(model="real_backend/reference_model"), None, None), {}, [], []
    try:
        with engine.serving_exactly(cell_prompts):
            for k in range(rounds + 1):
                requests = []
                for i, n in enumerate(longtail_lengths(rng, 32, 256)):
                    rid = 32 * k + i
                    cell_prompts[rid] = rng.integers(4, 18, size=8).tolist()
                    requests.append(Request(rid=rid, group_id=rid, step=0, prompt_id=rid, sample_idx=0, prompt_len=8,
                                            max_tokens=int(n), seed=rid))
                time_cell(engine, requests)
                right = pieces(0.0)
                time.sleep(1.5)
                if k:  # the first cell pays for the engine's first shapes
                    after.append(right), later.append(pieces(0.0))
    finally:
        engine.close()
    return statistics.median(after), statistics.median(later)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--engine", action="store_true", help="also time the pieces right after a vLLM cell (starts vLLM)")
    ap.add_argument("--switch-interval", type=float, default=None,
                    help="sys.setswitchinterval(SECONDS) first (Python's default: 0.005)")
    args = ap.parse_args(argv)
    if args.switch_interval is not None:
        import sys

        sys.setswitchinterval(args.switch_interval)
    medians = measure(args.rounds, args.engine)
    print("| the caller busy in Python | pieces, s | over the caller idle |")
    print("|---|---|---|")
    for duty, s in medians.items():
        print(f"| {duty:.0%} | {s:.3f} | {s / medians[0.0]:.2f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
