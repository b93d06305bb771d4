"""Issue 37: hybrid's streamed pieces against their price, beside the whole update against its own, on the caller's
thread with nothing else running (no engine): does the trainer profile's piece price (ProfiledTrainCost.streamed_update)
over-charge pieces relative to the whole update (ProfiledTrainCost.step_seconds)? `--process`: the passes in the
trainer's worker process (GRPOTrainer(process=True), as `--trainer-process` runs record), each piece a round trip.

    python -m paper.experiments.piece_price [--rounds 6] [--process]

Each round: 8 synthetic groups of 4 responses (30-256 tokens; real_backend.host_sharing.piece_group) trained whole
(GRPOTrainer.update), then 8 more streamed one group at a time (GRPOTrainer.stream_group) and finished by the update
(its rest and optimizer step); medians over the rounds, the first round's allocations left out.

Measured 2026-11-28, twice (`--rounds 6`; ~11:35 and ~12:15 UTC): the whole update 1.00 / 0.80 of its price, the
pieces 0.88 / 0.70 of theirs, the rest (~0.01 s) 1.15 / 0.76 of its. The level moves with the machine; the pieces'
share of it does not (0.88 of the whole's both times): the price does not over-charge pieces against the whole.

2026-11-29 ~00:12 UTC, twice each (`--rounds 6`): with `--process` the pieces 0.65 / 0.66 of their price, the rest
0.65 / 0.66, the whole 0.73 (its first reading not kept); on this thread the pieces 0.66 / 0.66, the rest 0.56 / 0.55,
the whole 0.67 (likewise). The worker process's round trip per piece costs nothing measurable.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np


def measure(rounds: int, process: bool = False) -> dict[str, float]:
    from lssim.sim.training import load_train_cost
    from real_backend.host_sharing import piece_group
    from real_backend.profile_trainer import PROMPT_LEN, _Prompts
    from real_backend.train_stream import GradientStream
    from real_backend.trainer import GRPOTrainer

    cost = load_train_cost("real_backend/data/profile_trainer_cpu.json")
    prompts = _Prompts()
    trainer = GRPOTrainer("real_backend/reference_model", None, prompts, threads=1, seed=0, process=process)
    rng = np.random.default_rng(0)

    def batch():
        return [piece_group(rng, rng.integers(30, 257, size=4), prompts, 18) for _ in range(8)]

    def lengths(groups):
        return [np.array([PROMPT_LEN + r.generated for r in g.requests]) for g in groups]

    seen = {k: [] for k in ("whole", "pieces", "rest", "price_whole", "price_pieces", "price_rest")}
    for k in range(rounds + 1):
        groups = batch()
        t0 = time.monotonic()
        trainer.update(groups, 2 * k)
        whole = time.monotonic() - t0
        price_whole = cost.step_seconds(np.concatenate(lengths(groups)))[1]
        groups = batch()
        stream = trainer._streams[2 * k + 1] = GradientStream(2 * k + 1)  # what `feed` makes, on this thread
        t0 = time.monotonic()
        for g in groups:
            trainer.stream_group(stream, g)
        pieces = time.monotonic() - t0
        t0 = time.monotonic()
        trainer.update(groups, 2 * k + 1)
        rest = time.monotonic() - t0
        priced = cost.streamed_update(lengths(groups))
        if k:  # the first round pays for the shapes' allocations
            for key, v in zip(seen, (whole, pieces, rest, price_whole, float(priced.update.sum()), priced.rest)):
                seen[key].append(v)
    trainer.close()
    return {key: statistics.median(v) for key, v in seen.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--process", action="store_true", help="the passes in the trainer's worker process")
    args = ap.parse_args(argv)
    m = measure(args.rounds, args.process)
    for part in ("whole", "pieces", "rest"):
        print(f"{part}: {m[part]:.4f} s, priced {m['price_' + part]:.4f} s: {m[part] / m['price_' + part]:.2f} of its price")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
