"""What VLLMEngine keeps about its own time, beside serving requests: how busy its instances were (`BusyMeter`,
Engine.utilization), what the streams delivered and when its caller waited for it (`StreamInbox`, `WaitLog`: the
driver's own seconds in a span are the rest), and the collector's frozen heaps (`freeze_heap`)."""

from __future__ import annotations

import bisect
import gc
import queue
import time
from typing import Callable


class BusyMeter:
    """Requests in flight per instance, and their integrals over the engine's clock: instance-seconds with at least
    one request in flight (busy) and request-seconds (seq_seconds), accounted up to the last `account(t)`."""

    def __init__(self, n_instances: int):
        self.in_flight = [0] * n_instances
        self.busy = 0.0
        self.seq_seconds = 0.0
        self._accounted_to = 0.0

    def account(self, t: float) -> None:
        """Accrue the integrals up to `t` (call before the requests in flight change)."""
        dt = t - self._accounted_to
        if dt > 0:
            running = sum(self.in_flight)
            if running:
                self.busy += dt * sum(1 for k in self.in_flight if k)
                self.seq_seconds += dt * running
            self._accounted_to = t

    def least_loaded(self) -> int:
        """The instance with the fewest requests in flight (the first of them)."""
        return self.in_flight.index(min(self.in_flight))


class WaitLog:
    """When the caller waited in next_events for the engine's streams: engine-clock starts and ends, in order, and the
    running total at each end."""

    def __init__(self):
        self._starts: list[float] = []
        self._ends: list[float] = []
        self._total: list[float] = []

    def record(self, began: float, ended: float) -> None:
        self._starts.append(began)
        self._ends.append(ended)
        self._total.append((self._total[-1] if self._total else 0.0) + ended - began)

    def waited_between(self, start: float, end: float) -> float:
        """Seconds of [start, end] spent in the waits recorded."""
        starts, ends, total = self._starts, self._ends, self._total
        i, j = bisect.bisect_right(ends, start), bisect.bisect_left(starts, end)  # the waits overlapping the span
        if i >= j:
            return 0.0
        inner = total[j - 1] - (total[i - 1] if i else 0.0)
        return inner - max(0.0, start - starts[i]) - max(0.0, ends[j - 1] - end)


def freeze_heap() -> None:
    """Collect, then move every object alive into the collector's permanent generation (gc.freeze).

    Why: once vLLM and torch are loaded, the driver and each instance's worker process hold 0.7-0.9 million objects
    each, and a full collection holds the process's GIL while it scans them: in the driver every token stream stops,
    in a worker its instance stops generating (python -m paper.experiments.measure_gc_stall: a collection forced
    mid-rollout stopped the streams for 0.47-1.36 s in the driver and 0.44-0.46 s in the workers; frozen, for <10 ms).
    Python starts a full collection by itself now and then: 5 of 5280 recorded steps began with every first token
    0.37-0.75 s late on every instance at once (the driver), and in 3 steps of seer runs one instance made no
    progress for 0.5-1.0 s while the other's tokens kept arriving (its worker, most likely). Called in the driver
    and, through VLLMEngine.freeze_heaps, in the workers, once the engine is warm and before every real run. Objects
    frozen are still freed when their last reference goes; only reference cycles among them wait for `gc.unfreeze()`.
    """
    gc.collect()
    gc.freeze()


def worker_freeze_heap(worker) -> int:
    """freeze_heap in a vLLM worker process (run there by collective_rpc); the objects frozen there."""
    freeze_heap()
    return gc.get_freeze_count()


__all__ = ["BusyMeter", "WaitLog", "freeze_heap", "worker_freeze_heap"]


class StreamInbox:
    """What the request streams deliver (engine_stream.drain puts each item from AsyncLLM's loop), taken on the caller's
    thread: `held`, items taken but not processed yet (VLLMEngine._process holds those after a wake for the next call),
    and `waits`, when the caller waited (WaitLog)."""

    def __init__(self):
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self.put = self._queue.put
        self.held: list = []
        self.waits = WaitLog()

    def take(self, now: Callable[[], float], until: float | None, idle_check: Callable[[float], None]) -> list:
        """The held items and everything delivered since, waiting for at least one (or until `now()` reaches `until`:
        [] then); after each idle second `idle_check(monotonic time the wait began)` may raise (the engine is gone or
        stalled). The wait is recorded in `waits`."""
        items, self.held = self.held, []
        began, since = now(), time.monotonic()
        try:
            while not items:
                wait = 1.0 if until is None else min(1.0, max(0.0, until - now()))
                try:
                    items = [self._queue.get(timeout=wait)]
                except queue.Empty:
                    if until is not None and now() >= until:
                        return []
                    idle_check(since)
            while True:
                try:
                    items.append(self._queue.get_nowait())
                except queue.Empty:
                    return items
        finally:
            self.waits.record(began, now())
