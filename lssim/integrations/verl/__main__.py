"""`python -m lssim.integrations.verl config --policy SPEC [--trace PATH] --out DIR`: the verl overrides that plug an
lssim policy (and the trace recorder) into a verl 0.9.1 v1 run, and the agent-loop YAML they point to."""

from __future__ import annotations

import argparse
import os
import shlex
import sys

from lssim.loop.policy import make_policy

from lssim.integrations.verl.agent_loop import AGENT_LOOP_YAML, AGENT_NAME

YAML_NAME = "lssim_agent_loops.yaml"
MODES = ("sync", "colocate_async")


def overrides(policy: str, agent_loop_yaml: str, trace: str | None = None, mode: str = "sync", run: str = "lssim") -> list[str]:
    """verl's Hydra overrides (as Hydra reads them; `main` quotes them for a shell), in the order a reader checks
    them. sampler_kwargs repeat three of verl's own keys by interpolation (verl hands a sampler none of them)."""
    kwargs = "++trainer.v1.sampler.sampler_kwargs"  # ++: add the key (sampler_kwargs is {} in verl's config)
    out = [
        f"trainer.v1.trainer_mode={mode}",
        "trainer.v1.sampler.custom_sampler.path=pkg://lssim.integrations.verl.sampler",
        "trainer.v1.sampler.custom_sampler.name=LssimSampler",
        f'{kwargs}.policy="{policy}"',
        f"{kwargs}.groups_per_step=${{data.train_batch_size}}",
        f"{kwargs}.group_size=${{actor_rollout_ref.rollout.n}}",
        f"{kwargs}.max_tokens=${{actor_rollout_ref.rollout.response_length}}",
    ]
    if trace:
        out.append(f'{kwargs}.trace_path="{os.path.abspath(trace)}"')
    if run != "lssim":
        out += [f'{kwargs}.run="{run}"', f'++data.lssim_run="{run}"']
    out += [
        "data.custom_cls.path=pkg://lssim.integrations.verl.dataset",
        "data.custom_cls.name=LssimDataset",
        "data.dataloader_num_workers=0",  # the dataset must live in the trainer's process, beside the sampler
        "data.gen_batch_size=1",  # refill_fn fetches the policy's extra groups one row at a time
        f"actor_rollout_ref.rollout.agent.agent_loop_config_path={os.path.abspath(agent_loop_yaml)}",
        f"actor_rollout_ref.rollout.agent.default_agent_loop={AGENT_NAME}",
    ]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lssim.integrations.verl", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    config = sub.add_parser("config", help="print verl's overrides and write the agent-loop YAML")
    config.add_argument("--policy", required=True, help="lssim policy spec, e.g. hadb+april")
    config.add_argument("--trace", help="write the run's lssim trace here (parquet)")
    config.add_argument("--out", required=True, help=f"folder for {YAML_NAME}")
    config.add_argument("--mode", choices=MODES, default="sync", help="verl's trainer.v1.trainer_mode")
    args = parser.parse_args(argv)
    try:
        make_policy(args.policy)
    except ValueError as e:
        print(f"error: --policy: {e}", file=sys.stderr)
        return 2
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, YAML_NAME)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(AGENT_LOOP_YAML)
    os.replace(tmp, path)
    print(" \\\n    ".join(shlex.quote(o) for o in overrides(args.policy, path, args.trace, args.mode)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
