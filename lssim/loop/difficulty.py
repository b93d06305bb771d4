"""A per-prompt Beta posterior over the solve rate, with a two-scale decay of old evidence.

Used by the difficulty-aware policies (policies/vade.py, policies/ar3po.py). For a prompt i it keeps
the evidence e_i = (a_i, b_i) on top of a Beta(a0, b0) prior, so the posterior is

    alpha_i = a0 + a_i,   beta_i = b0 + b_i,   mean p_i = alpha_i / (alpha_i + beta_i)

Evidence grows with each response that ends (reward r, placed on the run's reward range and clipped,
x = clip((r - low) / (high - low), 0, 1) -- for 0/1 rewards x = clip(r, 0, 1) -- so that a soft-landing
penalty counts as a failure on any scale; NaN rewards, dropped responses, are skipped):

    a_i += x        b_i += 1 - x

and fades at two time scales, because the policy being trained changes under it:

    every step, for every prompt:            e_i <- step_decay ** (steps since last decayed) * e_i
    when the prompt gets new responses:      e_i <- visit_decay * e_i, before the new counts are added

The slow, per-step decay lets a prompt skipped for a long time drift back toward the prior (so it is
tried again); the fast, per-visit decay lets a fresh group outweigh what older weights did on it.
Decay is applied lazily (on read and on update), so a step costs O(prompts seen), not O(pool).
"""

from __future__ import annotations

import math

import numpy as np

from lssim.loop.rewards import RewardScale


class PromptPosterior:
    def __init__(self, prior_a: float = 1.0, prior_b: float = 1.0, step_decay: float = 0.98, visit_decay: float = 0.7):
        if prior_a <= 0 or prior_b <= 0:
            raise ValueError(f"Beta prior needs a0, b0 > 0, got {prior_a}, {prior_b}")
        if not (0.0 < step_decay <= 1.0 and 0.0 <= visit_decay <= 1.0):
            raise ValueError(f"need 0 < step_decay <= 1 and 0 <= visit_decay <= 1, got {step_decay}, {visit_decay}")
        self.prior_a, self.prior_b = float(prior_a), float(prior_b)
        self.step_decay, self.visit_decay = float(step_decay), float(visit_decay)
        self._evidence: dict[int, tuple[float, float, int]] = {}  # prompt -> (a, b, step it was last decayed to)

    def _decayed(self, prompt_id: int, step: int) -> tuple[float, float]:
        a, b, t = self._evidence.get(prompt_id, (0.0, 0.0, step))
        if step > t and self.step_decay < 1.0:
            f = self.step_decay ** (step - t)
            a, b = a * f, b * f
        return a, b

    def update(self, step: int, prompt_ids: np.ndarray, rewards: np.ndarray, scale: RewardScale = RewardScale()) -> None:
        """Add the responses that ended at `step` (one prompt id and reward per response, on `scale`)."""
        counts: dict[int, list[float]] = {}
        for pid, r in zip(prompt_ids.tolist(), scale.normalized(np.asarray(rewards, dtype=float)).tolist()):
            if r != r:
                continue
            x = min(1.0, max(0.0, r))
            c = counts.setdefault(pid, [0.0, 0.0])
            c[0] += x
            c[1] += 1.0 - x
        for pid, (s, f) in counts.items():
            a, b = self._decayed(pid, step)
            self._evidence[pid] = (self.visit_decay * a + s, self.visit_decay * b + f, step)

    def params(self, prompt_ids: np.ndarray, step: int) -> tuple[np.ndarray, np.ndarray]:
        """(alpha, beta) of each prompt at `step`."""
        ab = np.array([self._decayed(pid, step) for pid in prompt_ids.tolist()], dtype=float).reshape(-1, 2)
        return self.prior_a + ab[:, 0], self.prior_b + ab[:, 1]

    def mean(self, prompt_ids: np.ndarray, step: int) -> tuple[np.ndarray, np.ndarray]:
        """(posterior mean solve rate, evidence = pseudo-responses seen after decay) of each prompt."""
        alpha, beta = self.params(prompt_ids, step)
        return alpha / (alpha + beta), alpha + beta - self.prior_a - self.prior_b

    def __len__(self) -> int:
        return len(self._evidence)


def samples_for_one_success(p: np.ndarray, confidence: float) -> np.ndarray:
    """Responses needed to see at least one correct one with probability `confidence`, each correct with
    probability p: ceil(log(1 - confidence) / log(1 - p)); inf where p is 0, 1 where p is 1."""
    p = np.clip(np.asarray(p, dtype=float), 0.0, 1.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        n = np.ceil(math.log(1.0 - confidence) / np.log1p(-p))
    n = np.where(p >= 1.0, 1.0, n)
    return np.where(p <= 0.0, np.inf, n)
