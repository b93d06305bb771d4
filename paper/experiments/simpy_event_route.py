"""The event route on SimPy's Environment against today's heap: what SimPy costs per event, same events, same outputs.

    python -m paper.experiments.simpy_event_route                    # both measurements, breaker and segment
    python -m paper.experiments.simpy_event_route --repeats 5 --policies breaker segment
    python -m paper.experiments.simpy_event_route --only simpy --policy breaker   # one run, to time as a process

The event route (lssim.sim.world.SimEngine with batch_route=False) keeps its instance events in one heap of
(time, seq, instance, version, iteration) and wake_at's timers in another; next_events pops the earlier of the two,
timers first on a tie, and skips an instance entry whose version is stale. `SimPyEngine` below is that loop on a
`simpy.Environment`: each instance event and each timer is a SimPy event in the Environment's queue (timers at
URGENT priority, so they still win a tie), popped by `Environment.step()`, whose callback hands the payload back.
Everything else (admission, pricing, preemption, progress checkpoints) is the engine's own code, unchanged.

SimPy is not a dependency of lssim (this experiment is why): `pip install simpy` (4.1) to run it.

Two measurements, each alternating heap and SimPy run by run and quoting the median of the pairwise ratios of the
process's CPU seconds (time.process_time: on a shared machine wall seconds mostly measure the neighbours):

1. Whole runs: `lssim.analysis.replay.simulate(..., batch_route=False)` on traces/math7b.parquet per policy, with
   SimEngine and with SimPyEngine, responses and steps frames and run meta checked equal; responses/s and the
   queue's events/s for both.
2. The queue alone: the push/pop sequence a SimPy run recorded, replayed on heapq and on a bare Environment
   (the same event times and priorities, a no-op callback): what SimPy's event objects and step() cost per event.

An event's exact time travels in its payload, so the clock never takes SimPy's `now + (t - now)` (which can round);
SimPy's queue only orders. Lazy instances schedule some events before the last one popped (a newly admitted request
on an instance that was behind the clock), which SimPy's Timeout refuses (negative delay): those go in as an `_At`,
a Timeout without that check. The script counts them.
"""

from __future__ import annotations

import argparse
import heapq
import statistics
import time
from contextlib import contextmanager

try:
    import simpy
    from simpy.events import NORMAL, URGENT
except ImportError as missing:  # not one of lssim's dependencies
    raise SystemExit("this experiment needs SimPy: pip install 'simpy>=4.1'") from missing

import lssim.analysis.replay as replay_module
from lssim.analysis.replay import SimSetup, simulate
from lssim.loop.core import WAKE, Event
from lssim.sim.world import SimEngine
from lssim.traces.trace import load_trace
from lssim.traces.workload import Workload

TRACE = "traces/math7b.parquet"
POP = None  # a recorded queue operation: a pop, or (time, priority) for a push


class _At(simpy.Event):
    """simpy.Timeout's own initialisation without its `delay >= 0` check: an event at an absolute time that may lie
    before `env.now` (the heap route pops such an entry next, as this does)."""

    def __init__(self, env: simpy.Environment, delay: float, value, priority: int):
        self.env, self.callbacks = env, []
        self._value, self._ok = value, True
        env.schedule(self, priority, delay)


class SimPyEngine(SimEngine):
    """SimEngine whose event queue and timers are one simpy.Environment (the event route only)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **{**kwargs, "batch_route": False})
        self.env = simpy.Environment()
        self.popped = None  # the payload of the event Environment.step() just processed
        self.behind = 0  # events scheduled before env.now (outside Timeout's contract)

    def _at(self, t: float, payload) -> None:
        """An instance event at time t (NORMAL priority, as a Timeout is)."""
        delay = t - self.env.now
        if delay >= 0:
            event = simpy.Timeout(self.env, delay, (t, payload))
        else:
            self.behind += 1
            event = _At(self.env, delay, (t, payload), NORMAL)
        event.callbacks.append(self._take)

    def _take(self, event) -> None:
        self.popped = event.value

    def wake_at(self, time: float) -> None:
        """A timer: URGENT, so that it is processed before an instance event at the same time, as the heap route does
        (a Timeout is always NORMAL)."""
        delay = time - self.env.now
        if delay < 0:
            self.behind += 1
        _At(self.env, delay, (time, None), URGENT).callbacks.append(self._take)

    def _schedule(self, inst) -> None:  # SimEngine._schedule with the push into the Environment
        inst.version += 1
        if inst.n == 0:
            if inst.waiting:
                raise RuntimeError(f"instance {inst.idx} is idle with {len(inst.waiting)} waiting requests it cannot admit")
            return
        target_it = self._next_iteration(inst)
        k = target_it - inst.it
        span = self.cost.decode_time(inst.n, inst.ctx, k)
        inst.priced = (inst.n, inst.ctx, k, span)
        self._at(inst.t + inst.owed + span, (inst.idx, inst.version, target_it))

    def next_events(self) -> list[Event]:  # SimEngine.next_events with Environment.step() as the pop
        env, instances = self.env, self.instances
        while env.peek() != float("inf"):
            env.step()
            t, payload = self.popped
            if payload is None:
                self.clock = max(self.clock, t)
                return [Event(WAKE, None, self.clock)]
            idx, version, target_it = payload
            inst = instances[idx]
            if version != inst.version:
                continue
            if t > self.clock:
                self.clock = t
            out = self._fire(inst, target_it)
            self._admit(inst)
            self._schedule(inst)
            if out:
                return out
        return []


class RecordingSimPyEngine(SimPyEngine):
    """SimPyEngine that writes down its queue's operations (pushes with time and priority, pops) for measurement 2."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.ops: list = []

    def _at(self, t, payload):
        self.ops.append((t, NORMAL))
        super()._at(t, payload)

    def wake_at(self, time):
        self.ops.append((time, URGENT))
        super().wake_at(time)

    def _take(self, event):
        self.ops.append(POP)
        super()._take(event)


@contextmanager
def engine_class(cls):
    """simulate() builds its engine from lssim.analysis.replay's SimEngine: swap the class in for one run."""
    saved = replay_module.SimEngine
    replay_module.SimEngine = cls
    try:
        yield
    finally:
        replay_module.SimEngine = saved


def run(workload: Workload, policy: str, cls):
    """(result, seconds, engine) of one event-route run with engine class `cls`."""
    made = []

    class Kept(cls):  # keeps a hold of the engine simulate() builds
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    with engine_class(Kept):
        start = time.process_time()
        result = simulate(workload, policy, SimSetup(), batch_route=False)
        seconds = time.process_time() - start
    return result, seconds, made[0]


def same_outputs(a, b) -> bool:
    return a.responses.equals(b.responses) and a.steps.equals(b.steps) and repr(a.meta) == repr(b.meta)


def replay_heap(ops) -> float:
    queue, seq, push, pop = [], 0, heapq.heappush, heapq.heappop
    start = time.process_time()
    for op in ops:
        if op is POP:
            pop(queue)
        else:
            seq += 1
            push(queue, (op[0], seq, op[1]))
    return time.process_time() - start


def _noop(event) -> None:
    pass


def replay_simpy(ops) -> float:
    env = simpy.Environment()
    start = time.process_time()
    for op in ops:
        if op is POP:
            env.step()
        else:
            t, priority = op
            delay = t - env.now
            event = simpy.Timeout(env, delay) if delay >= 0 and priority == NORMAL else _At(env, delay, None, priority)
            event.callbacks.append(_noop)
    return time.process_time() - start


def paired(time_a, time_b, repeats: int) -> tuple[float, float, float]:
    """(median A seconds, median B seconds, median of the pairwise A/B ratios), runs alternating A B A B."""
    a, b = [], []
    for _ in range(repeats):
        a.append(time_a())
        b.append(time_b())
    return statistics.median(a), statistics.median(b), statistics.median(x / y for x, y in zip(a, b))


def measure(policy: str, workload: Workload, repeats: int) -> None:
    heap_result, _, _ = run(workload, policy, SimEngine)
    recorded, _, engine = run(workload, policy, RecordingSimPyEngine)
    if not same_outputs(heap_result, recorded):
        raise SystemExit(f"{policy}: the SimPy event route's outputs differ from the heap's")
    ops = engine.ops
    pushes = sum(op is not POP for op in ops)
    pops = len(ops) - pushes
    responses = len(heap_result.responses)
    print(f"{policy}: {responses} responses, {pushes} events scheduled, {pops} processed "
          f"({engine.behind} before SimPy's now: {engine.behind / pushes:.1%}); outputs equal (responses, steps, meta)")

    def whole(cls):
        result, seconds, _ = run(workload, policy, cls)
        if not same_outputs(heap_result, result):
            raise SystemExit(f"{policy}: {cls.__name__}'s outputs differ")
        return seconds

    simpy_s, heap_s, ratio = paired(lambda: whole(SimPyEngine), lambda: whole(SimEngine), repeats)
    print(f"  whole run    heap {responses / heap_s:9,.0f} responses/s {pops / heap_s:11,.0f} events/s | "
          f"simpy {responses / simpy_s:9,.0f} responses/s {pops / simpy_s:11,.0f} events/s | simpy/heap time {ratio:.3f}")
    simpy_q, heap_q, ratio_q = paired(lambda: replay_simpy(ops), lambda: replay_heap(ops), max(repeats, 5))
    print(f"  queue alone  heap {pops / heap_q:11,.0f} events/s | simpy {pops / simpy_q:11,.0f} events/s | "
          f"simpy/heap time {ratio_q:.2f}; SimPy's extra queue time = {(simpy_q - heap_q) / heap_s:.1%} of a heap run")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", default=TRACE)
    parser.add_argument("--policies", nargs="+", default=["breaker", "segment"])
    parser.add_argument("--repeats", type=int, default=3, help="paired runs per policy (median ratio quoted)")
    parser.add_argument("--only", choices=["heap", "simpy"], help="one run of --policy on that queue, nothing printed "
                                                                   "(to time whole processes against each other)")
    parser.add_argument("--policy", default="breaker")
    args = parser.parse_args(argv)
    workload = Workload(load_trace(args.trace), seed=0)
    if args.only:
        run(workload, args.policy, SimPyEngine if args.only == "simpy" else SimEngine)
        return
    for policy in args.policies:
        measure(policy, workload, args.repeats)


if __name__ == "__main__":
    main()
