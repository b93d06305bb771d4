"""A real GRPO step as a job beside the rollout: the execution modes that train beside it (lssim.loop.modes) on vLLM.

    job = trainer.start(groups, step)     # GRPOTrainer.start: the update runs on the trainer's lane (TrainLane)
    job.ready(engine) / job.wait(engine)  # done yet? / block until done (the trainer's error, if any, is raised)
    job.notify(engine)                    # the engine reports Event(WAKE) when the job is done
    job.push(engine)                      # its weights into the idle engine (nothing may be in flight)

The contract lssim.loop.contracts.TrainJob, as the simulator's priced `lssim.loop.modes.PricedTrainJob`, so the modes are written once. Where it runs:
one thread per trainer (a one-worker executor: jobs run one after another, in the order started, as on a train
device group), beside the controller's thread and vLLM's engine core (a separate process). torch releases the GIL
in its kernels, so the update and the engine's decoding overlap on two cores. The trainer's torch threads are
`RealSetup.trainer_threads` (default 1); vLLM's CPU build binds its worker's OpenMP threads itself
(VLLM_CPU_OMP_THREADS_BIND=auto: on a 2-core machine one core for the worker, one reserved for the rest), and
`RealSetup.trainer_cpus` may pin the trainer's thread (os.sched_setaffinity on the thread). With
`RealSetup.trainer_process` the thread hands each forward and backward pass to the trainer's worker process
(real_backend.train_compute) and waits for it without the interpreter's lock, so the driver's Python work no longer
slows the update's.

The interpreter's switch interval is left at Python's 5 ms: at 0.1 ms while a lane lived, an update beside a thread
running Python without pause lost 0.04 s instead of 0.25 s, but the runs' rollouts ran 3-4% slower in async and
hybrid (eight pairs each, 13 of 16 slower; `python -m paper.experiments.measure_switch_interval`). Likely, not
measured: the driver shares the lock with vLLM's output thread all rollout long and hands it over more often.

A job's weights are a snapshot taken on the trainer's thread as the update ends (a clone of the state dict), so a
later job that trains meanwhile cannot change what an earlier one pushes. Its times (`start`, `end`) are on the
engine's clock (seconds since the engine started): when the update began and when its weights were ready.
"""

from __future__ import annotations

import math
import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

from lssim.loop.contracts import TrainJob
from lssim.loop.core import Group


class ThreadTrainJob(TrainJob):
    __slots__ = ("step", "version", "start", "end", "metrics", "future", "groups", "rerun", "_state")

    def __init__(self, step: int):
        self.step, self.version = step, step + 1
        self.start = self.end = math.nan
        self.groups: list[Group] = []  # what it trains (a checkpoint taken while it runs re-runs it on resume)
        self.rerun = False  # re-run by a resumed run: its times are the resume's, not its step's
        self.metrics: dict = {}  # replaced whole (never mutated) by the trainer's thread when the update ends
        self.future: Future | None = None
        self._state: dict | None = None

    def ready(self, engine) -> bool:
        return self.future.done()

    def wait(self, engine) -> None:
        self.future.result()  # re-raises whatever stopped the update

    def notify(self, engine) -> None:
        engine.wake_when(self.future)

    def push(self, engine) -> None:
        """The update's weights into the engine, which must be idle (the mode pushes between steps, the controller
        after aborting what was in flight); the seconds it took become the job's `sync_seconds`."""
        self.future.result()
        if self._state is None:
            raise RuntimeError(f"the weights of step {self.step}'s update were pushed already")
        # Pushed even after an update with no optimizer step: an older job's weights it stands for may not be in yet.
        sync = engine.update_weights(self._state, version=self.version)
        self._state, self.groups = None, []
        self.metrics = {**self.metrics, "sync_seconds": sync}

    def phases(self) -> dict:
        """Its phases as lssim.loop.modes prices them (`<phase>`: seconds), once done and pushed."""
        m = self.metrics
        return {"logprob": m.get("logprob_seconds", 0.0), "reference": 0.0, "update": m.get("update_seconds", 0.0),
                "sync": m.get("sync_seconds", 0.0), "switch": 0.0}

    def run(self, trainer, groups: list[Group], clock) -> None:
        """The update, on the lane's thread: times (from its streamed part's start, where groups were fed to it
        during the rollout), a snapshot of the weights, the trainer's state after it (if kept), the metrics."""
        streamed = trainer.stream_start(self.step)
        self.start = clock() if streamed is None else streamed
        metrics = trainer.update(groups, self.step)
        self._state = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
        self.end = clock()
        trainer.keep_state(self.version, self._state)
        self.metrics = metrics


class TrainLane:
    """A trainer's own thread for its jobs (one worker: jobs run one after another, in the order started), made on
    first use, pinned to `cpus` (None: not pinned); `jobs`: every job started, in order."""

    def __init__(self, cpus: tuple[int, ...] | None = None):
        self.cpus = cpus
        self.jobs: list[ThreadTrainJob] = []
        self._pool: ThreadPoolExecutor | None = None

    def start(self, trainer, groups: list[Group], step: int, rerun: bool = False) -> ThreadTrainJob:
        """Queue `trainer.update(groups, step)` on the lane's thread; its times on the trainer's engine's clock.
        `rerun`: a resumed run re-runs an update its checkpoint had not seen end (its times are not the step's)."""
        engine = trainer.engine
        clock = engine.now if engine is not None else time.monotonic
        job = ThreadTrainJob(step)
        job.rerun = rerun
        job.future = self.submit(job.run, trainer, groups, clock)
        job.groups = groups if trainer.states is not None else []  # kept only where a checkpoint may need them
        self.jobs.append(job)
        return job

    def submit(self, work, *args) -> Future:
        """Queue `work(*args)` on the lane's thread, after everything queued before (a streamed group's gradients)."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="grpo-trainer", initializer=_pin,
                                            initargs=(self.cpus,))
        return self._pool.submit(work, *args)

    def shutdown(self) -> None:
        """Wait for the jobs and end the thread (a run's end); a later job starts a new one."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


def fill_step_rows(rows: list[dict], jobs: list[ThreadTrainJob], train_devices: int = 1, restarts: set[int] = frozenset()) -> None:
    """The controller's step rows (lssim.loop.records: mode_fields, step_row) of steps whose update ran as a job: their
    train fields were unknown when the step was recorded (the job was running); now, for each job done, its
    measured times, phases and metrics. Each step's `step_seconds` runs from the previous step's weights being
    ready (from the first rollout's start for the first step, as the simulator's clock starts there, and for each
    step in `restarts`, the first of a resumed run, whose engine's clock is new); NaN while a job runs. A job run
    again after a resume (`rerun`) fills in its phases and metrics but not its step's times (the killed run's: kept
    if it had ended, else NaN). Idempotent: called before every write (a job's sync is known only once pushed)."""
    by_step = {j.step: j for j in jobs if j.future.done() and j.future.exception() is None}
    pending = {j.step for j in jobs} - set(by_step)
    previous = rows[0]["rollout_start"] if rows else math.nan
    for row in rows:
        step = int(row["step"])
        job = by_step.get(step)
        if job is not None:
            phases = job.phases()
            times = {} if job.rerun else {"train_start": job.start, "train_end": job.end}
            row.update(**times, train_seconds=sum(phases.values()),
                       train_busy_device_seconds=(phases["logprob"] + phases["update"]) * train_devices,
                       **{f"{p}_seconds": v for p, v in phases.items()},
                       **{f"trainer_{k}": v for k, v in job.metrics.items()})
        if step in restarts:
            previous = row["rollout_start"]
        end = math.nan if step in pending else row["train_end"]
        row["step_seconds"] = end - previous
        previous = end


def resumed_steps(meta: dict) -> set[int]:
    """The steps a resume started from (meta.json "resumes"): their step time counts from their own rollout."""
    return {int(r["after_step"]) + 1 for r in meta.get("resumes", [])}


def _pin(cpus) -> None:
    if cpus:
        os.sched_setaffinity(threading.get_native_id(), set(cpus))


__all__ = ["ThreadTrainJob", "TrainLane", "fill_step_rows", "resumed_steps"]
