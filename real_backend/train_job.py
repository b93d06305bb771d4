"""A real GRPO step as a job beside the rollout: the execution modes that train beside it (lssim.loop.modes) on vLLM.

    job = trainer.start(groups, step)     # GRPOTrainer.start: the update runs on the trainer's thread
    job.ready(engine) / job.wait(engine)  # done yet? / block until done (the trainer's error, if any, is raised)
    job.notify(engine)                    # the engine reports Event(WAKE) when the job is done
    job.push(engine)                      # its weights into the idle engine (nothing may be in flight)

The same protocol as the simulator's priced `lssim.loop.modes.TrainJob`, so the modes are written once. Where it runs:
one thread per trainer (a one-worker executor: jobs run one after another, in the order started, as on a train
device group), beside the controller's thread and vLLM's engine core (a separate process). torch releases the GIL
in its kernels, so the update and the engine's decoding overlap on two cores. The trainer's torch threads are
`RealSetup.trainer_threads` (default 1); vLLM's CPU build binds its worker's OpenMP threads itself
(VLLM_CPU_OMP_THREADS_BIND=auto: on a 2-core machine one core for the worker, one reserved for the rest), and
`RealSetup.trainer_cpus` may pin the trainer's thread (os.sched_setaffinity on the thread).

A job's weights are a snapshot taken on the trainer's thread as the update ends (a clone of the state dict), so a
later job that trains meanwhile cannot change what an earlier one pushes. Its times (`start`, `end`) are on the
engine's clock (seconds since the engine started): when the update began and when its weights were ready.
"""

from __future__ import annotations

import math
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor

from lssim.loop.core import Group


class ThreadTrainJob:
    __slots__ = ("step", "version", "start", "end", "metrics", "future", "_state")

    def __init__(self, step: int):
        self.step, self.version = step, step + 1
        self.start = self.end = math.nan
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
        self._state = None
        self.metrics = {**self.metrics, "sync_seconds": sync}

    def phases(self) -> dict:
        """Its phases as lssim.loop.modes prices them (`<phase>`: seconds), once done and pushed."""
        m = self.metrics
        return {"logprob": m.get("logprob_seconds", 0.0), "reference": 0.0, "update": m.get("update_seconds", 0.0),
                "sync": m.get("sync_seconds", 0.0), "switch": 0.0}

    def _run(self, trainer, groups: list[Group], clock) -> None:
        self.start = clock()
        metrics = trainer.update(groups, self.step)
        self._state = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
        self.end = clock()
        self.metrics = metrics


def start_job(trainer, groups: list[Group], step: int) -> ThreadTrainJob:
    """Queue `trainer.update(groups, step)` on the trainer's own thread (made on first use)."""
    pool = getattr(trainer, "_job_pool", None)
    if pool is None:
        cpus = getattr(trainer, "job_cpus", None)
        pool = trainer._job_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="grpo-trainer",
                                                      initializer=_pin, initargs=(cpus,))
    engine = trainer.engine
    clock = engine.now if engine is not None else _monotonic
    job = ThreadTrainJob(step)
    job.future = pool.submit(job._run, trainer, groups, clock)
    trainer.jobs = [*getattr(trainer, "jobs", []), job]
    return job


def fill_step_rows(rows: list[dict], jobs: list[ThreadTrainJob], train_devices: int = 1) -> None:
    """The controller's step rows (lssim.loop.records: mode_fields, step_row) of steps whose update ran as a job: their
    train fields were unknown when the step was recorded (the job was running); now, for each job done, its
    measured times, phases and metrics. Each step's `step_seconds` runs from the previous step's weights being
    ready (from the first rollout's start for the first step, as the simulator's clock starts there); NaN while a
    job runs. Idempotent: called before every write (a job's sync is known only once its weights were pushed)."""
    by_step = {j.step: j for j in jobs if j.future.done() and j.future.exception() is None}
    pending = {j.step for j in jobs} - set(by_step)
    previous = rows[0]["rollout_start"] if rows else math.nan
    for row in rows:
        step = int(row["step"])
        job = by_step.get(step)
        if job is not None:
            phases = job.phases()
            row.update(train_start=job.start, train_end=job.end, train_seconds=sum(phases.values()),
                       train_busy_device_seconds=(phases["logprob"] + phases["update"]) * train_devices,
                       **{f"{p}_seconds": v for p, v in phases.items()},
                       **{f"trainer_{k}": v for k, v in job.metrics.items()})
        end = math.nan if step in pending else row["train_end"]
        row["step_seconds"] = end - previous
        previous = end


def shutdown(trainer) -> None:
    """Wait for the trainer's jobs and end its thread (a run's end)."""
    pool = getattr(trainer, "_job_pool", None)
    if pool is not None:
        pool.shutdown(wait=True)
        trainer._job_pool = None


def _pin(cpus) -> None:
    if cpus:
        os.sched_setaffinity(threading.get_native_id(), set(cpus))


def _monotonic() -> float:
    import time

    return time.monotonic()


__all__ = ["ThreadTrainJob", "start_job", "shutdown", "fill_step_rows"]
