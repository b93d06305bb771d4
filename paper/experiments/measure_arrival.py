"""What a weight arrival costs a rollout in flight on the real engine, against the simulated twin's price.

    python -m paper.experiments.measure_arrival                       # the default world's engine; ~1 minute
    python -m paper.experiments.measure_arrival --rounds 6 --sizes 16,32,64 --at 32

An async run's weights arrive mid-rollout; the controller then aborts every response in flight (one call), loads
the weights and resubmits each with its tokens so far (lssim.loop.controller's `_weights_arrived`). The load is the
trainer's sync, measured and priced apart; this measures the rest with the profile's own probe
(real_backend.resume_probe): per n, plain cells against cells where every request is aborted and resubmitted at
`--at` tokens, the resubmission's measured cost and what the twin prices of it (the profile's abort price, one
re-prefill), without and with the resume price r1 fitted on these cells.

Measured 2026-11-28 on this 2-core VM (`--rounds 4`). Against validation/modes46p's profile, with vLLM's prefix
cache left as it was (the first version of this script): the arrival cost 47 / 60 / 125 ms at n = 16 / 32 / 64, the
twin priced 25 / 45 / 86 ms of it, ~0.6 ms a request unpriced. But the cache answered part of the re-prefill, which
an arrival's weight load prevents (it drops the cache); the probe now drops it too. Against modes47p's profile: 37 /
67 / 119 ms, priced 44 / 61 / 95, r1 0.31 ms a request; with the served weights loaded instead (`--push`, the load's
own 113 ms left out): 39 / 69 / 128 ms, r1 0.43. The load leaves 2-9 ms of after-effects; an arrival's resubmission is
priced within ~10 ms with r1. Why it matters: async's twin is 6-9% faster than its runs
beyond collocated's level in every recording (docs/fidelity.md, "What is left (issue 37)"), and an arrival is the
one event async has that collocated's reference runs do not.
"""

from __future__ import annotations

import argparse
import os
import sys

SIZES = (16, 32, 64)


def _weight_load(engine, model_dir: str):
    """A call that loads the served model's own weights into the engine (what an arrival's push does)."""
    from transformers import AutoModelForCausalLM

    state = AutoModelForCausalLM.from_pretrained(model_dir).state_dict()
    return lambda: engine.update_weights(state, version=engine.weight_version)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m paper.experiments.measure_arrival", description=__doc__.split("\n\n")[0])
    p.add_argument("--world", default="default", help="a world of real_backend/validation_workloads.toml (its instance 0)")
    p.add_argument("--rounds", type=int, default=4, help="cells of each size and kind (default 4)")
    p.add_argument("--sizes", default=",".join(map(str, SIZES)), help="requests in flight at the arrival, comma-separated")
    p.add_argument("--at", type=int, default=32, help="tokens every request has when the weights arrive (default 32)")
    p.add_argument("--push", action="store_true",
                   help="load the served model's own weights at the arrival (a whole arrival) instead of only dropping "
                        "the prefix cache; the load's own seconds are left out, its after-effects are not")
    p.add_argument("--profile", default="real_backend/data/profile_cpu.json", help="the profile the twin's price comes from")
    args = p.parse_args(argv)
    from real_backend.profile import int_list

    try:
        sizes = tuple(int_list(args.sizes, "--sizes"))
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.rounds < 1 or args.at < 1:
        print("error: --rounds and --at must be >= 1", file=sys.stderr)
        return 2
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    from lssim.cost import ProfiledCostModel
    from real_backend.resume_probe import MORE, fit_resume_seconds, measure_resumes, resume_table
    from real_backend.validation_workloads import world_arg
    from real_backend.world import world_engine

    world = world_arg(args.world)
    if world is None:
        return 2
    model = ProfiledCostModel.from_json(args.profile)
    with world_engine(world) as (setup, _, _, engine):
        load = _weight_load(engine, setup.model_dir) if args.push else None
        cells = measure_resumes(engine, model, sizes, args.rounds, args.at, load=load)
    if args.push:
        print(f"weight load: median {cells['load_seconds'][cells['resume']].median() * 1e3:.1f} ms a load (left out)")
    table = resume_table(cells) * 1e3
    r1 = fit_resume_seconds(cells)
    table["priced_with_r1_ms"] = table["priced_seconds"] + r1 * 1e3 * table.index.to_numpy()
    print(f"a weight arrival at {args.at} tokens (abort, resubmit with the tokens so far; no weight load), ms, medians "
          f"over {args.rounds} cells: {MORE} tokens more per request, plain against resumed")
    print(table.rename(columns=lambda c: c.replace("_seconds", "_ms")).round(1).to_string())
    print(f"resume price fitted on these cells: r1 = {r1 * 1e3:.3f} ms per request resubmitted "
          f"(the profile's own: {model.resume_seconds * 1e3:.3f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
