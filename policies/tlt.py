"""tlt -- speculation only where it pays, decided from the acceptance measured while the run goes (TLT, Hu et al.
2025, arXiv 2511.16665, "Taming the Long-Tail"; seed 001).

Source: TLT's adaptive rollout engine picks, per batch, whether and how to speculate: the tail's small batches
are memory/overhead-bound and verifying drafts there is nearly free, large batches are compute-bound and it is
not; and the drafter's acceptance drifts as the target model trains, so the choice follows what is measured.
(TLT also trains its drafter on idle GPUs; here the drafter is vLLM's n-gram lookup, which needs no training.)

Rule: before each step, estimate the acceptance so far (the engine's counters: drafts and accepted tokens,
shrunk towards the prior `alpha` by `prior_drafts` pseudo-drafts), price speculation with the measured model
(lssim.cost.SpeculativeCost with a SpecFit, `profile`) at every batch size n <= `max_batch`, and speculate while an
instance runs at most the largest n below which every factor is < 1 - `margin` (0: off everywhere). The decision
goes to the engine through a live switch (lssim.cost.speculative.SpeculationSwitch) that both engines read: the
simulator prices each span with it, vLLM's proposer is limited by it from its next step on (real_backend
spec_stats.limit_drafts). Within a step, speculation turns on by itself once the batch has shrunk below the
threshold (the tail). When off, no new acceptance is measured; with `probe_every` k > 0, every k-th step runs
with the threshold at 1 (speculating only for a lone survivor) to keep measuring.

Decisions are kept in `self.decisions` (step, drafts, accepted tokens, alpha estimate, threshold).

Defaults: profile = real_backend/data/speculation_cpu.json (vLLM n-gram, this CPU), cost_profile =
real_backend/data/profile_cpu.json (the plain engine's cost model the factors are relative to), gamma 4, max_batch 32
(TLT's switch-off), alpha = the profile's measured acceptance, prior_drafts 200, margin 0.02, probe_every 0.

On a GPU: the same policy with a GPU speculation profile (measure_speculation.py on the GPU build) and a GPU cost
profile; vLLM's GPU build samples correctly with speculation at temperature > 0 (the CPU build does not, so
here everything runs greedy); a draft model (TLT's drafter, EAGLE) needs `method="draft"` wired into the real
backend (engine_config) with its own measured step cost.
"""

from __future__ import annotations

from pathlib import Path

from lssim.loop.core import Speculation
from lssim.loop.policy import Policy, PolicyNeeds

_REAL = Path(__file__).resolve().parents[1] / "real_backend" / "data"
DEFAULT_PROFILE = str(_REAL / "speculation_cpu.json")
DEFAULT_COST = str(_REAL / "profile_cpu.json")


class TLT(Policy):
    name = "tlt"

    def __init__(self, profile: str | None = DEFAULT_PROFILE, cost_profile: str = DEFAULT_COST, alpha: float | None = None,
                 gamma: int = 4, max_batch: int = 32, prior_drafts: int = 200, margin: float = 0.02, probe_every: int = 0):
        from lssim.cost import ProfiledCostModel
        from lssim.cost.speculative import MeasuredSpeculation, SpeculationSwitch, load_spec_fit

        if prior_drafts < 1 or not 0.0 <= margin < 1.0 or probe_every < 0:
            raise ValueError(f"tlt: prior_drafts >= 1, 0 <= margin < 1, probe_every >= 0; got {prior_drafts}, {margin}, {probe_every}")
        fit, measured = load_spec_fit(profile) if profile else (None, {})
        if alpha is None:
            alpha = measured.get("fit", {}).get("alpha", 0.5)
        self.profile, self.cost_profile, self.prior_drafts, self.margin = profile, cost_profile, prior_drafts, margin
        self.probe_every, self.fit = probe_every, fit
        self.base = ProfiledCostModel.from_json(cost_profile)
        self.prior = Speculation(method="ngram", alpha=alpha, gamma=gamma, max_batch=max_batch)
        self.switch = SpeculationSwitch(self.threshold(alpha))
        self.speculation = MeasuredSpeculation(method="ngram", alpha=alpha, gamma=gamma, max_batch=max_batch, fit=fit,
                                               switch=self.switch)
        self.decisions: list[dict] = []

    def needs(self):
        return PolicyNeeds(speculation=self.speculation)

    def run_notes(self) -> dict:
        return {"decisions": list(self.decisions)}

    def threshold(self, alpha: float) -> int:
        """The largest batch size n <= max_batch such that speculation pays (factor < 1 - margin) at every batch
        size up to n, priced with the measured model at acceptance `alpha`; 0 if it does not pay at batch 1."""
        from lssim.cost import SpeculativeCost
        from lssim.cost.speculative import MeasuredSpeculation

        p = self.prior
        cost = SpeculativeCost(self.base, MeasuredSpeculation(method=p.method, alpha=alpha, gamma=p.gamma,
                                                              max_batch=p.max_batch, fit=self.fit))
        n = 0
        while n < p.max_batch and cost._raw_factor(n + 1) < 1.0 - self.margin:
            n += 1
        return n

    def estimate_alpha(self, counts: dict | None) -> float:
        """The acceptance so far: the engine's drafts and accepted tokens plus `prior_drafts` pseudo-drafts at the
        prior alpha (Speculation.alpha_from_counts of the sums)."""
        from lssim.cost.speculative import accepted_per_draft

        p = self.prior
        drafts = self.prior_drafts + (counts or {}).get("drafts", 0)
        accepted = self.prior_drafts * accepted_per_draft(p.alpha, p.gamma) + (counts or {}).get("accepted_tokens", 0)
        return Speculation.alpha_from_counts(drafts, min(accepted, drafts * p.gamma), p.gamma)

    def plan(self, ctx, proposal):
        counts = self.switch.counters() if self.switch.counters is not None else None
        alpha = self.estimate_alpha(counts)
        limit = self.threshold(alpha)
        if limit == 0 and self.probe_every and ctx.step % self.probe_every == 0:
            limit = 1
        self.switch.max_batch = limit
        self.decisions.append({"step": ctx.step, "drafts": (counts or {}).get("drafts", 0),
                               "accepted_tokens": (counts or {}).get("accepted_tokens", 0), "alpha": alpha,
                               "max_batch": limit})
        return proposal
