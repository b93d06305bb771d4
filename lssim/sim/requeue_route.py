"""The requeue route: a rollout whose only reactions to single events are requeues at progress checkpoints by seer's
rules (Policy.progress_requeues, lssim.sim.requeue_rules), run whole in one numba kernel (lssim.sim.requeue_loop) and
booked as the batch route books a rollout (lssim.loop.rollout_books.rollout_batch).

A requeue moves a running response to another instance at its checkpoint's time, and where it is admitted there
depends on both instances' clocks, so the instances cannot be scheduled one by one in integers and priced afterwards
as the batch route's kernels do: the kernel runs the event engine's multi-instance loop (lssim.sim.world.SimEngine,
operation for operation) with the controller's handling of each event and the policy's rules inside it, pricing each
span with the roofline as it goes. What it hands back is what the event route leaves: the columns filled as the
event engine fills its Request objects (the latest submission's instance, submit and first-token times), the rows in
the order they ended, the engine's clocks and counters.

Taken where the engine prices with the roofline alone (RooflineCostModel: its aborts cost the caller nothing, its
departures nothing); any other cost model, or speculation, keeps the event route (SimEngine.set_requeue_rollout).
"""

from __future__ import annotations

import itertools

import numpy as np

from lssim.loop.core import LENGTH, STOP
from lssim.sim.fastsim import _answers, _check_fits, count_sources
from lssim.sim import requeue_kernels as k
from lssim.sim.requeue_loop import run_requeues


def run_requeued(engine, requests, queue: np.ndarray | None, rules_of) -> np.ndarray:
    """Run `requests` (lssim.loop.columns.RequestColumns, every row placed by the policy; `queue`: the rows in the
    order queued, None: row order) on the idle engine until every one ended, requeued at its checkpoints as
    `rules_of(requests)` (Policy.progress_requeues: lssim.sim.requeue_rules.RequeueRules) says. Returns the rows in
    the order the event route ends them; the columns are filled and the engine moved as it would have."""
    if any(inst.n or inst.pending for inst in engine.instances):
        raise RuntimeError("requeue rollout: the engine must be idle when a submission comes")
    if engine._spec_batch:
        raise RuntimeError("requeue rollout: the engine speculates, which its kernel does not price")
    _check_fits(requests, engine.config.kv_capacity_tokens)
    placed = requests.instance
    if len(placed) and placed.min() < 0:
        raise ValueError("requeue rollout: every request must be placed by the policy (Policy.placements), "
                         f"row {int(np.argmin(placed))} is not")
    answers = _answers(engine, requests)
    rules = rules_of(requests)
    queue = np.arange(len(requests)) if queue is None else queue
    placed = placed % engine.n_instances
    room = _room(answers[0], requests.generated, engine._interval or 0, engine.n_instances)
    while True:
        wf, wi = _world(engine, requests, rules, answers, placed, room)
        error = run_requeues(wf, wi, queue, placed, float(engine.clock))
        if error != k.OUT_OF_ROOM:
            break
        room *= 4
    if error:
        raise RuntimeError(f"instance {error - 1} is idle with waiting requests it cannot admit")
    count_sources(engine, answers[5])
    _commit(engine, wf, wi)
    _fill(requests, wf, wi, answers)
    return wi[wi[k.H_ENDED]:wi[k.H_ENDED] + wi[k.C_ENDED]].copy()


def _room(length: np.ndarray, generated: np.ndarray, interval: int, n_inst: int) -> int:
    """Heap entries the kernel makes room for at first: a few per request and per checkpoint (requeues and preemption
    add more; the kernel says when it runs out, and runs again with four times the room)."""
    checkpoints = int(np.maximum(0, length - generated - 1).sum() // interval) if interval else 0
    return 5 * len(length) + 6 * checkpoints + 64 * n_inst


def _world(engine, requests, rules, answers, placed: np.ndarray, room: int) -> tuple[np.ndarray, np.ndarray]:
    """(wf, wi): lssim.sim.requeue_kernels' world for this submission on the engine as it stands."""
    m, n_inst, cfg = len(requests), engine.n_instances, engine.config
    length, reason = answers[0], answers[1]
    groups, group = np.unique(requests.group_id, return_inverse=True)
    heap = 2 * room // n_inst + 1024
    wi_sizes = {k.H_R: m * k.N_R, k.H_I: n_inst * k.N_I, k.H_RS: n_inst * cfg.max_num_seqs, k.H_SL: 3 * room,
                k.H_EV: 2 * room, k.H_RUN: 2 * n_inst * heap, k.H_WAIT: 2 * n_inst * heap, k.H_GROUPS: len(groups),
                k.H_BUF: 3 * cfg.max_num_seqs, k.H_ENDED: m}
    wf_sizes = {k.HF_RF: m * k.N_RF, k.HF_I: n_inst * k.N_F, k.HF_EV: room, k.HF_RUN: n_inst * heap,
                k.HF_WAIT: n_inst * heap}
    wi = np.zeros(k.N_HEADER + sum(wi_sizes.values()), np.int64)
    wf = np.zeros(k.N_HEADER_F + sum(wf_sizes.values()))
    blocks = {}
    for sizes, at in ((wi_sizes, k.N_HEADER), (wf_sizes, k.N_HEADER_F)):
        for name, size in sizes.items():
            wi[name], blocks[name] = at, at
            at += size
    wi[[k.N_INST, k.G_KV, k.G_SEQS, k.G_INTERVAL, k.G_REBALANCE, k.G_EVERY, k.G_HEAP, k.G_ROOM]] = \
        n_inst, cfg.kv_capacity_tokens, cfg.max_num_seqs, engine._interval or 0, rules.rebalance, rules.every_chunk, \
        heap, room
    r = wi[blocks[k.H_R]:blocks[k.H_R] + m * k.N_R].reshape(m, k.N_R)
    r[:, k.R_PROMPT], r[:, k.R_LENGTH], r[:, k.R_PRIO] = requests.prompt_len, length, requests.priority
    r[:, k.R_PROBE], r[:, k.R_EST], r[:, k.R_GROUP] = rules.probe, rules.estimate, group
    r[:, k.R_LEARN] = (reason == STOP) | (reason == LENGTH)  # on_finish learns from a response that ended by itself
    r[:, k.R_GEN], r[:, k.R_SEER] = requests.generated, placed
    r[:, [k.R_WHERE, k.R_SLOT, k.R_RAN]] = -1  # nowhere yet
    known = wi[blocks[k.H_GROUPS]:blocks[k.H_GROUPS] + len(groups)]
    known[:] = -1
    known[group[rules.known]] = rules.estimate[rules.known]
    ii = wi[blocks[k.H_I]:blocks[k.H_I] + n_inst * k.N_I].reshape(n_inst, k.N_I)
    f = wf[blocks[k.HF_I]:blocks[k.HF_I] + n_inst * k.N_F].reshape(n_inst, k.N_F)
    for i, x in enumerate(engine.instances):
        ii[i, [k.I_IT, k.I_N, k.I_CTX, k.I_VERSION, k.I_PENDING, k.I_LEFT_AT, k.I_LEFT]] = x.it, x.n, x.ctx, x.version, \
            x.pending, x.left_at, x.left
        f[i, [k.F_T, k.F_BUSY, k.F_SEQS, k.F_OWED]] = x.t, x.busy, x.seq_seconds, x.owed
    ii[:, k.I_COUNT] = rules.counts
    wf[k.W_COST:k.W_COST + 7] = engine.cost.kernel_coefficients()
    wf[blocks[k.HF_RF]:blocks[k.HF_RF] + m * k.N_RF] = np.nan
    return wf, wi


def _commit(engine, wf: np.ndarray, wi: np.ndarray) -> None:
    """The engine as the rollout leaves it: each instance's clocks and counters (every entry of its Python heaps
    stale), the clock, preemptions, and its push counter moved on by the pushes made."""
    n_inst = engine.n_instances
    ii = wi[wi[k.H_I]:wi[k.H_I] + n_inst * k.N_I].reshape(n_inst, k.N_I).tolist()
    f = wf[wi[k.HF_I]:wi[k.HF_I] + n_inst * k.N_F].reshape(n_inst, k.N_F).tolist()
    for x, c, t in zip(engine.instances, ii, f):
        x.it, x.n, x.ctx, x.pending = c[k.I_IT], c[k.I_N], c[k.I_CTX], c[k.I_PENDING]
        x.left_at, x.left, x.version = c[k.I_LEFT_AT], c[k.I_LEFT], c[k.I_VERSION] + 1
        x.t, x.busy, x.seq_seconds, x.owed = t[k.F_T], t[k.F_BUSY], t[k.F_SEQS], t[k.F_OWED]
        x.priced = (0, 0, 0, 0.0)
    engine.clock = float(wf[k.W_CLOCK])
    engine.preemptions += int(wi[k.C_PREEMPT])
    engine._seq = itertools.count(next(engine._seq) + int(wi[k.C_SEQ]))


def _fill(requests, wf: np.ndarray, wi: np.ndarray, answers: tuple) -> None:
    """The columns as the event engine leaves its Request objects once every row ended."""
    m = len(requests)
    r = wi[wi[k.H_R]:wi[k.H_R] + m * k.N_R].reshape(m, k.N_R)
    rf = wf[wi[k.HF_RF]:wi[k.HF_RF] + m * k.N_RF].reshape(m, k.N_RF)
    length, reason, reward, exact = answers[:4]
    requests.ran_on[:] = requests.instance[:] = r[:, k.R_RAN]
    requests.priority[:] = r[:, k.R_PRIO]
    requests.submit_time[:], requests.first_token_time[:] = rf[:, k.RF_SUBMIT], rf[:, k.RF_FIRST]
    requests.finish_time[:] = rf[:, k.RF_FINISH]
    requests.generated[:] = r[:, k.R_GEN]
    requests.finish_reason[:], requests.reward[:], requests.exact[:] = reason, reward, exact
    requests.natural_len[:], requests.natural_reward[:] = length, reward
