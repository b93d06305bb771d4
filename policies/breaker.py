"""breaker -- entropy/repetition circuit breaker with a soft landing (seed plan §1.2; early exit, §4.2).

Source: the seed plan's "entropy-triggered tail circuit breaker" (§1.2): watch each response's
sliding-window repetition and entropy while it generates; stop a degenerate one -- a repetition loop,
a low-entropy collapse, high-entropy babble -- instead of letting it run to max_tokens, and train on
it with a negative reward (a "soft landing", -1 in the plan, where rewards are 0/1) so the model learns not to do it. §4.2
adds the same idea at inference time (stop once the tokens are near-certain for a while). The
thresholds below are ours; every one is a parameter.

Rule, at every progress checkpoint (every `check_every` tokens of a response), reading
`request.signals["window"]` -- repetition and entropy over the last window, which both engines put
there (lssim/loop/signals.py: computed from tokens and logprobs on vLLM, modelled from the trace's
`loop_start`, `entropy_collapse_start` and `entropy_mean` in the simulator):
- nothing until the window is full (signals["tokens"] == signals["window"]) and the response has
  `min_tokens` tokens;
- loop:     repetition >= `repetition_above`                      -> stop, reason "loop";
- collapse: entropy < `entropy_below` at `patience` checks in a row  -> stop, reason "entropy_collapse";
- babble:   entropy > `entropy_above` at `patience` checks in a row  -> stop, reason "babble";
- a stopped response trains with reward `stop_reward`, read on the run's reward scale (lssim.loop.rewards:
  0 = the lowest reward, 1 = the highest): the default -1 lands one whole range below a wrong answer, the
  plan's -1 for 0/1 rewards and -15 for +5/-5; None keeps the engine's reward.
A response that ends by itself before the rule fires is never touched: the rule acts only at
checkpoints, and a response has none after its end. The engines' window covers at most half a response's budget
(lssim.loop.signals.SignalSpec.window_for): on a 256-token budget it is 128 tokens, and breaker(check_every=64,
min_tokens=128) looks at 128 and 192 (the defaults, every 256 from 256, never look inside such a budget).

Signals: it declares them (`needs().signals`: repetition, and entropy unless entropy_below=0 and
entropy_above=inf turn the entropy rules off); a trace without them refuses it (lssim.traces.signal_trace).

What it saves and what it costs are in the results: tokens a stop saved (`natural_len - response_len`
of the stopped responses) and how many stopped responses would have ended correct
(`natural_reward` in the upper half of the reward range: false positives), where the world can tell (the simulator's trace can).
"""

from __future__ import annotations

import numpy as np

from lssim.loop.policy import Action, Policy, PolicyNeeds, ProgressStops
from lssim.loop.rewards import RewardScale
from lssim.loop.signals import WINDOW_KEY


_REASONS = ("", "loop", "entropy_collapse", "babble")  # the rule's reason codes


class Breaker(Policy):
    name = "breaker"

    def __init__(self, check_every: int = 256, repetition_above: float = 0.5, entropy_below: float = 0.1,
                 entropy_above: float = 2.5, patience: int = 2, min_tokens: int = 256, stop_reward: float | None = -1.0):
        if check_every < 1 or patience < 1 or min_tokens < 0:
            raise ValueError("breaker: check_every and patience must be >= 1, min_tokens >= 0")
        if not 0.0 < repetition_above <= 1.0:
            raise ValueError(f"breaker: repetition_above must be in (0, 1], got {repetition_above}")
        if not 0.0 <= entropy_below < entropy_above:
            raise ValueError(f"breaker: need 0 <= entropy_below < entropy_above, got {entropy_below}, {entropy_above}")
        self.progress_interval = int(check_every)
        self.repetition_above, self.entropy_below, self.entropy_above = repetition_above, entropy_below, entropy_above
        self.patience, self.min_tokens, self.stop_reward = patience, min_tokens, stop_reward
        self._low: dict[int, int] = {}  # rid -> consecutive checks with low entropy
        self._high: dict[int, int] = {}  # rid -> consecutive checks with high entropy
        self._touched: set[int] = set()
        self.stops: dict[str, int] = {"loop": 0, "entropy_collapse": 0, "babble": 0}
        self._scale = RewardScale()  # the run's, from each step's context

    def needs(self):
        # Both rules read their signal; with entropy_below=0 and entropy_above=inf only the repetition rule can act.
        entropy_rules = self.entropy_below > 0 or self.entropy_above < float("inf")
        return PolicyNeeds(signals=frozenset({"repetition", "entropy"} if entropy_rules else {"repetition"}))

    def plan(self, ctx, proposal):
        self._scale = ctx.reward_scale
        return proposal

    def checks(self, generated, repetition, entropy, tokens, window):
        """What one checkpoint says, on one response's numbers or elementwise on arrays of many (both routes ask it):
        (whether the rule looks: a full window and `min_tokens` tokens; a loop; whether the entropy counters count it:
        looked, no loop; low entropy; high entropy)."""
        looked = (generated >= self.min_tokens) * (tokens >= window)
        loop = looked * (repetition >= self.repetition_above)
        counted = looked * (1 - loop)  # a loop stops before the entropy counters move
        return looked, loop, counted, entropy < self.entropy_below, entropy > self.entropy_above

    def code(self, loop, counted, low, high):
        """The reason code once the counters moved: 0 none, 1 loop, 2 entropy collapse, 3 babble."""
        return loop * 1 + counted * ((low >= self.patience) * 2 + (low < self.patience) * (high >= self.patience) * 3)

    def rule(self, generated, repetition, entropy, tokens, window, low, high):
        """The rule at one checkpoint of one response, after `low` and `high` entropy checks in a row: (reason code,
        the low- and high-entropy checks in a row after it, whether it looked). progress_stops runs the same counters
        along arrays."""
        looked, loop, counted, is_low, is_high = self.checks(generated, repetition, entropy, tokens, window)
        low = counted * is_low * (low + 1) + (1 - counted) * low
        high = counted * is_high * (high + 1) + (1 - counted) * high
        return self.code(loop, counted, low, high), low, high, looked

    def decide(self, rid: int, generated: int, signals: dict | None) -> str | None:
        """The rule on one checkpoint's signals: the reason to stop, or None."""
        if not signals:
            return None
        code, low, high, looked = self.rule(generated, signals.get("repetition", 0.0), signals.get("entropy", float("nan")),
                                            signals.get("tokens", 0), signals.get("window", 0), self._low.get(rid, 0),
                                            self._high.get(rid, 0))
        if not looked:
            return None
        self._touched.add(rid)
        if code != 1:
            self._low[rid], self._high[rid] = low, high
        return _REASONS[code] or None

    def on_progress(self, request, state):
        reason = self.decide(request.rid, request.generated, request.signals.get(WINDOW_KEY))
        if reason is None:
            return None
        self.stops[reason] += 1
        return Action.stop(reason, reward=self._stop_reward())

    def progress_stops(self, checkpoints):
        # every checkpoint at once: the rule's counters along each response's checkpoints, then its first stop
        flat = checkpoints.flat()
        s, has = flat.signals()
        _, loop, counted, is_low, is_high = self.checks(flat.generated, s["repetition"], s["entropy"], s["tokens"],
                                                        s["window"])
        loop, counted = has & (loop > 0), has & (counted > 0)
        low = flat.streaks(counted & is_low, counted & ~is_low)
        high = flat.streaks(counted & is_high, counted & ~is_high)
        code = self.code(loop, counted, low, high)
        first, at = flat.first_hits(code > 0)
        stopped = first >= 0
        reason = np.zeros(len(first), np.int64)
        reason[stopped] = code[first[stopped]]
        for c, count in enumerate(np.bincount(reason, minlength=len(_REASONS)).tolist()):
            if c and count:
                self.stops[_REASONS[c]] += count
        return ProgressStops.of(at, np.asarray(_REASONS, object)[reason], reward=self._stop_reward())

    def _stop_reward(self) -> float | None:
        return None if self.stop_reward is None else self._scale.value(self.stop_reward)

    def on_finish(self, request, state):
        self._low.pop(request.rid, None)
        self._high.pop(request.rid, None)

    def on_finishes(self, ended, state):
        if self._low or self._high:  # the batch route keeps no counters of its own here
            for rid in ended.rid.tolist():
                self._low.pop(rid, None)
                self._high.pop(rid, None)

    def end_step(self, outcome):
        # Keep the counters of responses that ran this step (a carried one goes on next step); forget the rest.
        for d in (self._low, self._high):
            for rid in [k for k in d if k not in self._touched]:
                del d[rid]
        self._touched = set()
