"""Run many independent simulations at once: on every local core (a process pool), or on a Ray cluster.

    from lssim.analysis.parallel import SimJob, run_jobs
    jobs = [SimJob("traces/math7b.parquet", p, SimSetup(n_instances=n)) for p in ("baseline", "hadb") for n in (4, 8)]
    table = run_jobs(jobs, out="runs.jsonl")          # one summary row per job, in the order of `jobs`
    table = run_jobs(jobs, out="runs.jsonl", resume=True)   # after an interruption: only the jobs not done run
    table = run_jobs(jobs, ray="")                    # the same table from Ray remote tasks on a local instance

A job is plain picklable data (a trace path or frame, a policy spec, a SimSetup, steps, seed); what comes back
is one row of `lssim.analysis.replay.summarize` plus the job's own columns (`summary_row`). Each trace is read once by
the caller and shipped once to each worker, which keeps one Workload index per (trace, seed) for all the jobs it
runs (a Workload answers deterministically: sharing it across runs changes nothing), so the table never depends
on how many workers ran it or in which order the jobs finished.

Rows are appended to `out` (JSON lines, one per finished job, flushed) as they finish. Each line carries the
job's fingerprint (trace content, policy, setup, steps, seed), so `resume=True` on the same file skips every job
already there and runs the rest; without `resume` the file is started afresh. A job that raises is recorded
with its error (and not retried on resume: the simulator is deterministic); the caller decides what a failure
means.

Ray: `ray=None` (default) uses the process pool; `ray=""` starts a local Ray instance of `workers` CPUs (or
joins the one RAY_ADDRESS names), `ray="ADDRESS"` joins that cluster (`ray.init(address=...)`). Jobs become
Ray remote tasks; traces go into Ray's object store once (`ray.put`). On a cluster, the worker nodes need lssim
installed (or a `runtime_env`, set up outside lssim).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import sys
import threading
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import pandas as pd

from lssim.analysis.replay import SimSetup, run_summary, simulate, summary_table
from lssim.analysis.signal import trace_lengths


@dataclass(frozen=True, eq=False)
class SimJob:
    """One simulation: `policy` (a spec, e.g. "hadb(short_batch_factor=2)+april") over `trace` on `setup`."""

    trace: str | os.PathLike | pd.DataFrame  # a parquet trace's path, or a trace frame (lssim.traces.trace schema)
    policy: str
    setup: SimSetup = field(default_factory=SimSetup)
    steps: int | None = None  # train on as many groups as this many of the trace's steps (None: all)
    seed: int = 0

    def __post_init__(self):
        if not isinstance(self.trace, (str, os.PathLike, pd.DataFrame)):
            raise ValueError(f"SimJob.trace must be a path or a DataFrame, got {type(self.trace).__name__}")
        if not isinstance(self.policy, str) or not self.policy.strip():
            raise ValueError(f"SimJob.policy must be a policy spec (str), got {self.policy!r}")
        if not isinstance(self.setup, SimSetup):
            raise ValueError(f"SimJob.setup must be a SimSetup, got {type(self.setup).__name__}")
        if self.steps is not None and self.steps < 1:
            raise ValueError(f"SimJob.steps must be >= 1 or None, got {self.steps}")


def summary_row(policy: str, result, lengths=None) -> dict:
    """The default row of one run: its `summarize` row (with `lengths`, the replayed trace's
    lssim.analysis.signal.trace_lengths, its length biases), the share of tokens speculated, and the execution mode's
    device split (what `lssim sweep` and `lssim plan` tabulate)."""
    row = summary_table({policy: run_summary(result, lengths)}).iloc[0].to_dict()
    row.pop("speedup", None), row.pop("rollout_speedup", None)  # against a baseline this one run does not have
    mode = result.meta["mode"]
    devices, wall = row["devices"], row["step_seconds"]
    row.update(policy=policy, speculated_token_fraction=result.meta.get("speculated_tokens", 0) / max(1, int(result.steps["tokens"].sum())),
               rollout_devices=mode["rollout_devices"], train_devices=mode["train_devices"],
               staleness=mode["staleness"] if mode["mode"] == "async" else 0,
               idle_device_fraction=row["idle_device_seconds"] / (devices * wall) if wall > 0 else float("nan"))
    return row


def run_jobs(jobs: list[SimJob], *, workers: int | None = None, out: str | os.PathLike | None = None,
             resume: bool = False, ray: str | None = None, progress: bool = False,
             row: Callable[[str, object, object], dict] = summary_row) -> pd.DataFrame:
    """Run every job; one row per job, in the order of `jobs` (index 0..n-1): `row(policy, result, lengths)` (lengths: the trace's, for the length biases) plus `job`
    (its fingerprint) and `error` (None, or why the run failed; its figures are then NaN). `workers`: processes
    or Ray CPUs (None: every local core; 1 without Ray: in this process). `row` must be picklable (a module-level
    function). See the module docstring for `out`, `resume` and `ray`."""
    if workers is not None and workers < 1:
        raise ValueError(f"workers must be >= 1 or None, got {workers}")
    if resume and out is None:
        raise ValueError("resume needs the output file of the interrupted run (out=...)")
    workers = workers or os.cpu_count() or 1
    traces, tasks = _prepare(jobs)
    done = _read_done(Path(out)) if out is not None and resume else {}
    pending = [t for t in tasks if t.fingerprint not in done]
    rows: dict[str, dict] = {t.fingerprint: done[t.fingerprint] for t in tasks if t.fingerprint in done}
    bar = _bar(len(tasks), len(tasks) - len(pending)) if progress else None
    sink = _Sink(Path(out), append=resume) if out is not None else None
    try:
        def finished(fingerprint: str, record: dict) -> None:
            rows[fingerprint] = record
            if sink is not None:
                sink.write(fingerprint, record)
            if bar is not None:
                bar.update(1)

        if pending and ray is not None:
            _run_on_ray(pending, traces, ray, workers, row, finished)
        elif pending and workers > 1 and len(pending) > 1:
            _run_on_pool(pending, traces, workers, row, finished)
        else:
            workloads: dict = {}  # this call's own: an index of a large trace is not kept past it
            for task in pending:
                finished(task.fingerprint, _run_task(task, traces[task.trace_key], row, workloads))
    finally:
        if sink is not None:
            sink.close()
        if bar is not None:
            bar.close()
    return _table(tasks, rows)


# -- jobs as the workers see them -------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Task:
    """A job with its trace replaced by a key into the traces shipped once to every worker."""

    fingerprint: str
    trace_key: str
    policy: str
    setup: SimSetup
    steps: int | None
    seed: int


def _prepare(jobs: list[SimJob]) -> tuple[dict[str, pd.DataFrame], list[_Task]]:
    """Read each distinct trace once (a bad file fails here, before any run) and fingerprint every job."""
    from lssim.traces.trace import load_trace

    by_object: dict[int, str] = {}
    traces: dict[str, pd.DataFrame] = {}
    tasks = []
    for job in jobs:
        if not isinstance(job, SimJob):
            raise ValueError(f"run_jobs takes SimJob objects, got {type(job).__name__}")
        source = job.trace if isinstance(job.trace, pd.DataFrame) else os.path.abspath(os.fspath(job.trace))
        ident = id(job.trace) if isinstance(job.trace, pd.DataFrame) else source
        key = by_object.get(ident)
        if key is None:
            frame = job.trace if isinstance(job.trace, pd.DataFrame) else load_trace(source)
            key = _frame_fingerprint(frame)
            by_object[ident] = key
            traces.setdefault(key, frame)
        setup = json.dumps(asdict(job.setup), sort_keys=True, default=repr)
        text = json.dumps([key, job.policy, setup, job.steps, job.seed])
        tasks.append(_Task(hashlib.sha1(text.encode()).hexdigest()[:16], key, job.policy, job.setup, job.steps, job.seed))
    return traces, tasks


def _frame_fingerprint(frame: pd.DataFrame) -> str:
    """A trace's content, not its file name: the same trace under another path resumes; an edited one does not."""
    digest = hashlib.sha1(json.dumps([list(map(str, frame.columns)), list(map(str, frame.dtypes))]).encode())
    digest.update(pd.util.hash_pandas_object(frame, index=False).to_numpy().tobytes())
    return digest.hexdigest()[:16]


# Per worker process (pool or Ray): the traces shipped to it, and one Workload per (trace, seed) for the jobs it runs.
_TRACES: dict[str, pd.DataFrame] = {}
_WORKLOADS: dict[tuple[str, int], object] = {}
_LENGTHS: dict[tuple[str, int | None], object] = {}  # the trace's lengths the length biases compare with, per steps


def _run_task(task: _Task, trace: pd.DataFrame, row: Callable, workloads: dict) -> dict:
    """One run's record: {"row": {...}} or {"error": "..."}; never raises for a failing simulation."""
    from lssim.traces.workload import Workload

    try:
        workload = workloads.get((task.trace_key, task.seed))
        if workload is None:
            if len(workloads) >= 4:  # a worker of a many-trace sweep keeps a few indexes, not all
                workloads.clear()
            workload = workloads[(task.trace_key, task.seed)] = Workload(trace, seed=task.seed)
        result = simulate(workload, task.policy, task.setup, task.steps, task.seed)
        lengths = _LENGTHS.get((task.trace_key, task.steps))
        if lengths is None:
            lengths = _LENGTHS[(task.trace_key, task.steps)] = trace_lengths(trace, task.steps)
        return {"row": _plain(row(task.policy, result, lengths))}
    except Exception as e:  # noqa: BLE001  (a composition that fails at run time is a row, not a crash)
        return {"error": f"{type(e).__name__}: {e}"}


def _plain(row: dict) -> dict:
    """Python scalars only, so that a row read back from the JSON lines is the very row that was written."""
    return {str(k): (v.item() if hasattr(v, "item") else v) for k, v in row.items()}


def _pool_init(traces: dict[str, pd.DataFrame]) -> None:
    _TRACES.update(traces)


def _pool_task(task: _Task, row: Callable) -> tuple[str, dict]:
    return task.fingerprint, _run_task(task, _TRACES[task.trace_key], row, _WORKLOADS)


def _run_on_pool(pending: list[_Task], traces, workers: int, row: Callable, finished) -> None:
    needed = {t.trace_key: traces[t.trace_key] for t in pending}
    pool = ProcessPoolExecutor(min(workers, len(pending)), initializer=_pool_init, initargs=(needed,))
    try:
        futures = {pool.submit(_pool_task, task, row) for task in pending}
        while futures:
            done, futures = wait(futures, return_when=FIRST_COMPLETED)
            for future in done:
                finished(*future.result())
    except BaseException:
        # Interrupted (Ctrl-C): the queued runs are dropped, not run unrecorded to the end as the pool's own exit
        # would; only those already running finish, and the next --resume runs the rest.
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown()


def _run_on_ray(pending: list[_Task], traces, address: str, workers: int, row: Callable, finished) -> None:
    """Ray remote tasks, one per job; each trace put into the object store once and fetched by a worker only the
    first time it needs it (the ref travels in a list, so Ray does not resolve it for every task)."""
    try:
        import ray
    except ImportError:
        raise ValueError("--ray: Ray is not installed here (pip install 'ray>=2.9')") from None
    started = not ray.is_initialized()
    if started:
        kwargs = dict(include_dashboard=False, log_to_driver=False, configure_logging=False)
        if address:
            ray.init(address=address, **kwargs)
        else:  # a local instance: its workers import this very lssim (a worktree's, not only the installed one)
            root = str(Path(__file__).resolve().parents[2])
            path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
            ray.init(num_cpus=workers, runtime_env={"env_vars": {"PYTHONPATH": path}}, **kwargs)
    try:
        refs = {key: ray.put(traces[key]) for key in {t.trace_key for t in pending}}
        remote = ray.remote(num_cpus=1)(_ray_task)
        futures = {remote.remote(task, [refs[task.trace_key]], row): task for task in pending}
        with _ctrl_c_noted() as interrupted:
            while futures:
                if interrupted:
                    raise KeyboardInterrupt
                done, _ = ray.wait(list(futures), num_returns=1, timeout=0.5)
                for ref in done:
                    futures.pop(ref)
                    finished(*ray.get(ref))
    finally:
        if started:
            ray.shutdown()


@contextlib.contextmanager
def _ctrl_c_noted():
    """SIGINT only noted (in the list yielded) while Ray's driver waits, and raised as KeyboardInterrupt between two
    waits: raised inside Ray's calls, it was sometimes lost there (a 1,000-run sweep cut at 400 ran on to the end)."""
    noted: list[bool] = []
    if threading.current_thread() is not threading.main_thread():
        yield noted  # only the main thread gets signals: nothing to note
        return
    previous = signal.signal(signal.SIGINT, lambda *_: noted.append(True))
    try:
        yield noted
    finally:
        signal.signal(signal.SIGINT, previous)


def _ray_task(task: _Task, boxed_trace: list, row: Callable) -> tuple[str, dict]:
    if task.trace_key not in _TRACES:
        import ray

        if len(_TRACES) >= 4:  # a worker of a long-lived cluster keeps a few traces, not every one it saw
            _TRACES.clear()
            _WORKLOADS.clear()

        _TRACES[task.trace_key] = ray.get(boxed_trace[0])
    return _pool_task(task, row)


# -- the output file --------------------------------------------------------------------------------------------

class _Sink:
    """JSON lines, one per finished job, flushed as written: what an interruption leaves is a resumable file."""

    def __init__(self, path: Path, append: bool):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.file = open(path, "a" if append else "w", encoding="utf-8")

    def write(self, fingerprint: str, record: dict) -> None:
        self.file.write(json.dumps({"job": fingerprint, **record}) + "\n")
        self.file.flush()

    def close(self) -> None:
        self.file.close()


def _read_done(path: Path) -> dict[str, dict]:
    """The records of an earlier run's file; a last line cut off by the interruption is dropped (and the file
    rewritten without it, so that appending continues on a clean line)."""
    if not path.exists():
        return {}
    done, good = {}, []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                if line.endswith("\n"):
                    raise ValueError(f"{path}: line {number} is not a JSON record; not a run_jobs output file?") from None
                continue  # the cut-off last line
            if not isinstance(record, dict) or "job" not in record or not ("row" in record or "error" in record):
                raise ValueError(f"{path}: line {number} is not a run_jobs record (no 'job', 'row' or 'error')")
            done[record.pop("job")] = record
            good.append(line)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("".join(good), encoding="utf-8")
    os.replace(tmp, path)
    return done


def _table(tasks: list[_Task], records: dict[str, dict]) -> pd.DataFrame:
    rows = []
    for task in tasks:
        record = records[task.fingerprint]
        rows.append({**record.get("row", {"policy": task.policy}), "job": task.fingerprint, "error": record.get("error")})
    return pd.DataFrame(rows)


def _bar(total: int, initial: int):
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, desc="runs", unit="run", leave=False, file=sys.stderr)


__all__ = ["SimJob", "run_jobs", "summary_row"]
