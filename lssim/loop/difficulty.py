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
Decay is applied lazily (on read and on update), so a step costs O(prompts seen), not O(pool). The evidence lives in
arrays (a row per prompt), read and updated a step at a time with the arithmetic of one prompt at a time: each
prompt's counts summed in response order, each decay factor a Python float power.
"""

from __future__ import annotations

import math

import numpy as np

from lssim.loop.prompt_rows import PromptRows, grown
from lssim.loop.rewards import RewardScale


class PromptPosterior:
    def __init__(self, prior_a: float = 1.0, prior_b: float = 1.0, step_decay: float = 0.98, visit_decay: float = 0.7):
        if prior_a <= 0 or prior_b <= 0:
            raise ValueError(f"Beta prior needs a0, b0 > 0, got {prior_a}, {prior_b}")
        if not (0.0 < step_decay <= 1.0 and 0.0 <= visit_decay <= 1.0):
            raise ValueError(f"need 0 < step_decay <= 1 and 0 <= visit_decay <= 1, got {step_decay}, {visit_decay}")
        self.prior_a, self.prior_b = float(prior_a), float(prior_b)
        self.step_decay, self.visit_decay = float(step_decay), float(visit_decay)
        self._rows = PromptRows()  # prompt -> its row in the evidence below
        self._a, self._b = np.zeros(0), np.zeros(0)  # a row's evidence, decayed to step _t
        self._t = np.zeros(0, np.int64)
        self._decay_powers = np.ones(1)  # step_decay ** gap, by gap

    def __setstate__(self, state: dict) -> None:
        evidence = state.pop("_evidence", None)  # a checkpoint written when the evidence was a dict per prompt
        if evidence is None:
            self.__dict__.update(state)
            return
        self.__init__(state["prior_a"], state["prior_b"], state["step_decay"], state["visit_decay"])
        rows = self._rows.add(np.fromiter(evidence, np.int64, len(evidence)))
        n = len(self._rows)
        self._a, self._b, self._t = np.zeros(n), np.zeros(n), np.zeros(n, np.int64)
        for row, (a, b, t) in zip(rows.tolist(), evidence.values()):
            self._a[row], self._b[row], self._t[row] = a, b, t

    def _decayed(self, rows: np.ndarray, step: int) -> tuple[np.ndarray, np.ndarray]:
        """The evidence of each row at `step` (rows -1: none yet)."""
        known = rows >= 0
        safe = np.where(known, rows, 0)
        if not len(self._a):
            return np.zeros(len(rows)), np.zeros(len(rows))
        a, b = np.where(known, self._a[safe], 0.0), np.where(known, self._b[safe], 0.0)
        if self.step_decay < 1.0:
            gap = np.where(known, step - self._t[safe], 0)
            late = gap > 0
            if late.any():
                factor = self._powers(int(gap.max()))[gap[late]]
                a[late], b[late] = a[late] * factor, b[late] * factor
        return a, b

    def _powers(self, top: int) -> np.ndarray:
        """step_decay ** g for g = 0..top, each a Python float power (what one prompt's decay computes), kept."""
        if len(self._decay_powers) <= top:
            self._decay_powers = np.array([self.step_decay ** g for g in range(2 * top + 1)])
        return self._decay_powers

    def update(self, step: int, prompt_ids: np.ndarray, rewards: np.ndarray, scale: RewardScale = RewardScale()) -> None:
        """Add the responses that ended at `step` (one prompt id and reward per response, on `scale`)."""
        x = scale.normalized(np.asarray(rewards, dtype=float))
        scored = ~np.isnan(x)
        if not scored.any():
            return
        x = x[scored]
        x = np.where(x > 0.0, x, 0.0)  # min(1, max(0, x)) as Python's min and max pick
        x = np.where(x < 1.0, x, 1.0)
        before = len(self._rows)
        rows = self._rows.add(np.asarray(prompt_ids, np.int64)[scored])
        n = len(self._rows)
        self._a, self._b, self._t = grown(self._a, n), grown(self._b, n), grown(self._t, n)
        self._t[before:] = step  # a new prompt's evidence: none, as of now
        touched = np.flatnonzero(np.bincount(rows, minlength=n))  # the rows updated, in order
        a, b = self._decayed(touched, step)
        # bincount adds each weight to its row in order: each prompt's counts summed response by response
        successes, failures = np.bincount(rows, x, n)[touched], np.bincount(rows, 1.0 - x, n)[touched]
        self._a[touched] = self.visit_decay * a + successes
        self._b[touched] = self.visit_decay * b + failures
        self._t[touched] = step

    def params(self, prompt_ids: np.ndarray, step: int) -> tuple[np.ndarray, np.ndarray]:
        """(alpha, beta) of each prompt at `step`."""
        a, b = self._decayed(self._rows.find(prompt_ids), step)
        return self.prior_a + a, self.prior_b + b

    def mean(self, prompt_ids: np.ndarray, step: int) -> tuple[np.ndarray, np.ndarray]:
        """(posterior mean solve rate, evidence = pseudo-responses seen after decay) of each prompt."""
        return self.mean_of(*self.params(prompt_ids, step))

    def mean_of(self, alpha: np.ndarray, beta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """`mean` from `params` already read."""
        return alpha / (alpha + beta), alpha + beta - self.prior_a - self.prior_b

    def __len__(self) -> int:
        return len(self._rows)


def samples_for_one_success(p: np.ndarray, confidence: float) -> np.ndarray:
    """Responses needed to see at least one correct one with probability `confidence`, each correct with
    probability p: ceil(log(1 - confidence) / log(1 - p)); inf where p is 0, 1 where p is 1."""
    p = np.clip(np.asarray(p, dtype=float), 0.0, 1.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        n = np.ceil(math.log(1.0 - confidence) / np.log1p(-p))
    n = np.where(p >= 1.0, 1.0, n)
    return np.where(p <= 0.0, np.inf, n)
