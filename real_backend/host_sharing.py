"""Rollout and training on one host: how much slower the engine decodes while a GRPO update runs on the trainer's
thread beside it, and how much slower the update runs while the engine decodes -- the two factors of
lssim.sim.shared_host.TrainingShare, which the simulated twin of a run whose trainer shares the engine's CPUs uses.

    lssim profile --out P --shared-host --group-size 4   # into P's measured_by.shared_host (P: the engine's profile)
    share = training_share(P)    # -> TrainingShare (its `streamed`: hybrid's pieces), or None where P has none

Why: the modes that train beside the rollout (disaggregated, async, hybrid) give the trainer devices of its own in
the simulator, as on GPUs. On this CPU host the trainer's thread and vLLM's engine core share the cores, so the
overlap those modes buy is partly lost (issue 37: every mode predicted 25-40% too fast, disaggregated's speedup
1.41x predicted against 1.16x measured).

How, in rounds (the machine's speed drifts: each round's ratios are taken minutes apart at most): the trainer alone
(`updates` GRPO updates of a synthetic batch like a rollout step's trained groups, `train_seqs` long-tailed
sequences: real_backend.profile_trainer.synthetic_batch); the engine in `cells` pairs (batches of `n_seqs` requests,
distinct random prompts, the same long-tailed lengths each time, timed to the last token: real_backend.cells.time_cell,
the driver on the caller's thread as in a run): a cell alone, then a cell beside updates running back to back on a
thread of their own (as real_backend.train_job's lane runs them) from before it starts until it ends (`_cells_paired`:
the alone cell is the same moment's baseline); then `updates` updates while the caller runs full cells (every
request decoding to half the budget) until they are done. engine_slowdown: the median long-tailed cell beside over
the median alone;
trainer_slowdown: the median update beside the full cells over the median alone (a run's update meets a full engine:
the next rollout's dense start in disaggregated, an engine refilled without pause in async; beside the long-tailed
cells, their sparse tails included, the update read 1.22x where beside full ones it read 1.40x, and the runs' own
1.37-1.57x: `python -m paper.experiments.measure_beside_load`, `python -m paper.experiments.trainer_beside`); each
the median over the rounds, and at least 1 (sharing cores makes neither faster: a median
under 1 is the machine's noise; `by_round` keeps every round's ratio). On a busy machine the rounds spread widely
(2026-11-27, four other jobs on the 2 cores: engine 1.72-2.00x, trainer 0.93-2.65x over three rounds): measure it
alone on the machine, as the runs it prices should be. A full cell counts as "together" only if it ended before
the trainer's last update did.

Streamed (hybrid, real_backend.train_stream): a hybrid run does not run its update whole beside the rollout but in
pieces, one finished group's forward and backward at a time, as the groups finish; between pieces the engine runs
alone. Each round also times every piece alone (the cell's groups, `group_size` requests each, trained as synthetic
groups of the lengths the cell generates) and cells whose groups go to the trainer's lane as each finishes
(`lane.submit`, one piece after another, as `GRPOTrainer.feed` does), each streamed cell after a cell alone (the same
moment's baseline: an alone cell minutes earlier made one round's factor 28.9x, issue 37), and fits the factors of
measured_by.shared_host.streamed: the engine's from the seconds it loses per piece-second, one least-squares slope
of cell seconds on the pieces' busy seconds over every cell (fit_piece_loss; a cell is late by busy x (1 - 1 /
engine_slowdown)), and the piece's over its time alone (pieces that ended before the cell). The whole-update factors above do not transfer: beside ~0.4 s of streamed
update a real hybrid step lost ~0.15 s, not what 1.685x over the update's seconds says (issue 37).
"""

from __future__ import annotations

import json
import statistics
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd

from lssim.loop.core import Group, Request

from .cells import longtail_lengths, random_requests, time_cell

KEY = "shared_host"  # under the profile's measured_by
STREAMED = "streamed"  # under KEY: the engine beside a streamed update (hybrid's pieces)
PAIRED = "engine_paired"  # a cell alone between a round's streamed cells: their same-moment baseline
FULL = "trainer_beside_full"  # an update beside cells whose requests all decode until the cell ends


def measure_sharing(engine, trainer, vocab: int, rounds: int = 3, cells: int = 4, updates: int = 3, n_seqs: int = 32,
                    length: int = 256, train_seqs: int = 24, group_size: int | None = 4, seed: int = 0) -> pd.DataFrame:
    """Rows: round, phase, seconds: engine_alone, trainer_alone, engine_beside, trainer_beside (a cell's makespan or
    an update's wall time), trainer_beside_full (an update beside full cells: FULL); with `group_size` (None: not
    measured) also piece_alone and piece_streamed (one group's forward and backward; `piece`: its group in the cell)
    and engine_streamed (a cell with pieces beside it; `busy`: their seconds within it) beside engine_paired (a cell
    alone just before or after; `busy` 0). `engine` idle, `trainer` a GRPOTrainer with no engine (its weights are not
    pushed)."""
    from .profile_trainer import longtail_lengths as train_lengths
    from .profile_trainer import synthetic_batch

    if group_size is not None and (isinstance(group_size, bool) or not isinstance(group_size, int)
                                   or not 2 <= group_size <= n_seqs):
        raise ValueError(f"measure_sharing: group_size must be an int from 2 to n_seqs ({n_seqs}), got {group_size!r}")
    rng = np.random.default_rng(seed)
    lengths = longtail_lengths(rng, n_seqs, length)
    full = [max(1, length // 2)] * n_seqs  # FULL: every request decodes until the cell ends
    batch_lengths = train_lengths(rng, train_seqs)
    prompts: dict[int, list[int]] = {}
    rid = [0]

    def requests(budget: list[int] = lengths) -> list[Request]:
        cell_prompts, made = random_requests(rng, vocab, budget, rid[0], 8)
        prompts.update(cell_prompts)
        rid[0] += len(made)
        return made

    def cell(tokens: list[int] = lengths) -> float:
        batch = requests(tokens)
        seconds = max(time_cell(engine, batch).values())
        for r in batch:
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
        _cells_paired(cell, update, 1)  # nor the first pair: the first round's read 1.2-1.8x where the others' 1.8-2.4x
        for rnd in range(rounds):
            rows += [{"round": rnd, "phase": "trainer_alone", "seconds": update()} for _ in range(updates)]
            rows += [{"round": rnd, **row} for row in _cells_paired(cell, update, cells)]
            rows += [{"round": rnd, "phase": FULL, "seconds": row["seconds"]}
                     for row in _together(lambda: cell(full), update, updates) if row["phase"] == "trainer_beside"]
            if group_size is not None:
                streamed = _Streamed(engine, trainer, rng, lengths, group_size, vocab)
                rows += [{"round": rnd, **row} for row in streamed.rows(cell, requests, prompts, cells)]
    if group_size is not None:
        trainer.finish_jobs()  # the lane's thread the pieces ran on
    return pd.DataFrame(rows)


class _Streamed:
    """Hybrid's rhythm on this host: each finished group's forward and backward (a piece) on the trainer's lane
    while the cell goes on, one after another, as GRPOTrainer.feed runs them."""

    def __init__(self, engine, trainer, rng, lengths: list[int], group_size: int, vocab: int):
        from .train_stream import GradientStream  # torch: only where a trainer is measured

        self.engine, self.trainer, self.group_size, self.new_stream = engine, trainer, group_size, GradientStream
        trainer.prompts.tokens.clear()  # the update's synthetic prompts: this round's pieces' instead
        self.groups = [piece_group(rng, lengths[k:k + group_size], trainer.prompts, vocab)
                       for k in range(0, len(lengths) - group_size + 1, group_size)]

    def rows(self, alone_cell, requests, prompts: dict, cells: int) -> list[dict]:
        """Every piece alone, then `cells` streamed cells, each after a cell alone (PAIRED: its moment's baseline;
        one more after the last), then every piece alone again (the machine drifts: the alone times bracket the
        streamed ones)."""
        self._piece(self.new_stream(0), 0)  # this round's shapes pay for their allocations: not recorded
        out = self.alone()
        for _ in range(cells):
            out.append({"phase": PAIRED, "seconds": alone_cell(), "busy": 0.0})
            batch = requests()
            out += self.cell(batch)
            for r in batch:
                prompts.pop(r.rid, None)
        out.append({"phase": PAIRED, "seconds": alone_cell(), "busy": 0.0})
        return out + self.alone()

    def alone(self) -> list[dict]:
        """Every piece in turn with the engine idle, into one step's gradients (as in a cell)."""
        out, stream = [], self.new_stream(0)
        for k in range(len(self.groups)):
            t0 = time.monotonic()
            self._piece(stream, k)
            out.append({"phase": "piece_alone", "piece": k, "seconds": time.monotonic() - t0})
        return out

    def _piece(self, stream, k: int) -> None:
        self.trainer.stream_group(stream, self.groups[k])  # what `feed` runs on the lane for a finished group

    def cell(self, batch: list[Request]) -> list[dict]:
        """One cell, each group (`group_size` requests in order; a last short one is not trained) handed to the lane
        once its last request finished; the cell's row (its seconds, the pieces' `busy` seconds within it), and a
        row per piece that ended within it (its seconds beside the engine throughout)."""
        engine, t0, stream, spans, work = self.engine, self.engine.now(), self.new_stream(0), [], []
        group_of = {r.rid: i // self.group_size for i, r in enumerate(batch) if i // self.group_size < len(self.groups)}
        left, finish = Counter(group_of.values()), {}

        def timed(k: int) -> None:
            start = engine.now() - t0
            self._piece(stream, k)
            spans.append((k, start, engine.now() - t0))

        engine.submit(batch)
        while len(finish) < len(batch):
            for ev in engine.next_events():
                if ev.kind == "finished":
                    finish[ev.request.rid] = ev.time - t0
                    k = group_of.get(ev.request.rid)
                    if k is None:
                        continue
                    left[k] -= 1
                    if not left[k]:
                        work.append(self.trainer.lane.submit(timed, k))
        seconds = max(finish.values())
        for w in work:
            w.result()  # the rest run after the cell, as after a hybrid rollout; an error is the measurement's
        busy = sum(max(0.0, min(end, seconds) - start) for _, start, end in spans)
        return ([{"phase": "engine_streamed", "seconds": seconds, "busy": busy}]
                + [{"phase": "piece_streamed", "piece": k, "seconds": end - start} for k, start, end in spans if end <= seconds])


def piece_group(rng, response_lengths, prompts, vocab: int) -> Group:
    """A trained group like a hybrid piece: responses of these lengths to one synthetic prompt (as
    real_backend.profile_trainer.synthetic_batch makes them), rewards alternating 0 and 1 so that it has signal."""
    from . import task
    from .profile_trainer import PROMPT_LEN

    pid = len(prompts.tokens)
    prompts.tokens[pid] = [task.BOS_ID] + rng.integers(4, vocab, size=PROMPT_LEN - 1).tolist()
    members = []
    for k, n in enumerate(int(n) for n in response_lengths):
        r = Request(rid=k, group_id=pid, step=0, prompt_id=pid, sample_idx=k, prompt_len=PROMPT_LEN, max_tokens=n)
        r.tokens = rng.integers(4, vocab, size=n).tolist()
        r.generated, r.reward = n, float(k % 2)
        r.signals["logprobs"] = (-np.log(vocab) + 0.01 * rng.standard_normal(n)).tolist()
        members.append(r)
    return Group(prompt_id=pid, step=0, requests=members)


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


def _cells_paired(cell, update, cells: int) -> list[dict]:
    """`cells` pairs: a cell alone (the trainer idle), then a cell beside updates that run back to back from before it
    starts until it ends; rows engine_alone and engine_beside. In pairs, so that the machine's speed at that moment is
    in both, as the streamed factor's cells are: with the alone cells taken together at a round's start, one or two
    beside cells a round, and the first round recorded, the factor read 1.57-2.14x over six profiles (rounds
    1.2-2.7x, the first the lowest in five); paired, 1.84-2.28x over six (issue 37, docs/fidelity.md)."""
    go, stop, started = threading.Event(), threading.Event(), threading.Event()
    idle = threading.Lock()  # held by the lane while an update runs
    failed: list[BaseException] = []

    def lane():
        while go.wait() and not stop.is_set():
            with idle:
                if stop.is_set() or not go.is_set():  # the caller's alone cell came first, or the pairs are done
                    continue
                started.set()
                try:
                    update()
                except BaseException as e:  # noqa: BLE001  (re-raised on the caller's thread below)
                    failed.append(e)
                    return

    thread = threading.Thread(target=lane, name="grpo-trainer")
    rows = []
    try:
        thread.start()
        for _ in range(cells):
            with idle:  # the update under way (if any) has ended, and no other starts until the cell is done
                rows.append({"phase": "engine_alone", "seconds": cell()})
                started.clear()
                go.set()
            while not (started.wait(0.05) or failed or not thread.is_alive()):
                pass
            if failed:
                break
            rows.append({"phase": "engine_beside", "seconds": cell()})
            go.clear()
    finally:
        stop.set(), go.set()
        thread.join()
    if failed:
        raise failed[0]
    return rows


def fit_sharing(rows: pd.DataFrame) -> dict:
    """The two factors from measure_sharing's rows: per round the median beside over the median alone (the
    trainer's beside full cells where the rows have them, else beside the long-tailed ones, as profiles measured
    before FULL do), then the median over rounds; ValueError naming the phase no round measured."""
    ratios = {"engine_slowdown": [], "trainer_slowdown": []}
    for _, r in rows.groupby("round"):
        med = r.groupby("phase")["seconds"].median()
        for name, who in (("engine_slowdown", "engine"), ("trainer_slowdown", "trainer")):
            beside = FULL if who == "trainer" and FULL in med else f"{who}_beside"  # a profile before FULL: as it was
            if f"{who}_alone" in med and beside in med:
                ratios[name].append(float(med[beside] / med[f"{who}_alone"]))
    for name, values in ratios.items():
        if not values:
            raise ValueError(f"fit_sharing: no round measured both {name.split('_')[0]} alone and beside the other")
    # Sharing cores never makes either faster: a median under 1 is the machine's noise, and prices as no slow-down.
    fit = {name: max(1.0, statistics.median(values)) for name, values in ratios.items()} | {
        "by_round": ratios, "median_seconds": rows.groupby("phase")["seconds"].median().round(4).to_dict()}
    if "engine_streamed" in set(rows["phase"]):
        fit[STREAMED] = fit_streaming(rows)
    return fit


def fit_streaming(rows: pd.DataFrame) -> dict:
    """The streamed factors from measure_sharing's rows. The engine's from fit_piece_loss: it loses f of each
    piece-second, so engine_slowdown = 1 / (1 - f). The piece's: its seconds within a cell over its round's median
    alone, the median over every piece. Each at least 1 (noise); `by_round`: each round's. ValueError naming what
    no round measured."""
    engine = fit_piece_loss(rows)
    pieces = []
    for rnd, r in rows.groupby("round"):
        piece_alone = r[r["phase"] == "piece_alone"].groupby("piece")["seconds"].median()
        beside = r[(r["phase"] == "piece_streamed") & r["piece"].isin(piece_alone.index)]
        pieces += [(rnd, s / piece_alone[k]) for s, k in zip(beside["seconds"], beside["piece"])]
    if not pieces:
        raise ValueError("fit_streaming: no round measured a piece both alone and within a streamed cell (trainer_slowdown)")
    by_round = {"engine_slowdown": [_slowdown(f) for f in engine["lost_by_round"]],
                "trainer_slowdown": [statistics.median(x for r, x in pieces if r == rnd) for rnd in sorted({r for r, _ in pieces})]}
    streamed = rows[rows["phase"].isin(["engine_streamed", PAIRED, "piece_alone", "piece_streamed"])]
    return {"engine_slowdown": _slowdown(engine["lost_per_piece_second"]),
            "trainer_slowdown": max(1.0, statistics.median(x for _, x in pieces)), **engine,
            "by_round": by_round, "pieces": len(pieces),
            "median_seconds": streamed.groupby("phase")["seconds"].median().round(4).to_dict(),
            "median_busy_seconds": round(float(rows.loc[rows["phase"] == "engine_streamed", "busy"].median()), 4)}


def _slowdown(lost: float) -> float:
    """The engine's factor while pieces run, losing `lost` of each piece-second: 1 where it lost none or "gained"
    (noise: sharing never makes it faster); a round's that lost it all (noise too) shown as 100x, not infinite."""
    return 1 / (1 - min(max(lost, 0.0), 0.99))


def fit_piece_loss(rows: pd.DataFrame) -> dict:
    """What the engine loses per second a piece runs beside it: least squares over every round's engine_paired
    (busy 0) and engine_streamed cells at once, seconds = a_round + f x busy (a_round: the round's cell alone at that
    moment, so drift between rounds does not enter f). Returns lost_per_piece_second (f), its standard error,
    lost_by_round (the same fit in each round alone), spread (their max - min) and cells. ValueError where no round
    measured both kinds of cell, where the pieces' seconds never varied, or where f is not a share (under -0.5 or
    at least 1: the engine lost more than the pieces ran, the machine was busy; measure it alone)."""
    cells = rows[rows["phase"].isin([PAIRED, "engine_streamed"])]
    both = cells.groupby("round")["phase"].nunique()
    cells = cells[cells["round"].isin(both.index[both == 2])]
    if cells.empty:
        raise ValueError(f"fit_piece_loss: no round measured both {PAIRED} cells (alone) and engine_streamed cells "
                         f"(engine_slowdown; a profile measured before {PAIRED} cannot be refitted)")
    busy = cells["busy"] - cells.groupby("round")["busy"].transform("mean")
    seconds = cells["seconds"] - cells.groupby("round")["seconds"].transform("mean")
    if float((busy ** 2).sum()) <= 0:
        raise ValueError("fit_piece_loss: the pieces' busy seconds never varied within a round: no slope to fit")
    lost = float((busy * seconds).sum() / (busy ** 2).sum())
    dof = len(cells) - cells["round"].nunique() - 1
    residual = seconds - lost * busy
    stderr = float(np.sqrt((residual ** 2).sum() / dof / (busy ** 2).sum())) if dof > 0 else float("nan")
    if not -0.5 < lost < 1:
        raise ValueError(f"fit_piece_loss: the engine lost {lost:.2f} s per piece-second (+- {stderr:.2f}) over "
                         f"{len(cells)} cells: not a share of the pieces' seconds; measure it alone on the machine")
    by_round = [float((b * s).sum() / (b ** 2).sum()) if float((b ** 2).sum()) > 0 else float("nan")
                for (_, b), (_, s) in zip(busy.groupby(cells["round"]), seconds.groupby(cells["round"]))]
    return {"lost_per_piece_second": lost, "lost_stderr": stderr, "lost_by_round": by_round,
            "spread": max(by_round) - min(by_round), "cells": int((cells["phase"] == "engine_streamed").sum())}


def write_sharing(profile, fit: dict, meta: dict | None = None) -> None:
    """Put `fit` (and how it was measured) into the profile JSON's measured_by.shared_host, atomically."""
    from lssim.results import atomic_write

    path = Path(profile)
    payload = json.loads(path.read_text())
    payload.setdefault("measured_by", {})[KEY] = {**fit, "measured": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                                                  **(meta or {})}
    atomic_write(path, lambda p: Path(p).write_text(json.dumps(payload, indent=2) + "\n"))


def training_share(profile):
    """The TrainingShare measured into `profile` (lssim.sim.shared_host), its `streamed` factors where the profile
    has them (None: a profile measured before they were), or None where it has no measurement; ValueError naming
    the record that is not one."""
    from lssim.sim.shared_host import TrainingShare

    record = json.loads(Path(profile).read_text()).get("measured_by", {}).get(KEY)
    if record is None:
        return None
    where = f"{profile}: measured_by.{KEY}"
    try:
        streamed = record.get(STREAMED)
        whole = (float(record["engine_slowdown"]), float(record["trainer_slowdown"]))
    except (AttributeError, KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{where} is not a measurement of `lssim profile --shared-host` ({e})") from None
    try:
        pieces = None if streamed is None else TrainingShare(float(streamed["engine_slowdown"]),
                                                             float(streamed["trainer_slowdown"]))
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{where}.{STREAMED} is not a streamed measurement of `lssim profile --shared-host` "
                         f"(engine_slowdown and trainer_slowdown, finite numbers > 0: {e})") from None
    try:
        return TrainingShare(*whole, streamed=pieces)
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None


def describe_streamed(streamed: dict) -> str:
    """fit_streaming's result in a line."""
    rounds = ", ".join(f"{e:.2f}/{t:.2f}" for e, t in zip(*streamed["by_round"].values()))
    return (f"the engine {streamed['engine_slowdown']:.3f}x slower while a piece runs (it loses "
            f"{streamed['lost_per_piece_second']:.3f} +- {streamed['lost_stderr']:.3f} of each piece-second; rounds "
            f"{', '.join(f'{f:.3f}' for f in streamed['lost_by_round'])}), a piece "
            f"{streamed['trainer_slowdown']:.3f}x slower beside the engine (rounds: {rounds}; pieces "
            f"{streamed['median_busy_seconds']:.2f} s of a median cell of {streamed['median_seconds']['engine_streamed']:.2f} s)")


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
    setup = RealSetup(model_dir=args.model_dir, max_model_len=args.max_model_len, kv_cache_gib=args.kv_cache_gib,
                      trainer_process=args.trainer_process)
    prompts, _ = prepare(setup, "baseline", RunConfig(steps=1, groups_per_step=1, group_size=2, max_tokens=args.length))
    engine = start_engine(setup, prompts, seed=0)
    try:
        trainer = GRPOTrainer(setup.model_dir, None, _Prompts(), lr=1e-6, threads=setup.trainer_threads, seed=0,
                              process=setup.trainer_process)
        t0 = time.monotonic()
        rows = measure_sharing(engine, trainer, int(trainer.model.config.vocab_size), rounds=args.repeats + 1,
                               length=args.length, group_size=args.group_size)
        trainer.close()
    finally:
        engine.close()
    fit = fit_sharing(rows)
    write_sharing(out, fit, {"command": " ".join(["lssim", "profile", *sys.argv[2:]]), "seconds": round(time.monotonic() - t0, 1),
                             "trainer_threads": setup.trainer_threads, "trainer_process": setup.trainer_process})
    print(f"shared host: the engine {fit['engine_slowdown']:.3f}x slower beside a GRPO update, the update "
          f"{fit['trainer_slowdown']:.3f}x slower beside the engine (rounds: "
          f"{', '.join(f'{e:.2f}/{t:.2f}' for e, t in zip(*fit['by_round'].values()))}); streamed in groups of "
          f"{args.group_size} (hybrid): {describe_streamed(fit[STREAMED])} -> {out} measured_by.{KEY}", file=sys.stderr)
    return 0


__all__ = ["measure_sharing", "fit_sharing", "fit_streaming", "write_sharing", "training_share", "run_sharing",
           "piece_group", "describe_streamed", "fit_piece_loss"]
