"""Where the CPU goes while a two-instance engine runs: the driver (this process: the controller, the policy, the
token streams, the trainer), vLLM's engine-core processes and its workers, per wall-second, over recorded runs and
over the speed probe (real_backend.speed_probe).

    python -m paper.experiments.measure_cpu_share            # the placed world: baseline and seer, 3 rounds; ~2 minutes

Why: on a 2-core host every phase keeps both cores full (vLLM's workers and engine cores busy-wait on each other's
shared-memory queues for a second after each message), so what slows a step is which process holds a core when a
worker needs it; a run loads the driver more than the probe and the layout's cells do. Measured with psutil's CPU
times of the process tree (README, "Fidelity").
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time


def cpu_seconds() -> dict[str, float]:
    """CPU seconds so far of this process ("driver") and of its children, by vLLM's process names."""
    import psutil

    me = psutil.Process()
    out: dict[str, float] = {}
    for p in [me, *me.children(recursive=True)]:
        try:
            name, times = p.name(), p.cpu_times()
        except psutil.Error:  # a process that ended meanwhile
            continue
        key = "driver" if p.pid == me.pid else "engine core" if "EngineCore" in name else "worker" if "Worker" in name else "other"
        out[key] = out.get(key, 0.0) + times.user + times.system
    return out


def share(work) -> tuple[float, dict[str, float]]:
    """Wall seconds of `work()` and each process class's CPU seconds per wall-second over it."""
    before, t0 = cpu_seconds(), time.monotonic()
    work()
    after, wall = cpu_seconds(), time.monotonic() - t0
    return wall, {k: round((after[k] - before.get(k, 0.0)) / wall, 2) for k in after}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m paper.experiments.measure_cpu_share", description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3, help="rounds of (baseline run, seer run, two probes); default 3")
    p.add_argument("--world", default="placed", help="the validation world (real_backend/validation_workloads.toml)")
    args = p.parse_args(argv)
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    from real_backend.speed_probe import measure_probe
    from real_backend.validation_workloads import world_arg
    from real_backend.world import prepare, run_real, world_engine

    world = world_arg(args.world)
    if world is None:
        return 2
    with world_engine(world) as (setup, config, _, engine), \
            tempfile.TemporaryDirectory() as scratch:
        for k in range(args.rounds):
            for spec in ("baseline", "seer(chunk=32)"):
                prompts, policy = prepare(setup, spec, config)
                wall, got = share(lambda: run_real(setup, policy, config, f"{scratch}/{k}-{spec}", engine=engine,
                                                   prompts=prompts))
                print(f"run {spec:16s} {wall:5.1f} s  CPU per wall-second {got}", flush=True)
            wall, got = share(lambda: [measure_probe(engine) for _ in range(2)])
            print(f"probe x2             {wall:5.1f} s  CPU per wall-second {got}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
