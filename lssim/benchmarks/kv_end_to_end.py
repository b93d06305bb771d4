"""The KV-bound workload end to end: `lssim replay`'s work on it in this process (issue 38's measure), and where the
time goes.

`lssim replay TRACE` with its references is: read and validate the parquet (lssim.traces.trace.load_trace), index it
(Workload), run baseline and oracle (one process: a trace under 100,000 responses is not forked), summarize each run
and make the table (lssim.analysis.replay.replay_summary). That whole work is timed here on the trace written to a
temporary parquet, process start and numba's load excluded (one untimed run first); its rate is per simulation:
2 x requests over the seconds (wall, and CPU: on a shared machine the wall time counts other processes' turns).
The stages are then timed one by one, the way replay_summary runs them.
"""

from __future__ import annotations

import cProfile
import io
import pstats
import statistics
import tempfile
import time
from pathlib import Path

import pandas as pd

from lssim.analysis.replay import SUMMARY_RESPONSE_COLUMNS, SimSetup, replay_summary, run_summary, simulate, summary_table
from lssim.analysis.signal import trace_lengths
from lssim.benchmarks.figures import Figure, Report
from lssim.traces.trace import load_trace, write_trace
from lssim.traces.workload import Workload

REFERENCES = ("baseline", "oracle")


def replay_work(path: Path, setup: SimSetup) -> pd.DataFrame:
    """What `lssim replay PATH` (references only, one process) does after its imports: the table it prints."""
    return replay_summary(load_trace(path), [], setup, workers=1)


def bench_kv_end_to_end(report: Report, trace: pd.DataFrame, setup: SimSetup, repeats: int, profile_top: int,
                        goal: float) -> None:
    with tempfile.TemporaryDirectory(prefix="lssim-kv-") as tmp:
        path = Path(tmp) / "kv.parquet"
        write_trace(trace, path)
        replay_work(path, setup)  # untimed: numba's kernels, the imports the table needs
        times, cpu = [], []
        for _ in range(repeats):
            t, c = time.perf_counter(), time.process_time()
            replay_work(path, setup)
            times.append(time.perf_counter() - t)
            cpu.append(time.process_time() - c)
        seconds, cpu_seconds = statistics.median(times), statistics.median(cpu)
        rate = len(REFERENCES) * len(trace) / seconds
        print(f"  end to end      {rate:>10,.0f} requests/s per simulation  (read, validate, Workload, baseline and "
              f"oracle, the table: {seconds:.3f} s, median of {len(times)}, {min(times):.3f}-{max(times):.3f} s; "
              f"{cpu_seconds:.3f} CPU s: on a busy machine the wall time counts other processes' turns too)")
        report.add(Figure("kv.end_to_end", rate, "requests/s", goal))
        report.add(Figure("kv.end_to_end_cpu", len(REFERENCES) * len(trace) / cpu_seconds, "requests/CPU s", goal))
        _print_stages(_stages(path, setup), seconds)
        if profile_top:
            _print_profile(path, setup, profile_top)


def _stages(path: Path, setup: SimSetup) -> dict[str, float]:
    """replay_summary's stages timed apart (lssim.analysis.replay._each_run's order)."""
    seconds: dict[str, float] = {}

    def timed(name: str, fn):
        t = time.perf_counter()
        out = fn()
        seconds[name] = seconds.get(name, 0.0) + time.perf_counter() - t
        return out

    trace = timed("read and validate the parquet", lambda: load_trace(path))
    lengths = timed("the trace's lengths (length biases)", lambda: trace_lengths(trace, None))
    workload = timed("Workload index", lambda: Workload(trace))
    rows = {}
    for name in REFERENCES:
        result = timed(f"simulate {name}", lambda: simulate(workload, name, setup, response_columns=SUMMARY_RESPONSE_COLUMNS))
        rows[name] = timed("run summaries", lambda: run_summary(result, lengths))
    timed("the table", lambda: summary_table(rows))
    return seconds


def _print_stages(seconds: dict[str, float], whole: float) -> None:
    total = sum(seconds.values())
    print(f"  where it goes (stages timed apart: {total:.3f} s, against {whole:.3f} s whole):")
    for name, s in seconds.items():
        print(f"    {name:38s} {s * 1e3:8.1f} ms  {s / total:6.1%}")


def _print_profile(path: Path, setup: SimSetup, top: int) -> None:
    profiler = cProfile.Profile()
    profiler.runcall(replay_work, path, setup)
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(top)
    print("  cProfile of the end-to-end work (cumulative):")
    print("\n".join("    " + line for line in text.getvalue().splitlines() if line.strip()))
