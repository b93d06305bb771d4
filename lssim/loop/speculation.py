"""An execution feature a policy asks of the engine (speculative decoding, layer skip): what it is and how it is priced.

Re-exported by lssim.loop.core, where callers import it from.
"""

from __future__ import annotations

from dataclasses import dataclass


SPECULATION_METHODS = ("ngram", "draft", "layer_skip")


@dataclass(slots=True, frozen=True)
class Speculation:
    """An execution feature a policy asks of the engine: faster decoding while the running batch is small.

    A policy asks for it in its needs (`PolicyNeeds.speculation`); the controller hands it to the engine once,
    before the first step (`Engine.set_speculation`, as with the progress interval), and each engine instance
    applies it whenever it runs at most `max_batch` sequences (TLT turns speculation off above 32 running
    requests: large batches are compute-bound and verifying drafts costs more than it saves).

    Methods:
    - "ngram" (lossless): drafts by prompt lookup (vLLM's n-gram proposer; SPEC-RL's reuse of the prompt's
      previous rollout is the same idea with a better source). Drafting is nearly free (`draft_cost` 0).
    - "draft" (lossless): a draft model (TLT's adaptive drafter, EAGLE); `draft_cost` is its per-token cost.
    - "layer_skip" (lossy): each token runs through the first `layer_fraction` of the layers, with no
      verification. Its cost: those tokens are not samples of the policy being trained (the simulator counts
      them: `SimEngine.speculated_tokens`).

    For the lossless methods, with acceptance rate alpha (each drafted token accepted with probability alpha,
    independently, until the first rejection) and gamma drafted tokens per verification, one verification
    yields (1 - alpha^(gamma+1)) / (1 - alpha) tokens on average, so the expected time per generated token is
    T_SD = (1 - alpha)(D + T) / (1 - alpha^(gamma+1)), with D the cost of drafting gamma tokens and T the cost
    of verifying them at the running batch size (lssim.cost.SpeculativeCost prices both).

    alpha is a parameter, not a law: measure it on the real engine (vLLM counts drafted and accepted tokens;
    `Speculation.alpha_from_counts` turns the counts into alpha) and pass it back, e.g.
    `lssim replay TRACE --policy "spec_tail(alpha=0.62)"`.
    """

    method: str = "ngram"
    alpha: float = 0.5  # probability that a drafted token is accepted (lossless methods)
    gamma: int = 4  # tokens drafted per verification (lossless methods)
    draft_cost: float = 0.0  # drafting one token, as a fraction of one target decode iteration at the same batch
    max_batch: int = 32  # speculate only while an instance runs at most this many sequences
    layer_fraction: float = 0.5  # layer_skip: the fraction of the layers each token runs through

    def __post_init__(self):
        if self.method not in SPECULATION_METHODS:
            raise ValueError(f"Speculation.method must be one of {', '.join(SPECULATION_METHODS)}, got {self.method!r}")
        if not 0.0 <= self.alpha <= 1.0:
            raise ValueError(f"Speculation.alpha must be in [0, 1], got {self.alpha}")
        if isinstance(self.gamma, bool) or not isinstance(self.gamma, int) or self.gamma < 1:
            raise ValueError(f"Speculation.gamma must be an int >= 1, got {self.gamma!r}")
        if not 0.0 <= self.draft_cost < float("inf"):
            raise ValueError(f"Speculation.draft_cost must be >= 0 and finite, got {self.draft_cost}")
        if isinstance(self.max_batch, bool) or not isinstance(self.max_batch, int) or self.max_batch < 1:
            raise ValueError(f"Speculation.max_batch must be an int >= 1, got {self.max_batch!r}")
        if not 0.0 < self.layer_fraction <= 1.0:
            raise ValueError(f"Speculation.layer_fraction must be in (0, 1], got {self.layer_fraction}")

    @property
    def lossless(self) -> bool:
        return self.method != "layer_skip"

    def tokens_per_verification(self) -> float:
        """Expected tokens one verification yields: (1 - alpha^(gamma+1)) / (1 - alpha) (gamma + 1 at alpha 1)."""
        a, g = self.alpha, self.gamma
        return float(g + 1) if a >= 1.0 else (1.0 - a ** (g + 1)) / (1.0 - a)

    @staticmethod
    def alpha_from_counts(drafts: int, accepted_tokens: int, gamma: int) -> float:
        """The acceptance rate alpha that explains a real engine's counters: `drafts` verifications of `gamma`
        drafted tokens each accepted `accepted_tokens` in all (vLLM: spec_decode_num_drafts and
        spec_decode_num_accepted_tokens). Solves alpha (1 - alpha^gamma) / (1 - alpha) = accepted / drafts."""
        if drafts <= 0 or gamma < 1:
            raise ValueError(f"need drafts > 0 and gamma >= 1, got drafts={drafts}, gamma={gamma}")
        mean = accepted_tokens / drafts
        if not 0.0 <= mean <= gamma:
            raise ValueError(f"{accepted_tokens} accepted tokens in {drafts} drafts of {gamma}: more than were drafted")
        lo, hi = 0.0, 1.0
        for _ in range(60):  # the mean accepted length grows with alpha: bisect
            mid = (lo + hi) / 2
            if sum(mid ** i for i in range(1, gamma + 1)) < mean:
                lo = mid
            else:
                hi = mid
        return (lo + hi) / 2
