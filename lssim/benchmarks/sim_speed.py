"""Simulator speed, each figure as a ratio against its goal (issues 15 and 38) and against the previous release's
figure (lssim/benchmarks/data/previous_release.json): responses per second per policy on one core (each policy's
route: the batch route, lssim.sim.fastsim, where it has no per-event hook; seer's requeue route, lssim.sim.requeue_route;
the event engine otherwise), a KV-bound long-response workload (the simulation alone, and `lssim replay`'s whole work
end to end), sweep runs per second with 1 and 2 workers, the wall time of `lssim replay` on a 1,024,000-response trace
with and without its references, and the scale checks of lssim/benchmarks/scale.py (a 10,000,000-response replay's time and peak
memory; a 1,000-run Ray sweep cut and resumed).

    python -m lssim.benchmarks.sim_speed                       # every section, defaults below
    python -m lssim.benchmarks.sim_speed --only sim --responses 1000000 --policy baseline --policy hadb
    python -m lssim.benchmarks.sim_speed --only kv --kv-requests 51200
    python -m lssim.benchmarks.sim_speed --only sweep --sweep-runs 24
    python -m lssim.benchmarks.sim_speed --only cli --cli-responses 1024000
    python -m lssim.benchmarks.sim_speed --only real
    python -m lssim.benchmarks.sim_speed --only scale --scale-responses 10000000
    python -m lssim.benchmarks.sim_speed --only resume --resume-runs 1000      # not in the default run (minutes)
    python -m lssim.benchmarks.sim_speed --write-release FILE                  # this run's figures, for the next release

Every figure is the median of `--repeats` runs (the machine this was written on is shared and noisy: read
the spread it prints too). `sim`: the trace is synthesized from the math7b preset with as many steps as it
takes, its synthesis and the Workload's index timed apart; the simulation runs pinned to one CPU; a policy on the
batch route is also run on the event engine (`--event-responses` of the trace) for the ratio. `kv`: requests of
mean ~2.4k tokens (max 8k) on one H100 running llama3-8b with 256 sequences, so the KV cache binds and requests
are preempted; the baseline on both routes (the event engine on `--kv-event-requests` of them), then end to end:
`lssim replay`'s work in this process (read and validate the parquet, the Workload, baseline and oracle, the
table; process start and numba's load excluded), its rate per simulation (2 x requests / seconds), and where that
time goes, stage by stage (`--kv-profile N` prints cProfile's top N too). `sweep`:
`lssim.analysis.parallel.run_jobs` over a small trace (policies x instance counts), on 1 and on 2 processes, pool start
included. `cli`: `python -m lssim.cli replay` in a fresh process on a synthesized trace (process start,
reading and validating the trace included), with baseline and oracle, then with --no-reference. `real`: the traces
the real backend recorded (traces/), simulated with the CPU profiles, against the real run's own seconds.
`scale` and `resume`: lssim/benchmarks/scale.py.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from lssim.benchmarks.figures import PREVIOUS_RELEASE, Figure, Report, load_release
from lssim.benchmarks.scale import add_scale_arguments, run_scale_sections
from lssim.loop.policy import available_policies, make_policy
from lssim.analysis.replay import SimSetup, simulate
from lssim.traces.synth import get_preset, synthesize
from lssim.traces.workload import Workload

GOAL_RESPONSES_PER_SECOND = 1_000_000  # issues 15 and 38: on one core, baseline, oracle and hadb
GOAL_POLICY_RESPONSES_PER_SECOND = 250_000  # issue 38: every other registered policy, on one core
REFERENCE_POLICIES = ("baseline", "hadb", "oracle")
GOAL_CLI_SECONDS = 5.0  # issue 15: `lssim replay` of 1,024,000 responses under hadb with its references
GOAL_KV_REQUESTS_PER_SECOND = 250_000  # issue 15: baseline on the KV-bound workload; issue 38: end to end, per simulation
GOAL_REAL_RATIO = 1000  # issue 15: the simulator over the real run it predicts


def _trace(responses: int, **overrides):
    preset = get_preset("math7b")
    per_step = preset.prompts_per_step * preset.group_size
    return synthesize(preset.replace(steps=max(1, math.ceil(responses / per_step)), **overrides))


def _median(times: list[float]) -> str:
    return f"median of {len(times)}, {min(times):.2f}-{max(times):.2f} s" if len(times) > 1 else "1 run"


def bench_sim(report: Report, responses: int, policies: list[str], repeats: int, event_responses: int) -> None:
    t = time.perf_counter()
    trace = _trace(responses)
    t_synth = time.perf_counter() - t
    t = time.perf_counter()
    workload = Workload(trace)
    t_index = time.perf_counter() - t
    small = Workload(_trace(event_responses))
    print(f"sim: {len(trace):,} responses (synthesized in {t_synth:.2f} s, indexed in {t_index:.2f} s); one core; "
          f"goal {GOAL_RESPONSES_PER_SECOND:,} responses/s for {', '.join(REFERENCE_POLICIES)}, "
          f"{GOAL_POLICY_RESPONSES_PER_SECOND:,} for every other policy; event engine on {event_responses:,} for the "
          f"ratio; each batch-route policy run once untimed first")
    pinned = _pin_one_cpu()
    try:
        simulate(small, "baseline", SimSetup())  # loads the batch route's compiled kernels (numba's cache)
        for policy in policies:
            built = make_policy(policy)
            batch = not built.reacts_to_events() or built.requeues_in_batches()
            route = ("requeue" if built.requeues_in_batches() else "batch" if batch else "cut" if built.cuts_in_batches()
                     else "carry" if built.carries_in_batches() else "event")
            if batch:  # once untimed: the Workload builds its lookup indexes on first use, numba loads the policy's kernels
                simulate(workload, policy, SimSetup())
            rate, n, times = _rate(workload, policy, SimSetup(), repeats)
            line = f"  {policy:16s} {route:5s}  {rate:>10,.0f} responses/s  ({n:,} in {statistics.median(times):.2f} s, {_median(times)})"
            if route != "event":
                event_rate, _, _ = _rate(small, policy, SimSetup(), 1, batch_route=False)
                line += f"  {rate / event_rate:5.1f}x its event-engine rate ({event_rate:,.0f}/s)"
            print(line)
            goal = GOAL_RESPONSES_PER_SECOND if policy in REFERENCE_POLICIES else GOAL_POLICY_RESPONSES_PER_SECOND
            report.add(Figure(f"sim.{policy}", rate, "responses/s", goal))
    finally:
        _unpin(pinned)


def _rate(workload: Workload, policy: str, setup: SimSetup, repeats: int, **kw) -> tuple[float, int, list[float]]:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        result = simulate(workload, policy, setup, **kw)
        times.append(time.perf_counter() - t)
    n = len(result.responses)
    return n / statistics.median(times), n, times


KV_SETUP = dict(model="llama3-8b", hardware="H100", n_instances=1, max_num_seqs=256)


def kv_trace(requests: int):
    """Long responses (mean ~2.4k tokens, at most 8k) in steps of 256 prompts: one H100 holds fewer than 256."""
    preset = get_preset("math7b").replace(prompts_per_step=256, max_tokens=8192, length_median=1700.0)
    return synthesize(preset.replace(steps=max(1, math.ceil(requests / (256 * preset.group_size)))))


def bench_kv(report: Report, requests: int, event_requests: int, repeats: int, profile_top: int = 0) -> None:
    """The KV-bound regime: long responses, one instance, the cache holding fewer sequences than max_num_seqs."""
    from lssim.benchmarks.kv_end_to_end import bench_kv_end_to_end

    setup = SimSetup(**KV_SETUP)
    trace = kv_trace(requests)
    workload, small = Workload(trace), Workload(kv_trace(event_requests))
    print(f"kv: {len(trace):,} requests of mean {trace['response_len'].mean():,.0f} tokens, llama3-8b on one H100, "
          f"256 sequences, KV cache {setup.engine_config().kv_capacity_tokens:,} tokens; goal "
          f"{GOAL_KV_REQUESTS_PER_SECOND:,} requests/s")
    pinned = _pin_one_cpu()
    try:
        simulate(small, "baseline", setup)
        rate, n, times = _rate(workload, "baseline", setup, repeats)
        result = simulate(small, "baseline", setup)
        event_rate, _, _ = _rate(small, "baseline", setup, 1, batch_route=False)
        print(f"  baseline batch  {rate:>10,.0f} requests/s  ({n:,} in {statistics.median(times):.2f} s, {_median(times)}); "
              f"the simulation alone")
        report.add(Figure("kv.baseline_batch", rate, "requests/s", GOAL_KV_REQUESTS_PER_SECOND))
        print(f"  baseline event  {event_rate:>10,.0f} requests/s  on {event_requests:,} "
              f"({result.meta['preemptions']:,} preemptions): batch/event {rate / event_rate:.1f}x")
        bench_kv_end_to_end(report, trace, setup, repeats, profile_top, GOAL_KV_REQUESTS_PER_SECOND)
    finally:
        _unpin(pinned)


def _pin_one_cpu():
    if not hasattr(os, "sched_setaffinity"):
        return None
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(before)})
    return before


def _unpin(before) -> None:
    if before is not None:
        os.sched_setaffinity(0, before)


def bench_sweep(report: Report, n_runs: int, repeats: int) -> None:
    from lssim.analysis.parallel import SimJob, run_jobs

    trace = synthesize(get_preset("math7b").replace(steps=4, prompts_per_step=64, n_prompts=128))
    specs, sizes = ["baseline", "hadb", "april", "seer", "lpt", "breaker"], [2, 4, 8, 16]
    jobs = [SimJob(trace, specs[i % len(specs)], SimSetup(n_instances=sizes[(i // len(specs)) % len(sizes)]), seed=i)
            for i in range(n_runs)]
    print(f"sweep: {n_runs} runs of {len(trace):,} responses each (lssim.analysis.parallel.run_jobs; pool start included)")
    rates = {}
    for workers in (1, 2):
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            run_jobs(jobs, workers=workers)
            times.append(time.perf_counter() - t)
        rates[workers] = n_runs / statistics.median(times)
        print(f"  {workers} worker{'s' if workers > 1 else ' '}  {rates[workers]:7.2f} runs/s  ({_median(times)})")
        report.add(Figure(f"sweep.{workers}_worker{'s' if workers > 1 else ''}", rates[workers], "runs/s"))
    print(f"  2 workers over 1: {rates[2] / rates[1]:.2f}x (ideal 2x on 2 idle cores)")


def bench_cli(report: Report, responses: int, policy: str, repeats: int) -> None:
    with tempfile.TemporaryDirectory(prefix="lssim-bench-") as tmp:
        path = Path(tmp) / "trace.parquet"
        from lssim.traces.trace import write_trace

        write_trace(_trace(responses), path)
        print(f"cli: python -m lssim.cli replay {responses:,}-response trace --policy {policy} (fresh process each; "
              f"goal {GOAL_CLI_SECONDS:.0f} s for 1,024,000 with references)")
        walls = {}
        for label, extra in (("with baseline and oracle", []), ("--no-reference", ["--no-reference"])):
            times = []
            for _ in range(repeats):
                t = time.perf_counter()
                subprocess.run([sys.executable, "-m", "lssim.cli", "replay", str(path), "--policy", policy, "--json", *extra],
                               check=True, stdout=subprocess.DEVNULL)
                times.append(time.perf_counter() - t)
            walls[label] = statistics.median(times)
            print(f"  {label:26s} {walls[label]:7.2f} s  {responses / walls[label]:>9,.0f} responses/s of trace  ({_median(times)})")
            references = label.startswith("with")
            report.add(Figure("cli.with_references" if references else "cli.no_reference", walls[label], "s",
                              GOAL_CLI_SECONDS if references and responses == 1_024_000 else None, higher_is_better=False))
        ratio = walls["with baseline and oracle"] / walls["--no-reference"]
        print(f"  references cost {ratio:.2f}x the policy's run alone")


def bench_real(report: Report, repeats: int) -> None:
    """The simulator's speed over the real runs it predicts: each trace in traces/ recorded by the real backend
    (it has per-step rollout and train seconds) replayed under its own policy with the CPU profiles it was
    calibrated on; the real run's seconds over the simulation's (goal >= 1000x)."""
    import pandas as pd

    from lssim.traces.trace import load_trace

    root = Path(__file__).resolve().parents[2]
    def recorded_seconds(path: Path) -> float:
        columns = pd.read_parquet(path).columns
        if "step_rollout_seconds" not in columns:
            return 0.0
        steps = pd.read_parquet(path, columns=["step", "step_rollout_seconds", "step_train_seconds"]).groupby("step").first()
        return float(steps.fillna(0.0).sum().sum())

    traces = [p for p in sorted((root / "traces").glob("*.parquet")) if recorded_seconds(p) > 0]  # synthesized ones have none
    profile, train = root / "real_backend" / "data" / "profile_cpu.json", root / "real_backend" / "data" / "profile_trainer_cpu.json"
    print(f"real: traces the real backend recorded, replayed with {profile.name} and {train.name}; goal "
          f"{GOAL_REAL_RATIO:,}x the real run's speed")
    for path in traces:
        trace = load_trace(path)
        per_step = trace.groupby("step")[["step_rollout_seconds", "step_train_seconds"]].first()
        real_seconds = float(per_step.sum().sum())
        workload = Workload(trace)
        setup = SimSetup(profile=str(profile), train=str(train), n_instances=max(1, int(trace["instance"].max()) + 1))
        simulate(workload, "baseline", setup)  # compiled kernels loaded
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            simulate(workload, "baseline", setup)
            times.append(time.perf_counter() - t)
        sim_seconds = statistics.median(times)
        print(f"  {path.name:28s} {len(trace):6,} responses, {len(per_step)} steps: real {real_seconds:8.1f} s, "
              f"simulated in {sim_seconds * 1e3:6.1f} ms: {real_seconds / sim_seconds:>10,.0f}x  "
              f"({_median(times)})")
        report.add(Figure(f"real.{path.name}", real_seconds / sim_seconds, "x real", GOAL_REAL_RATIO))


SECTIONS = ["sim", "kv", "sweep", "cli", "real", "scale", "resume"]
DEFAULT_SECTIONS = SECTIONS[:-1]  # `resume` (a 1,000-run sweep run three times) is asked for by name


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", choices=SECTIONS, action="append", help=f"sections to run (default: {', '.join(DEFAULT_SECTIONS)})")
    ap.add_argument("--responses", type=int, default=300_000, help="sim: responses in the trace (default 300,000)")
    ap.add_argument("--policy", action="append", default=None, help="sim: policies (default: every policy in policies/)")
    ap.add_argument("--event-responses", type=int, default=50_000, help="sim: responses the event engine runs for the ratio")
    ap.add_argument("--kv-requests", type=int, default=51_200, help="kv: requests in the KV-bound workload (default 51,200)")
    ap.add_argument("--kv-event-requests", type=int, default=2_048, help="kv: requests the event engine runs (default 2,048)")
    ap.add_argument("--kv-profile", type=int, default=0, metavar="N", help="kv: print cProfile's top N functions of the end-to-end work")
    ap.add_argument("--sweep-runs", type=int, default=24, help="sweep: runs (default 24)")
    ap.add_argument("--cli-responses", type=int, default=1_024_000, help="cli: responses in the trace (default 1,024,000)")
    ap.add_argument("--cli-policy", default="hadb")
    add_scale_arguments(ap)
    ap.add_argument("--repeats", type=int, default=3, help="runs per figure; the median is printed (default 3)")
    ap.add_argument("--previous", default=str(PREVIOUS_RELEASE), metavar="JSON",
                    help="the previous release's figures (default lssim/benchmarks/data/previous_release.json)")
    ap.add_argument("--write-release", metavar="JSON", help="write this run's figures as a release file (what --previous reads)")
    args = ap.parse_args(argv)
    report = Report(load_release(args.previous))
    sections = args.only or DEFAULT_SECTIONS
    if "sim" in sections:
        bench_sim(report, args.responses, args.policy or available_policies(), args.repeats, args.event_responses)
    if "kv" in sections:
        bench_kv(report, args.kv_requests, args.kv_event_requests, args.repeats, args.kv_profile)
    if "sweep" in sections:
        bench_sweep(report, args.sweep_runs, args.repeats)
    if "cli" in sections:
        bench_cli(report, args.cli_responses, args.cli_policy, args.repeats)
    if "real" in sections:
        bench_real(report, args.repeats)
    run_scale_sections(report, sections, args)
    report.summary()
    if args.write_release:
        command = "python -m lssim.benchmarks.sim_speed " + " ".join(argv if argv is not None else sys.argv[1:])
        report.write_release(args.write_release, release="lssim at " + _commit(), command=command.strip(),
                             machine=f"{os.cpu_count()} cores")


def _commit() -> str:
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return done.stdout.strip() or "an unknown commit"


if __name__ == "__main__":
    main()
