"""spec_tail -- speculative decoding (or layer skip) for the long tail (TLT, Hu et al. 2025, arXiv 2511.16665;
SPEC-RL, arXiv 2509.23232; seed plan §1.3).

Source: when a rollout's batch has shrunk to its few long responses, each decode iteration is bound by reading
the weights, and spare compute is free: verify several drafted tokens per iteration. TLT does this with an
adaptive drafter trained on idle GPUs and turns speculation off above 32 running requests, where it no longer
pays; SPEC-RL drafts from the prompt's previous rollout; the seed plan (§1.3) proposes self-speculation or
layer skip for a request once it is the batch's last survivor, arguing that a little precision lost on the
tail is acceptable noise for exploration.

Rule: ask the engine, once per run, for speculation (lssim.loop.core.Speculation) while an instance runs at most
`max_batch` sequences. It is an execution feature, not a decision about requests, so the policy has no hooks:
it composes with anything (`seer+spec_tail`).
- method "ngram" (lossless; vLLM's n-gram proposer, drafting nearly free) or "draft" (lossless; a draft model,
  each drafted token costing `draft_cost` of a target iteration; self-speculation with the first layers as
  the drafter is "draft" with draft_cost = the fraction of layers): per generated token the engine spends
  T_SD = (1 - alpha)(D + T) / (1 - alpha^(gamma+1)) (D: drafting gamma tokens, T: verifying them at the
  running batch; lssim.cost.SpeculativeCost).
- method "layer_skip" (lossy): each token runs through `layer_fraction` of the layers, nothing verifies it.
  Quality cost, stated: those tokens are not samples of the policy being trained; the simulator counts them
  (`speculated_tokens` in a run's meta) so a report can put the fraction beside the speedup.

With `profile` (a measured speculation profile, real_backend/data/speculation_cpu.json), the engine's own step costs
are priced instead (lssim.cost.SpeculativeCost with a SpecFit: the proposer's draft rate and length, the verify
step's measured cost), alpha defaults to the measured one, and the factor is not capped at 1: vLLM speculates
where it is slower too. `lssim validate` of the CPU engine needs it: `spec_tail(profile='real_backend/data/speculation_cpu.json')`.

alpha is an assumption until measured: run the real engine with the same Speculation, read its acceptance
counters, turn them into alpha (`Speculation.alpha_from_counts`) and replay with it,
`lssim replay TRACE --policy "spec_tail(alpha=0.62)"`.

Defaults: method="ngram", alpha=0.5 (or the profile's), gamma=4, draft_cost=0.0, max_batch=32 (TLT's threshold), layer_fraction=0.5.
alpha=0.5 is a placeholder of the right order for n-gram drafting on reasoning text, not a measurement.

Measured on the real backend (real_backend/README.md, "Speculative decoding"): vLLM's n-gram proposer
(lookup 1-4, gamma 4) on the reference model's Collatz traces, greedy (vLLM 0.32's CPU build does not sample
correctly with speculation at temperature 1): alpha = 0.18-0.21, 5.5-6.8% of drafted tokens accepted. The CPU
rollout was 2.2x slower with it while the idealized model (capped at 1, verify priced as a bigger batch)
predicted 1.008x faster. paper/experiments/measure_speculation.py measured what goes into it
(real_backend/data/speculation_cpu.json; together ~1.5x of the 2.2x, the rest unexplained on a noisy machine):
a speculating step costs 1.11x a plain one at 1 running sequence and 1.42x at 32 (verify of ~3.5 drafted tokens
per sequence plus the proposer and rejection sampler), and yields 1.21 tokens per sequence (89% of
sequence-steps draft, 0.24 accepted per draft): ~9% faster at batch 1, 20% slower at 32; and an engine started
with speculation is ~1.26x slower even with drafting off (one noisy measurement; among what changes, vLLM
turns async scheduling off for n-gram speculation). `spec_tail(profile='real_backend/data/speculation_cpu.json')` prices the first (lssim validate on
this CPU: measured 0.94x, predicted 0.95x); the second is a property of the engine both the baseline and the
policy ran on there. On the real backend only "ngram" runs (vLLM has no layer skip; no draft model is wired in).
"""

from __future__ import annotations

from lssim.loop.core import Speculation
from lssim.loop.policy import Policy, PolicyNeeds


class SpecTail(Policy):
    name = "spec_tail"

    def __init__(self, method: str = "ngram", alpha: float | None = None, gamma: int = 4, draft_cost: float = 0.0,
                 max_batch: int = 32, layer_fraction: float = 0.5, profile: str | None = None):
        if profile is not None:  # the engine's measured speculation (paper/experiments/measure_speculation.py)
            from lssim.cost.speculative import MeasuredSpeculation, load_spec_fit

            fit, measured = load_spec_fit(profile)
            alpha = measured["fit"]["alpha"] if alpha is None else alpha
        alpha = 0.5 if alpha is None else alpha
        self.method, self.alpha, self.gamma, self.draft_cost = method, alpha, gamma, draft_cost
        self.max_batch, self.layer_fraction, self.profile = max_batch, layer_fraction, profile
        kw = dict(method=method, alpha=alpha, gamma=gamma, draft_cost=draft_cost, max_batch=max_batch,
                  layer_fraction=layer_fraction)
        self.speculation = Speculation(**kw) if profile is None else MeasuredSpeculation(**kw, fit=fit)

    def needs(self):
        return PolicyNeeds(speculation=self.speculation)
