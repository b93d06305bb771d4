"""The run's decisions on verl's side: one lssim Policy, asked for a plan whenever verl's data loader needs prompts.

verl 0.9.1's v1 trainer (verl/trainer/ppo/v1/trainer_base.py) draws a step's prompts from its data loader
(`prepare_step` -> `_add_batch_to_generate`: `data.train_batch_size` rows, in `data.gen_batch_size` chunks), and
more when its sampler calls `refill_fn(n)` (`_add_prompts_to_generate`: n rows). It has no hook that chooses
*which* rows: the loader's sampler is torchdata's RandomSampler or a SequentialSampler (verl/trainer/ppo/utils.py,
`create_rl_sampler`, not configurable in 0.9.1). So lssim's dataset (dataset.py) serves, for each row the loader
asks for, the next group this driver planned: a row of the prompt the policy chose, with `__rollout_n__` (verl's
own per-row group size) and `lssim_max_tokens` (read by lssim's agent loop) set from its GroupSpec.

Planning follows lssim's controller (lssim/loop/controller.py): a step's proposal is the next groups of a data loader
(here lssim's own: a seeded shuffle of the pool per epoch, as verl's RandomSampler with `data.seed`); the policy's
`plan` revises it and may draw more (`ctx.draw`). A plan is made when the dataset asks for a row and none is left.
verl takes `train_batch_size` rows per step whatever the plan says, so a plan shorter than that is padded with the
loader's next groups; a longer one (over-provisioning, HADB's larger short steps) is handed to verl by the sampler
(sampler.py: `refill_fn(pending)`), in the same step.

Policy hooks asked on verl: plan (here), end_rollout, select, top_up and end_step (sampler.py). Not asked: priority,
place, on_progress, on_finish, on_unfinished (verl gives a plug-in no per-request control once a group is
submitted; in its async modes every unfinished response is carried, as APRIL's on_unfinished says).

verl builds the sampler and the dataset separately from its config, in one process (the sampler first, in
PPOTrainer.__init__; the dataset in init(), with `data.dataloader_num_workers=0`): the sampler starts the run's
driver under a name and the dataset finds it there (`start_run`, `get_run`).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Callable

import numpy as np

from lssim.loop.core import GroupSpec, PromptPool, StepContext
from lssim.loop.policy import Policy, StepOutcome, make_policy


@dataclass(slots=True, frozen=True)
class DriverConfig:
    """The run's shape as verl configures it (the sampler's `sampler_kwargs` repeat these from verl's config)."""

    groups_per_step: int  # data.train_batch_size
    group_size: int  # actor_rollout_ref.rollout.n
    max_tokens: int  # actor_rollout_ref.rollout.response_length
    total_groups: int | None = None  # groups the run trains on (None: unbounded; verl's total_training_steps decide)
    seed: int = 0

    def __post_init__(self):
        for name in ("groups_per_step", "group_size", "max_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"DriverConfig.{name} must be an int >= 1, got {value!r}")
        if self.total_groups is not None and (not isinstance(self.total_groups, int) or self.total_groups < 1):
            raise ValueError(f"DriverConfig.total_groups must be an int >= 1 or None, got {self.total_groups!r}")


class PolicyDriver:
    """Hands verl's data loader the groups an lssim policy plans, and tells the policy what each step did."""

    def __init__(self, policy: Policy | str, config: DriverConfig):
        self.policy = make_policy(policy) if isinstance(policy, str) else policy
        needs = self.policy.needs()
        if needs.oracle:
            raise ValueError(f"policy {self.policy.name} reads true lengths (needs().oracle): it runs in the simulator only")
        if needs.speculation is not None:
            raise ValueError(f"policy {self.policy.name} asks the engine for speculative decoding, which this plug-in "
                             "cannot switch on: configure it in verl's rollout instead")
        self.config = config
        self.pool: PromptPool | None = None
        self._policy_rng = np.random.default_rng([config.seed, 1])  # the policy's own generator, as lssim's controller
        self._loader_rng = np.random.default_rng(config.seed)
        self._order: list[int] = []  # the rest of the loader's current epoch
        self._queue: deque[GroupSpec] = deque()  # planned groups verl's loader has not taken yet
        self.plans: list[list[GroupSpec]] = []  # every step's plan as handed to verl (padding included)
        self.padded_groups = 0  # groups the loader added to plans shorter than train_batch_size
        self.groups_trained = 0
        self.carried_groups = 0  # groups still in flight after the last step (async modes), told by the sampler

    # -- the pool (the train dataset's rows) ----------------------------------------------------------------
    def attach_pool(self, n_prompts: int, prompt_len: np.ndarray | None = None) -> None:
        """The train dataset's rows are the prompts: ids 0..n-1. verl's dataset does not tokenize prompts up front,
        so their lengths are unknown (0) unless given; no lssim policy reads them."""
        if n_prompts < 1:
            raise ValueError(f"the train dataset has {n_prompts} rows")
        lens = np.zeros(n_prompts, dtype=np.int64) if prompt_len is None else np.asarray(prompt_len, dtype=np.int64)
        if len(lens) != n_prompts:
            raise ValueError(f"prompt_len has {len(lens)} values for {n_prompts} prompts")
        self.pool = PromptPool(np.arange(n_prompts, dtype=np.int64), lens)

    # -- what verl's loader asks ----------------------------------------------------------------------------
    def next_group(self) -> GroupSpec:
        """The group for the next row verl's data loader fetches (a new plan when the last one is used up)."""
        if not self._queue:
            self._plan_step()
        return self._queue.popleft()

    @property
    def pending(self) -> int:
        """Groups planned that verl's loader has not fetched yet (the sampler refills exactly these)."""
        return len(self._queue)

    def enqueue(self, groups: list[GroupSpec]) -> None:
        """Groups a policy adds during a rollout (top_up): the sampler has verl's loader fetch them next."""
        self._queue.extend(groups)

    # -- what the sampler tells -----------------------------------------------------------------------------
    def end_step(self, outcome: StepOutcome, groups_trained: int, carried_groups: int) -> None:
        self.groups_trained += groups_trained
        self.carried_groups = carried_groups
        self.policy.end_step(outcome)

    # -- planning -------------------------------------------------------------------------------------------
    @property
    def groups_left(self) -> int:
        total = self.config.total_groups
        return 2**62 if total is None else max(0, total - self.groups_trained)

    def context(self, draw: Callable[[int], list[GroupSpec]] | None = None) -> StepContext:
        if self.pool is None:
            raise RuntimeError("no prompt pool: lssim's dataset (data.custom_cls) attaches it when verl builds it")
        cfg = self.config
        return StepContext(step=len(self.plans), groups_per_step=cfg.groups_per_step, group_size=cfg.group_size,
                           max_tokens=cfg.max_tokens, groups_left=self.groups_left, carried_groups=self.carried_groups,
                           pool=self.pool, rng=self._policy_rng, draw=draw if draw is not None else self.draw)

    def draw(self, n: int) -> list[GroupSpec]:
        """The loader's next n groups (the run's default group size and budget), continuing across epochs."""
        out = []
        for _ in range(max(0, int(n))):
            if not self._order:
                self._order = self._loader_rng.permutation(len(self.pool)).tolist()[::-1]  # popped from the end
            out.append(GroupSpec(int(self.pool.prompt_id[self._order.pop()]), self.config.group_size, self.config.max_tokens))
        return out

    def _plan_step(self) -> None:
        ctx = self.context()
        cfg = self.config
        proposal = self.draw(max(0, min(cfg.groups_per_step - ctx.carried_groups, ctx.groups_left - ctx.carried_groups)))
        plan = list(self.policy.plan(ctx, proposal))
        for g in plan:
            if not 0 <= g.prompt_id < len(self.pool):
                raise ValueError(f"policy {self.policy.name} planned prompt {g.prompt_id}, not a row of the train dataset")
        short = cfg.groups_per_step - len(plan)
        if short > 0:  # verl fetches train_batch_size rows per step whatever the plan: the loader fills the rest
            plan += self.draw(short)
            self.padded_groups += short
        self.plans.append(plan)
        self._queue.extend(plan)


# verl builds the sampler and the dataset apart; they meet here, by run name (one process, see the docstring).
_RUNS: dict[str, PolicyDriver] = {}


def start_run(name: str, driver: PolicyDriver) -> PolicyDriver:
    """Make `driver` the run called `name` (a new run of the same name replaces the old: a restarted trainer)."""
    _RUNS[name] = driver
    return driver


def get_run(name: str) -> PolicyDriver:
    try:
        return _RUNS[name]
    except KeyError:
        raise LookupError(f"no lssim run {name!r} in this process: lssim's sampler starts it "
                          "(trainer.v1.sampler.custom_sampler), and verl must build it before the dataset "
                          "(data.dataloader_num_workers=0 keeps the dataset in the trainer's process)") from None


def end_run(name: str) -> None:
    _RUNS.pop(name, None)
