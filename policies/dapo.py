"""dapo -- DAPO's dynamic sampling: generate batches until the step has enough groups with reward variance.

Source: Yu et al., "DAPO: An Open-Source LLM Reinforcement Learning System at Scale" (arXiv 2503.14476),
§3.2 dynamic sampling, as in verl's DAPO recipe (`algorithm.filter_groups`): after each generation
batch, keep the groups whose rewards are not all equal (0 < correct < G for 0/1 rewards); while fewer
than the train batch are kept and fewer than `max_num_gen_batches` batches were generated, generate
another batch; then train on the first train-batch-size kept groups. verl raises an error when the
cap is hit; here the step trains on what it has (and the step row shows it).

Rule, each step:
- The first generation batch is the proposal (the data loader's batch, or what the policies before
  this one planned); `gen_batch_factor` > 1 draws more groups from the loader up front (the DAPO
  paper's script generates 3x the train batch; verl's default is 1x).
- When the rollout would end with nothing in flight (the batch has finished), count the groups done
  so far with reward variance (`RolloutState.groups_effective`); if fewer than the target (the nominal
  groups per step, at most the groups the run has left) and fewer than `max_gen_batches` batches
  were generated, submit the loader's next `gen_batch_factor` x groups-per-step groups (`top_up`).
  A new batch waits for the last to finish, as verl's loop does, so the extra generation time is on
  the engine's clock.
- select: the groups with reward variance, in the order they were generated, at most the target; the rest
  were generated and are discarded (the cost DAPO pays).
"""

from __future__ import annotations

from lssim.loop.policy import Policy


class DAPO(Policy):
    name = "dapo"

    def __init__(self, max_gen_batches: int = 10, gen_batch_factor: float = 1.0):
        if max_gen_batches < 1:
            raise ValueError(f"dapo: max_gen_batches must be >= 1, got {max_gen_batches}")
        if gen_batch_factor <= 0:
            raise ValueError(f"dapo: gen_batch_factor must be > 0, got {gen_batch_factor}")
        self.max_gen_batches, self.gen_batch_factor = max_gen_batches, gen_batch_factor
        self._draw = None
        self._batch = 0
        self._target = 0
        self._gen_batches = 0
        self.gen_batches_per_step: list[int] = []  # generation batches each step took

    def plan(self, ctx, proposal):
        self._draw = ctx.draw
        self._batch = max(1, round(self.gen_batch_factor * ctx.groups_per_step))
        self._target = max(0, min(ctx.groups_per_step, ctx.groups_left))
        self._gen_batches = 1
        extra = self._batch - len(proposal) - ctx.carried_groups
        if extra > 0 and ctx.draw is not None and self._target > 0:
            proposal = proposal + ctx.draw(extra)
        return proposal

    def top_up(self, state):
        if (state.requests_in_flight > 0 or state.groups_effective >= self._target or self._gen_batches >= self.max_gen_batches
                or self._draw is None):
            return []
        self._gen_batches += 1
        return self._draw(self._batch)

    def select(self, groups, step):
        self.gen_batches_per_step.append(self._gen_batches)
        return [g for g in groups if g.has_signal][:self._target]
