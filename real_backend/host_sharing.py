"""Rollout and training on one host: how much slower the engine decodes while a GRPO update runs on the trainer's
thread beside it, and how much slower the update runs while the engine decodes -- the two factors of
lssim.sim.shared_host.TrainingShare, which the simulated twin of a run whose trainer shares the engine's CPUs uses.

    lssim profile --out P --shared-host          # into P's measured_by.shared_host (P: the engine's profile), ~1 min
    share = training_share(P)                    # -> TrainingShare, or None where P has no measurement

Why: the modes that train beside the rollout (disaggregated, async, hybrid) give the trainer devices of its own in
the simulator, as on GPUs. On this CPU host the trainer's thread and vLLM's engine core share the cores, so the
overlap those modes buy is partly lost (issue 37: every mode predicted 25-40% too fast, disaggregated's speedup
1.41x predicted against 1.16x measured).

How, in rounds (the machine's speed drifts: each round's ratios are taken minutes apart at most): the engine alone
(`cells` batches of `n_seqs` requests, distinct random prompts, the same long-tailed lengths each time, timed to the
last token: real_backend.cells.time_cell, the driver on the caller's thread as in a run); the trainer alone
(`updates` GRPO updates of a synthetic batch like a rollout step's trained groups, `train_seqs` long-tailed
sequences: real_backend.profile_trainer.synthetic_batch);
then both: the updates on a thread of their own (as real_backend.train_job's lane runs them) while the caller runs
cells until they are done. engine_slowdown: the median cell together over the median alone; trainer_slowdown: the
same for the updates; each the median over the rounds, and at least 1 (sharing cores makes neither faster: a median
under 1 is the machine's noise; `by_round` keeps every round's ratio). On a busy machine the rounds spread widely
(2026-11-27, four other jobs on the 2 cores: engine 1.72-2.00x, trainer 0.93-2.65x over three rounds): measure it
alone on the machine, as the runs it prices should be. A cell counts as "together" only if it ended before the
trainer's last update did.
"""

from __future__ import annotations

import json
import statistics
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd

from lssim.loop.core import Request

from .cells import longtail_lengths, time_cell

KEY = "shared_host"  # under the profile's measured_by


def measure_sharing(engine, trainer, vocab: int, rounds: int = 3, cells: int = 4, updates: int = 3, n_seqs: int = 32,
                    length: int = 256, train_seqs: int = 24, seed: int = 0) -> pd.DataFrame:
    """Rows: round, phase (engine_alone, trainer_alone, engine_beside, trainer_beside), seconds (a cell's makespan
    or an update's wall time). `engine` idle, `trainer` a GRPOTrainer with no engine (its weights are not pushed)."""
    from .profile_trainer import longtail_lengths as train_lengths
    from .profile_trainer import synthetic_batch

    rng = np.random.default_rng(seed)
    lengths = longtail_lengths(rng, n_seqs, length)
    batch_lengths = train_lengths(rng, train_seqs)
    prompts: dict[int, list[int]] = {}
    rid = [0]

    def cell() -> float:
        requests = []
        for tokens in lengths:
            prompts[rid[0]] = rng.integers(0, vocab, size=8).tolist()
            requests.append(Request(rid=rid[0], group_id=rid[0], step=0, prompt_id=rid[0], sample_idx=0, prompt_len=8,
                                    max_tokens=tokens, seed=int(rng.integers(1 << 30))))
            rid[0] += 1
        seconds = max(time_cell(engine, requests).values())
        for r in requests:
            prompts.pop(r.rid, None)
        return seconds

    def update() -> float:
        trainer.prompts.tokens.clear()
        t0 = time.monotonic()
        trainer.update(synthetic_batch(rng, batch_lengths, trainer.prompts, vocab), 0)
        return time.monotonic() - t0

    rows = []
    with engine.serving_exactly(prompts):
        cell(), update()  # first shapes pay for kernels and allocations: not recorded
        for rnd in range(rounds):
            rows += [{"round": rnd, "phase": "engine_alone", "seconds": cell()} for _ in range(cells)]
            rows += [{"round": rnd, "phase": "trainer_alone", "seconds": update()} for _ in range(updates)]
            rows += [{"round": rnd, **row} for row in _together(cell, update, updates)]
    return pd.DataFrame(rows)


def _together(cell, update, updates: int) -> list[dict]:
    """`updates` updates on a thread while the caller runs cells until they are done."""
    trained: list[float] = []
    failed: list[BaseException] = []

    def lane():
        try:
            trained.extend(update() for _ in range(updates))
        except BaseException as e:  # noqa: BLE001  (re-raised on the caller's thread below)
            failed.append(e)

    thread = threading.Thread(target=lane, name="grpo-trainer")
    beside = []
    thread.start()
    while thread.is_alive():
        seconds = cell()
        if thread.is_alive():  # it ended with the trainer still running: a cell beside the update throughout
            beside.append(seconds)
    thread.join()
    if failed:
        raise failed[0]
    return ([{"phase": "engine_beside", "seconds": s} for s in beside]
            + [{"phase": "trainer_beside", "seconds": s} for s in trained])


def fit_sharing(rows: pd.DataFrame) -> dict:
    """The two factors from measure_sharing's rows: per round the median beside over the median alone, then the
    median over rounds; ValueError naming the phase no round measured."""
    ratios = {"engine_slowdown": [], "trainer_slowdown": []}
    for _, r in rows.groupby("round"):
        med = r.groupby("phase")["seconds"].median()
        for name, who in (("engine_slowdown", "engine"), ("trainer_slowdown", "trainer")):
            if f"{who}_alone" in med and f"{who}_beside" in med:
                ratios[name].append(float(med[f"{who}_beside"] / med[f"{who}_alone"]))
    for name, values in ratios.items():
        if not values:
            raise ValueError(f"fit_sharing: no round measured both {name.split('_')[0]} alone and beside the other")
    # Sharing cores never makes either faster: a median under 1 is the machine's noise, and prices as no slow-down.
    return {name: max(1.0, statistics.median(values)) for name, values in ratios.items()} | {
        "by_round": ratios, "median_seconds": rows.groupby("phase")["seconds"].median().round(4).to_dict()}


def write_sharing(profile, fit: dict, meta: dict | None = None) -> None:
    """Put `fit` (and how it was measured) into the profile JSON's measured_by.shared_host, atomically."""
    from lssim.results import atomic_write

    path = Path(profile)
    payload = json.loads(path.read_text())
    payload.setdefault("measured_by", {})[KEY] = {**fit, "measured": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                                                  **(meta or {})}
    atomic_write(path, lambda p: Path(p).write_text(json.dumps(payload, indent=2) + "\n"))


def training_share(profile):
    """The TrainingShare measured into `profile` (lssim.sim.shared_host), or None where it has none."""
    from lssim.sim.shared_host import TrainingShare

    record = json.loads(Path(profile).read_text()).get("measured_by", {}).get(KEY)
    if record is None:
        return None
    try:
        return TrainingShare(float(record["engine_slowdown"]), float(record["trainer_slowdown"]))
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{profile}: measured_by.{KEY} is not a measurement of `lssim profile --shared-host` ({e})") from None


def run_sharing(args, out: Path) -> int:
    """`lssim profile --out P --shared-host`: measure this host's engine beside the GRPO trainer, write into P."""
    import sys

    from lssim.cost import ProfiledCostModel
    from lssim.loop.controller import RunConfig

    from .profile_trainer import _Prompts
    from .trainer import GRPOTrainer
    from .world import RealSetup, prepare, start_engine

    if not out.is_file():
        raise ValueError(f"--out {out}: with --shared-host, --out names the engine's profile the factors are written "
                         f"into (`lssim profile --out {out}` first)")
    ProfiledCostModel.from_json(out)  # a bad file fails here, naming itself
    setup = RealSetup(model_dir=args.model_dir, max_model_len=args.max_model_len, kv_cache_gib=args.kv_cache_gib)
    prompts, _ = prepare(setup, "baseline", RunConfig(steps=1, groups_per_step=1, group_size=2, max_tokens=args.length))
    engine = start_engine(setup, prompts, seed=0)
    try:
        trainer = GRPOTrainer(setup.model_dir, None, _Prompts(), lr=1e-6, threads=setup.trainer_threads, seed=0)
        t0 = time.monotonic()
        rows = measure_sharing(engine, trainer, int(trainer.model.config.vocab_size), rounds=args.repeats + 1,
                               length=args.length)
    finally:
        engine.close()
    fit = fit_sharing(rows)
    write_sharing(out, fit, {"command": " ".join(["lssim", "profile", *sys.argv[2:]]), "seconds": round(time.monotonic() - t0, 1),
                             "trainer_threads": setup.trainer_threads})
    print(f"shared host: the engine {fit['engine_slowdown']:.3f}x slower beside a GRPO update, the update "
          f"{fit['trainer_slowdown']:.3f}x slower beside the engine (rounds: "
          f"{', '.join(f'{e:.2f}/{t:.2f}' for e, t in zip(*fit['by_round'].values()))}) -> {out} measured_by.{KEY}",
          file=sys.stderr)
    return 0


__all__ = ["measure_sharing", "fit_sharing", "write_sharing", "training_share", "run_sharing"]
