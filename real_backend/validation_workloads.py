"""The validation workloads: per policy, the world `lssim validate` runs it in so that it acts (issue 16).

    table = load_workloads()                       # real_backend/validation_workloads.toml, checked
    table.select("ci")                              # the small subset; "all": every listed policy
    w = table.for_spec("seer")                     # PolicyWorkload: its spec and world
    w.world.config(seed=0), w.world.setup()         # the RunConfig and RealSetup the runs use

The table is data (the .toml beside this file, with a line per policy saying why its world makes it act);
this module only reads and checks it. Unknown keys, a policy naming a world that is not there, or a spec
that does not build are errors naming the file and the entry.
"""

from __future__ import annotations

import sys
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path

from lssim.loop.controller import RunConfig

DEFAULT_TABLE = Path(__file__).with_name("validation_workloads.toml")
DEFAULT_WORLD = "default"


@dataclass(frozen=True)
class World:
    """An engine and a run shape, shared by a baseline and the policies validated against it."""

    name: str
    n_instances: int = 1
    steps: int = 5
    groups_per_step: int = 8
    group_size: int = 4
    max_tokens: int = 256
    n_prompts: int | None = None
    # The CPUs each engine instance's threads are bound to, instances separated by "|" (vLLM's
    # VLLM_CPU_OMP_THREADS_BIND, e.g. "0|1"); None: vLLM's own binding (real_backend.world.RealSetup.cpus).
    cpus: str | None = None

    def __post_init__(self):
        for key in ("n_instances", "steps", "groups_per_step", "group_size", "max_tokens"):
            value = getattr(self, key)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"world {self.name!r}: {key} must be an int >= 1, got {value!r}")
        if self.n_prompts is not None and (not isinstance(self.n_prompts, int) or self.n_prompts < self.groups_per_step):
            raise ValueError(f"world {self.name!r}: n_prompts must be an int >= groups_per_step, got {self.n_prompts!r}")
        if self.cpus is not None:
            from .world import cpu_layout_problem

            problem = cpu_layout_problem(self.cpus, self.n_instances)
            if problem:
                raise ValueError(f"world {self.name!r}: {problem}")

    def config(self, seed: int = 0, **override) -> RunConfig:
        """The RunConfig of every run in this world; `override` (steps=..., ...; None values ignored) wins."""
        shape = {k: getattr(self, k) for k in ("steps", "groups_per_step", "group_size", "max_tokens")}
        shape.update({k: v for k, v in override.items() if v is not None})
        return RunConfig(seed=seed, **shape)

    def setup(self, n_prompts: int | None = None):
        """The RealSetup of this world's engine (real_backend.world): its instances and their CPUs, and its prompt
        pool (`n_prompts`, if given, over the world's own)."""
        from .world import RealSetup

        return RealSetup(n_prompts=self.n_prompts if n_prompts is None else n_prompts, n_instances=self.n_instances,
                         cpus=self.cpus)

    def engine_key(self) -> tuple:
        """Worlds with the same key share one engine (the run shape can change between runs; instances and
        their CPUs cannot)."""
        return (self.n_instances, self.cpus)


@dataclass(frozen=True)
class PolicyWorkload:
    """A policy's validation: the spec it runs as (its parameters scaled to the task) and its world."""

    name: str
    spec: str
    world: World
    why: str = ""
    ci: bool = False  # in the small subset (--policies ci)


@dataclass
class WorkloadTable:
    worlds: dict[str, World]
    policies: dict[str, PolicyWorkload] = field(default_factory=dict)
    source: str = ""

    def for_spec(self, spec: str) -> PolicyWorkload:
        """The workload of a --policies entry: by its name as listed (a bare name takes the table's spec and
        parameters); a spec not listed runs as written in the default world."""
        if spec in self.policies:
            return self.policies[spec]
        for w in self.policies.values():
            if w.spec == spec:
                return w
        base = spec.split("(")[0].strip()
        world = self.policies[base].world if base in self.policies and "+" not in spec else self.worlds[DEFAULT_WORLD]
        return PolicyWorkload(name=spec, spec=spec, world=world)

    def world_of(self, name: str, n_instances: int | None = None) -> World:
        """The world `name`, which must have `n_instances` engine instances when given (the measurement scripts'
        --world); ValueError naming it otherwise."""
        world = self.worlds.get(name)
        if n_instances is None and world is None:
            raise ValueError(f"--world {name!r}: there is no world {name!r}; the worlds: {', '.join(self.worlds)}")
        if world is None or (n_instances is not None and world.n_instances != n_instances):
            raise ValueError(f"--world {name!r}: not a world of {n_instances} instances in the workload table")
        return world

    def select(self, which: str) -> list[str]:
        """Policy names: "all" every listed policy, "ci" those marked ci (the small subset)."""
        if which == "all":
            return list(self.policies)
        if which == "ci":
            return [n for n, w in self.policies.items() if w.ci]
        raise ValueError(f"unknown selection {which!r} (all or ci)")


def load_workloads(path: str | Path = DEFAULT_TABLE) -> WorkloadTable:
    """Read and check the table; ValueError naming the file and the entry on anything wrong."""
    from lssim.loop.policy import make_policy

    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ValueError(f"{path}: cannot read the validation workloads ({e})") from None
    unknown = set(raw) - {"worlds", "policies"}
    if unknown:
        raise ValueError(f"{path}: unknown sections {sorted(unknown)} (worlds, policies)")
    known = {f.name for f in fields(World)} - {"name"}
    worlds = {}
    for name, entry in raw.get("worlds", {}).items():
        bad = set(entry) - known
        if bad:
            raise ValueError(f"{path}: [worlds.{name}] has unknown keys {sorted(bad)} (known: {sorted(known)})")
        try:
            worlds[name] = World(name=name, **entry)
        except ValueError as e:
            raise ValueError(f"{path}: {e}") from None
    if DEFAULT_WORLD not in worlds:
        raise ValueError(f"{path}: no [worlds.{DEFAULT_WORLD}] (unlisted policies run there)")
    policies = {}
    for name, entry in raw.get("policies", {}).items():
        bad = set(entry) - {"spec", "world", "why", "ci"}
        if bad or "spec" not in entry:
            raise ValueError(f"{path}: [policies.{name}] needs spec (and world, why), has {sorted(entry)}")
        world = entry.get("world", DEFAULT_WORLD)
        if world not in worlds:
            raise ValueError(f"{path}: [policies.{name}] names world {world!r}, not among {sorted(worlds)}")
        try:
            make_policy(entry["spec"])
        except (ValueError, TypeError, KeyError) as e:
            raise ValueError(f"{path}: [policies.{name}] spec {entry['spec']!r} does not build: {e}") from None
        policies[name] = PolicyWorkload(name=name, spec=entry["spec"], world=worlds[world], why=entry.get("why", ""),
                                        ci=bool(entry.get("ci", False)))
    return WorkloadTable(worlds=worlds, policies=policies, source=str(path))


def world_arg(name: str, n_instances: int | None = None) -> World | None:
    """A measurement script's --world (WorkloadTable.world_of on the shipped table), or None after printing why
    it is not one to stderr (the script then exits with status 2)."""
    try:
        return load_workloads().world_of(name, n_instances)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return None


__all__ = ["World", "PolicyWorkload", "WorkloadTable", "load_workloads", "world_arg", "DEFAULT_TABLE"]
