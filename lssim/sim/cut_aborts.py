"""The engine at a cut (lssim.sim.cut_route) as arrays: every instance the submission reached as the event engine
stands right after the cut's boundary, and what is still in flight there, held until the controller aborts it.

The controller's next command after a cut is to abort everything still in flight (Controller._settle_unfinished:
SimEngine.abort_many). Where the roofline prices the engine, that abort runs on these arrays in one compiled pass
(lssim.sim.cut_abort_kernels), to the last bit as abort_many runs it on the event engine's heaps, and no heap is built;
any other command first builds the heaps (`materialize`), as the cut route did before it held them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lssim.loop.columns import rids_of
from lssim.loop.core import FINISHED
from lssim.loop.row_requests import CarriedRows, RowRequests


@dataclass(slots=True)
class HeldCut:
    """The instances the cut reached (`reached`) as arrays: per instance its clocks (t, busy, seq_seconds, owed) and
    integers (it, n, ctx, left_at, left); the rows in flight grouped by instance (instance i's are
    starts[i]..starts[i + 1]) in the order it admits them, each with its row of the submission (`rows`: its object
    made when read), rid, prompt, target length, tokens when admitted or queued (`gen`) and admission iteration (-1:
    queued)."""

    reached: np.ndarray
    clocks: np.ndarray  # (n_instances, 4) float64
    ints: np.ndarray  # (n_instances, 5) int64
    starts: np.ndarray
    requests: RowRequests  # the submission's, of whose rows `rows` are those in flight (objects made when read)
    rows: np.ndarray
    rid: np.ndarray
    prompt: np.ndarray
    length: np.ndarray
    gen: np.ndarray
    admit_it: np.ndarray

    def materialize(self, engine) -> None:
        """The event engine's instances and heaps as this cut leaves them (each instance's running sequences, admitted
        at the iteration and tokens held, and its queue)."""
        epochs, where, seq = engine._epoch, engine._where, engine._seq
        objects = self.requests.make(self.rows)
        for i in self.reached.tolist():
            x = engine.instances[i]
            self._set_scalars(x, i)
            x.version += 1
            lo, hi = int(self.starts[i]), int(self.starts[i + 1])
            members, heap, waiting = {}, [], []
            for r, admit, gen, length in zip(objects[lo:hi], self.admit_it[lo:hi].tolist(),
                                             self.gen[lo:hi].tolist(), self.length[lo:hi].tolist()):
                arrival = next(seq)  # the engine's own counter: its later entries come after
                epoch = epochs[r.rid] = epochs.get(r.rid, 0) + 1
                where[r.rid] = x
                if admit >= 0:
                    members[r.rid] = (r.priority, arrival, admit, gen, r)
                    heap.append((admit + max(0, length - gen), arrival, FINISHED, epoch, r))
                else:
                    waiting.append((r.priority, arrival, epoch, r))
            if len(members) != x.n:
                raise RuntimeError(f"cut route: instance {i} runs {len(members)} sequences, its schedule says {x.n}")
            heap.sort(key=lambda e: e[:2])
            x.members, x.running, x.waiting = members, heap, sorted(waiting, key=lambda e: e[:2])
            x.pending = len(members) + len(waiting)

    def abort_all(self, engine, requests) -> bool:
        """SimEngine.abort_many(requests) where `requests` are exactly the requests in flight (any order), in one
        compiled pass; False (nothing done) where they are not."""
        from lssim.sim.cut_abort_kernels import abort_in_flight

        at = self._rows_of(requests)
        if at is None:
            return False
        clock = np.cumsum(np.concatenate([[engine.clock], np.full(len(at), engine.cost.abort_time(1))]))
        by_instance = np.argsort(np.repeat(np.arange(len(self.starts) - 1), np.diff(self.starts))[at], kind="stable")
        first_token = np.full(len(at), np.nan)
        cfg = engine.config
        abort_in_flight(engine.cost.kernel_coefficients(), cfg.kv_capacity_tokens, cfg.max_num_seqs, self.starts,
                        self.prompt, self.length, self.gen, self.admit_it, at[by_instance], clock[1:][by_instance],
                        self.ints, self.clocks, first_token)
        engine.clock = float(clock[-1])
        for i in self.reached.tolist():
            x = engine.instances[i]
            self._set_scalars(x, i)
            x.version += 1 + (self.starts[i + 1] > self.starts[i])  # materialize's, abort_many's _schedule
            x.members, x.running, x.waiting, x.pending = {}, [], [], 0
        # (no epoch moves: epochs retire heap entries, and these requests have none; a later submit bumps theirs)
        ran = np.flatnonzero((self.admit_it >= 0) | (first_token == first_token))  # queued throughout: as they were
        rows, gen, first_token = self.rows[ran], self.gen[ran], first_token[ran]
        has = self.requests.has(rows)
        filled, as_rows = self.requests.filled, ~has  # (no object made: its filled row holds it, RowRequests.hold)
        filled.generated[rows[as_rows]] = gen[as_rows]
        started = as_rows & (first_token == first_token)
        filled.first_token_time[rows[started]] = first_token[started]
        for r, g, first in zip(self.requests.made_of(rows), gen[has].tolist(), first_token[has].tolist()):
            r.generated = g
            if first == first:
                r.first_token_time = first
        return True

    def _rows_of(self, requests) -> np.ndarray | None:
        """Each of `requests`' row in flight, where they are exactly the requests in flight; else None."""
        if len(requests) != len(self.rid):
            return None
        rids = requests.rids() if isinstance(requests, CarriedRows) else rids_of(requests)
        order = np.argsort(self.rid, kind="stable")
        at = order[np.minimum(np.searchsorted(self.rid[order], rids), len(order) - 1)] if len(order) else order
        if not np.array_equal(self.rid[at], rids) or np.bincount(at, minlength=len(at)).max(initial=1) > 1:
            return None
        return at

    def _set_scalars(self, x, i: int) -> None:
        (x.t, x.busy, x.seq_seconds, x.owed), (x.it, x.n, x.ctx, x.left_at, x.left) = \
            self.clocks[i].tolist(), self.ints[i].tolist()
        x.priced = (0, 0, 0, 0.0)
