"""What the driver's own work costs a rollout on this host: the baseline and april recorded in turn, each also with a
reward function that spins `--tax` ms per finished response (driver work, nothing else changed).

    python -m paper.experiments.measure_driver_tax                 # the default world, 4 rounds; ~3 minutes

The driver is this process's controller thread: the controller, the policy, rewards, and the submit and abort calls
(each blocks until vLLM's front end has taken it). Each run records, per step, the part of the rollout that thread
worked instead of waiting for the engine (steps.parquet's driver_seconds, real_backend.engine.VLLMEngine.driver_seconds).
Printed per run kind, medians over the rounds: the rollout seconds, the driver's seconds and share, and how much longer
the taxed runs' rollouts were than the untaxed ones' per ms of tax added (1.0: the engine lost all of it).

Why: the simulated twin prices the engine, not the driver. On a 2-core host the driver shares the engine's cores,
so its work is time the engine loses, and a policy that submits, aborts and reacts more per second of rollout
(april over-provisions and carries; segment resumes) loses more of it than the baseline, which the twin reads as
the policy being faster than it is. Measured 2026-11-27 on this 2-core VM (`--rounds 4`; README, "Where april's seconds
go"): the driver's share was 3.7% of the baseline's rollouts and 8.9% of april's (medians); each ms of tax lengthened
the rollout by 0.83 ms (baseline) and 1.08 ms (april), medians over rounds that spread widely (-0.76 to 2.57 and 0.09
to 3.15: the tax is ~6% of a rollout, the run-to-run noise about as much). A scratch version the same morning, 4
rounds: the baseline 1.0-1.7 ms per ms.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time


def spinning(reward, ms: float):
    """`reward` after `ms` of busy work on the caller's thread (the driver's)."""
    def taxed(r):
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < ms / 1000:
            pass
        return reward(r)
    return taxed


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m paper.experiments.measure_driver_tax", description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=4, help="rounds of the four runs (default 4)")
    p.add_argument("--tax", type=float, default=1.0, help="ms of driver work per finished response (default 1)")
    p.add_argument("--world", default="default", help="the validation world (real_backend/validation_workloads.toml)")
    p.add_argument("--policies", default="baseline,april", help="policy specs, comma-separated (default baseline,april)")
    args = p.parse_args(argv)
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    import pandas as pd

    from real_backend.validation_workloads import world_arg
    from real_backend.world import prepare, run_real, world_engine

    world = world_arg(args.world)
    if world is None:
        return 2
    specs = [s.strip() for s in args.policies.split(",") if s.strip()]
    rows = []
    with world_engine(world) as (setup, config, _, engine), tempfile.TemporaryDirectory() as scratch:
        prompts, policy = prepare(setup, "baseline", config)
        run_real(setup, policy, config, f"{scratch}/warm", engine=engine, prompts=prompts)  # first steps are slower
        for k in range(args.rounds):
            for spec in specs:
                for tax in (0.0, args.tax):
                    prompts, policy = prepare(setup, spec, config)
                    if tax:
                        prompts.reward = spinning(prompts.reward, tax)
                    out = f"{scratch}/{spec}-{tax}-{k}"
                    run_real(setup, policy, config, out, engine=engine, prompts=prompts)
                    steps = pd.read_parquet(f"{out}/steps.parquet")
                    ended = int((steps["finished"] + steps["truncated"]).sum())
                    rows.append({"round": k, "policy": spec, "tax_ms": tax, "rollout_s": float(steps["rollout_seconds"].sum()),
                                 "driver_s": float(steps["driver_seconds"].sum()), "ended": ended})
                    print(rows[-1], flush=True)
    df = pd.DataFrame(rows)
    df["driver_share"] = df["driver_s"] / df["rollout_s"]
    table = df.groupby(["policy", "tax_ms"])[["rollout_s", "driver_s", "driver_share", "ended"]].median()
    pd.set_option("display.width", 200)
    print(table.round(4).to_string())
    for spec in specs:
        one = df[df["policy"] == spec].pivot(index="round", columns="tax_ms", values="rollout_s")
        ended = df[(df["policy"] == spec) & (df["tax_ms"] > 0)].set_index("round")["ended"]
        lost = (one[args.tax] - one[0.0]) / (ended * args.tax / 1000)
        print(f"{spec}: rollout lengthened {lost.min():.2f}-{lost.max():.2f} ms per ms of driver work added "
              f"(median {lost.median():.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
