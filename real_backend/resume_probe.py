"""What resubmitting responses in flight costs beyond their re-prefill: the profile's resume price (r1).

    resumes = measure_resumes(engine, model)        # engine: a VLLMEngine; model: the profile's fit so far
    model.resume_seconds = fit_resume_seconds(resumes)

An async run's weights arrive mid-rollout: the controller aborts every response in flight (one call), loads the
weights and resubmits each with its tokens so far, to be re-prefilled (lssim.loop.controller `_weights_arrived`); a
carried response is resubmitted the same way at its next step, a requeued one at once. The simulator prices the
abort (a1, real_backend.profile.measure_aborts) and the re-prefill (the profile's prefill), and nothing else; the
front end takes each resubmitted request back as a new one, and the engine frees what the abort left, which on this
2-core VM costs more than both (paper/experiments/measure_arrival.py: 15-40 ms unpriced per arrival of 16-64).

Cells of n requests (8-token random prompts) on one instance, run until every one has `at` tokens; then either
nothing happens (plain) or every one is aborted, vLLM's prefix cache dropped (as the arrival's weight load drops it:
otherwise the re-prefill is answered from the cache) and every one resubmitted (resume); the cell ends once every one has
`MORE` tokens more. A resume cell's extra seconds over the plain cells' median at its n, minus what the simulator
charges for the same (a1 x n, then one prefill of the n prompts with their tokens), is the unpriced part; r1 is its
least-squares slope through the origin on n (0 if negative: the simulator then prices resumes as before). The
weight load of an arrival is not measured here: the trainer's sync is priced apart.
"""

from __future__ import annotations

import time

import numpy as np
import pandas as pd

from lssim.loop.core import Request

from .cells import random_requests

RESUME_SIZES = (16, 32, 64)  # responses in flight at an arrival: a step's batch or a few groups of it
MORE = 8  # tokens every request generates after the resume point before its cell ends
PROMPT_LEN = 8


def _run_until(engine, requests: list[Request], tokens: int) -> None:
    """Until every request not finished has generated `tokens` (its progress events come every few tokens)."""
    while any(r.generated < tokens and not r.finish_reason for r in requests):
        if not engine.next_events():
            return


def resume_cell(engine, requests: list[Request], at: int, resume: bool, load=None) -> dict:
    """One cell, submitted already: seconds from the resume point (`at` tokens each) until `MORE` tokens more, and
    the abort, cache reset and resubmit calls' own wall time (0 for a plain cell). What is left running is aborted
    after. `load`: instead of the cache reset, a call that loads weights and returns its own seconds (a whole
    arrival: paper/experiments/measure_arrival.py --push), which are left out of both figures."""
    _run_until(engine, requests, at)
    t0 = time.monotonic()
    calls = loaded = 0.0
    if resume:
        running = [r for r in requests if not r.finish_reason]
        engine.abort_many(running)
        if load is None:
            engine.reset_prefix_cache()  # as the arrival's weight load does: the re-prefill is not answered from the cache
        else:
            loaded = load()
        engine.submit(running)
        calls = time.monotonic() - t0 - loaded
    _run_until(engine, requests, at + MORE)
    seconds = time.monotonic() - t0 - loaded
    engine.abort_many([r for r in requests if not r.finish_reason])
    return {"seconds": seconds, "calls_seconds": calls, "load_seconds": loaded}


def measure_resumes(engine, model, sizes=RESUME_SIZES, rounds: int = 3, at: int = 32, seed: int = 5,
                    instance: int | None = None, load=None) -> pd.DataFrame:
    """Plain and resume cells of each size in `sizes`, `rounds` times each in a seeded random order (the first cell
    runs once before, unrecorded). Rows: n, resume (bool), seconds, calls_seconds, priced_seconds (what `model`
    charges for the resume: its abort and re-prefill; 0 for a plain cell), load_seconds (`load`: resume_cell)."""
    rng = np.random.default_rng(seed)
    plan = [(n, resume) for _ in range(rounds) for n in sizes for resume in (False, True)]
    plan = [(max(sizes), True)] + [plan[i] for i in rng.permutation(len(plan))]
    rows, rid = [], 2 * 10**9  # rids apart from the profile's other cells
    engine.set_progress_interval(4)
    try:
        for j, (n, resume) in enumerate(plan):
            prompts, requests = random_requests(rng, engine.vocab_size, [4 * (at + MORE)] * n, rid, PROMPT_LEN, instance)
            rid += n
            with engine.serving_exactly(prompts):
                engine.submit(requests)
                row = resume_cell(engine, requests, at, resume, load)
            if j:
                priced = model.abort_time(n) + model.prefill_time(n * (PROMPT_LEN + at)) if resume else 0.0
                rows.append({"n": n, "resume": resume, **row, "priced_seconds": priced})
    finally:
        engine.set_progress_interval(None)
    return pd.DataFrame(rows)


def resume_table(cells: pd.DataFrame) -> pd.DataFrame:
    """Per n: the plain and resume cells' median seconds, the resume calls' wall time, the resume's measured cost
    (their difference), what the simulator prices of it, and the unpriced rest."""
    med = cells.groupby(["n", "resume"])[["seconds", "calls_seconds", "priced_seconds"]].median().unstack("resume")
    out = pd.DataFrame({"plain_seconds": med[("seconds", False)], "resume_seconds": med[("seconds", True)],
                        "calls_seconds": med[("calls_seconds", True)], "priced_seconds": med[("priced_seconds", True)]})
    out["measured_cost_seconds"] = out["resume_seconds"] - out["plain_seconds"]
    out["unpriced_seconds"] = out["measured_cost_seconds"] - out["priced_seconds"]
    return out


def fit_resume_seconds(cells: pd.DataFrame) -> float:
    """r1: seconds per request resubmitted, the least-squares slope through the origin of the unpriced part on n
    (resume_table), at least 0."""
    if cells.empty:
        return 0.0
    table = resume_table(cells).dropna()
    n, unpriced = table.index.to_numpy(float), table["unpriced_seconds"].to_numpy(float)
    return float(max(0.0, (n * unpriced).sum() / (n * n).sum())) if len(n) else 0.0
