"""ar3po -- adaptive rollout counts: fewer samples for easy prompts, more for hard ones (AR3PO's adaptive rollout).

Source: Zhang et al., "Improving Sampling Efficiency in RLVR through Adaptive Rollout and Response
Reuse" (AR3PO, arXiv 2509.25808). The paper samples in stages: every prompt still active gets a few
responses per stage, and a prompt leaves once one of its responses is correct; prompts that never get
one reuse a correct response from a replay buffer. Here the same allocation is made up front, from a
posterior over each prompt's solve rate, because in a synchronous rollout every extra stage waits for
its own long tail. Response reuse is a training-data decision and is not modelled.

Rule, each step:
- Posterior per prompt: the Beta posterior of lssim/loop/difficulty.py (mean p, evidence n), updated from
  every ended response's reward, decayed per step (`step_decay`) and per visit (`visit_decay`).
- Samples wanted for a prompt: enough to see one correct response with probability `confidence`,
      want_i = ceil(log(1 - confidence) / log(1 - p_i)),  clipped to [min_samples, max_samples]
  (p near 1: min_samples; p near 0: max_samples); a prompt with evidence n < min_evidence keeps the
  proposal's group size (nothing known, nothing changed).
- Budget: the step's sample budget is what the proposal asked for, B = sum of its n_samples. If the
  wants exceed B, the largest are lowered first to a common cap c, the largest with
  sum_i min(want_i, c) <= B (water-filling from the top), and what is left of B goes one sample each
  to the capped prompts, the hardest first; never below min_samples. Savings on easy prompts are not
  spent elsewhere: the point is fewer samples.
- min_samples defaults to 2: a group of one has no variance for GRPO to learn from.
"""

from __future__ import annotations

import numpy as np

from lssim.loop.core import GroupSpec, GroupSpecs, spec_columns
from lssim.loop.difficulty import PromptPosterior, samples_for_one_success
from lssim.loop.policy import Policy
from lssim.loop.rewards import RewardScale


class AR3PO(Policy):
    name = "ar3po"

    def __init__(self, confidence: float = 0.9, min_samples: int = 2, max_samples: int | None = None, min_evidence: float = 2.0,
                 prior_a: float = 1.0, prior_b: float = 1.0, step_decay: float = 0.98, visit_decay: float = 0.7):
        if not 0.0 < confidence < 1.0:
            raise ValueError(f"ar3po: confidence must be in (0, 1), got {confidence}")
        if min_samples < 1 or (max_samples is not None and max_samples < min_samples):
            raise ValueError(f"ar3po: need 1 <= min_samples <= max_samples, got {min_samples}, {max_samples}")
        self.confidence, self.min_samples, self.max_samples, self.min_evidence = confidence, min_samples, max_samples, min_evidence
        self.posterior = PromptPosterior(prior_a, prior_b, step_decay, visit_decay)
        self._scale = RewardScale()  # the run's, from each step's context

    def allocate(self, prompt_ids: np.ndarray, sizes: np.ndarray, step: int) -> np.ndarray:
        """Samples per prompt (see the module docstring), given the proposal's group sizes."""
        p, n = self.posterior.mean(prompt_ids, step)
        hi = self.max_samples if self.max_samples is not None else 2 * int(sizes.max())
        want = np.clip(samples_for_one_success(p, self.confidence), self.min_samples, hi)
        want = np.where(n >= self.min_evidence, want, sizes).astype(np.int64)
        budget = int(sizes.sum())
        if want.sum() > budget:
            # The largest integer cap c with sum(min(want, c)) <= budget, then one more sample each for
            # as many of the capped prompts as the remainder allows (water-filling from the top).
            cap = self.min_samples
            for c in range(int(want.max()), self.min_samples - 1, -1):
                if np.minimum(want, c).sum() <= budget:
                    cap = c
                    break
            capped = np.flatnonzero(want > cap)
            capped = capped[np.argsort(p[capped], kind="stable")]  # the hardest (lowest p) first: counts stay monotone
            want = np.minimum(want, cap)
            spare = budget - int(want.sum())
            if spare > 0:
                want[capped[:spare]] += 1
        return want

    def plan(self, ctx, proposal):
        self._scale = ctx.reward_scale
        if not proposal:
            return proposal
        ids, sizes, budgets = (np.asarray(c, np.int64) for c in spec_columns(proposal))
        counts = self.allocate(ids, sizes, ctx.step)
        if isinstance(proposal, GroupSpecs) and proposal.untouched:  # columns in, columns out (no loader batch, as below)
            return GroupSpecs(ids, counts, budgets)
        return [GroupSpec(g.prompt_id, int(k), g.max_tokens, g.priority, g.instance) for g, k in zip(proposal, counts.tolist())]

    def end_step(self, outcome):
        self.posterior.update(outcome.step, outcome.prompt_id, outcome.reward, self._scale)
