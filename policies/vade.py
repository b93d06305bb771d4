"""vade -- variance-aware prompt selection with tiered token budgets (VADE; seed plan §4.1).

Source: Hu et al., "VADE: Variance-Aware Dynamic Sampling via Online Sample-Level Difficulty
Estimation for Multimodal RL" (arXiv 2511.18902): a Beta posterior per prompt, a Thompson sampler
that picks the prompts with the most expected signal, a two-scale decay of old evidence. The seed plan
(§4.1, "tiered routing") adds token budgets by tier: hard prompts get the full budget, medium ones a
middle budget, easy ones are skipped. The paper's exact decay and tier formulas are not in the
material we could read; the ones below are ours, and each constant is a parameter.

Rule, each step (formulas of the posterior in lssim/loop/difficulty.py):
- Posterior per prompt: Beta(alpha, beta) with alpha = a0 + a, beta = b0 + b, evidence a (successes)
  and b (failures) from its responses' rewards (clipped to [0, 1]), decayed by `step_decay` per step
  and by `visit_decay` each time the prompt gets new responses (two scales).
- Tiers from the posterior mean p = alpha / (alpha + beta) and the evidence n = alpha + beta - a0 - b0:
      easy    p >= easy_above and n >= min_evidence   -> skipped this step
      hard    p <= hard_below, or n < min_evidence     -> max_tokens * hard_budget (unknown = hard)
      medium  otherwise                                -> max_tokens * medium_budget
- Thompson sampling: draw p~_i ~ Beta(alpha_i, beta_i) for every prompt of the pool not skipped, score
  s_i = p~_i (1 - p~_i) (the Bernoulli variance: GRPO learns only from groups whose rewards differ),
  and take the len(proposal) prompts with the largest scores, each with the proposal's group size and
  its tier's budget (never above the budget the proposal had).
- Remember: after the step, every ended response updates its prompt's posterior.

VADE replaces the data loader's choice, so it keeps the number of groups it was given: composed after
an over-provisioner (`april+vade`) it fills the larger plan. Prompts may recur in consecutive steps
(the sampler draws from the whole pool); the simulator answers such (step, prompt) pairs from the
prompt's nearest recorded step and reports the share it modelled.
"""

from __future__ import annotations

import numpy as np

from lssim.loop.columns import stable_smallest
from lssim.loop.core import GroupSpec, GroupSpecs
from lssim.loop.difficulty import PromptPosterior
from lssim.loop.policy import Policy
from lssim.loop.rewards import RewardScale


class VADE(Policy):
    name = "vade"

    def __init__(self, prior_a: float = 1.0, prior_b: float = 1.0, step_decay: float = 0.98, visit_decay: float = 0.7,
                 easy_above: float = 0.9, hard_below: float = 0.3, min_evidence: float = 2.0, hard_budget: float = 1.0,
                 medium_budget: float = 0.5):
        if not 0.0 <= hard_below < easy_above <= 1.0:
            raise ValueError(f"vade: need 0 <= hard_below < easy_above <= 1, got {hard_below}, {easy_above}")
        if not (0.0 < medium_budget <= 1.0 and 0.0 < hard_budget <= 1.0):
            raise ValueError("vade: budgets are fractions of max_tokens in (0, 1]")
        if min_evidence < 0:
            raise ValueError("vade: min_evidence must be >= 0")
        self.prior_a, self.prior_b, self.step_decay, self.visit_decay = prior_a, prior_b, step_decay, visit_decay
        self.easy_above, self.hard_below, self.min_evidence = easy_above, hard_below, min_evidence
        self.hard_budget, self.medium_budget = hard_budget, medium_budget
        self.posterior = PromptPosterior(prior_a, prior_b, step_decay, visit_decay)
        self._scale = RewardScale()  # the run's, from each step's context
        self.last_tiers: dict[str, int] = {}  # how many prompts of the pool fell in each tier at the last plan

    def tiers(self, prompt_ids: np.ndarray, step: int) -> np.ndarray:
        """0 = easy (skipped), 1 = medium, 2 = hard, per prompt."""
        return self._tiers(*self.posterior.params(prompt_ids, step))

    def _tiers(self, alpha: np.ndarray, beta: np.ndarray) -> np.ndarray:
        p, n = self.posterior.mean_of(alpha, beta)
        known = n >= self.min_evidence
        return np.where(known & (p >= self.easy_above), 0, np.where(known & (p > self.hard_below), 1, 2))

    def plan(self, ctx, proposal):
        self._scale = ctx.reward_scale
        if not proposal:
            return proposal
        pool = ctx.pool.prompt_id
        alpha, beta = self.posterior.params(pool, ctx.step)
        tier = self._tiers(alpha, beta)
        self.last_tiers = {"easy": int((tier == 0).sum()), "medium": int((tier == 1).sum()), "hard": int((tier == 2).sum())}
        candidates = np.flatnonzero(tier > 0)
        if len(candidates) == 0:
            return []
        sampled = ctx.rng.beta(alpha[candidates], beta[candidates])
        score = sampled * (1.0 - sampled)
        chosen = candidates[stable_smallest(-score, len(proposal))]
        if isinstance(proposal, GroupSpecs) and proposal.untouched:  # columns in, columns out (no loader batch, as below)
            return self._plan_columns(ctx, proposal, pool[chosen], tier[chosen])
        plan = []
        for g, i in zip(proposal, chosen.tolist()):
            fraction = self.hard_budget if tier[i] == 2 else self.medium_budget
            budget = max(1, min(g.max_tokens, int(round(ctx.max_tokens * fraction))))
            plan.append(GroupSpec(int(pool[i]), g.n_samples, budget, g.priority, g.instance))
        return plan

    def _plan_columns(self, ctx, proposal: GroupSpecs, prompt_ids: np.ndarray, tiers: np.ndarray) -> GroupSpecs:
        """`plan`'s groups as columns: the proposal's first group sizes and budgets, each capped by its tier's budget."""
        k = len(prompt_ids)
        hard, medium = (int(round(ctx.max_tokens * f)) for f in (self.hard_budget, self.medium_budget))
        budgets = np.maximum(1, np.minimum(proposal.max_tokens[:k], np.where(tiers == 2, hard, medium)))
        return GroupSpecs(np.asarray(prompt_ids, np.int64), proposal.n_samples[:k], budgets.astype(np.int64))

    def end_step(self, outcome):
        self.posterior.update(outcome.step, outcome.prompt_id, outcome.reward, self._scale)
