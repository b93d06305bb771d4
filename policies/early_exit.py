"""early_exit -- stop a response once its tokens have been near-certain for a while (seed plan §4.2).

Source: the seed plan's inference-time early exit (§4.2): a reasoning response often goes on after its answer is
settled; once the model has been confident for N tokens, stop it and keep what it wrote. Unlike `breaker` it is not
a punishment: the stopped response trains with the world's score of what it wrote so far (`Action.stop(score=True)`,
lssim.loop.contracts.Engine.score_partial): the task's verifier on the partial text on vLLM; in the simulator, where
a trace does not say where in a response its answer is, the answer is taken to be at the end (as in the reference
task, '= answer' then EOS), so a response stopped before its natural length scores the lowest reward.

Rule, at every progress checkpoint (every `check_every` tokens), reading the window signals both engines put in
`request.signals["window"]` (lssim.loop.signals):
- nothing before `min_tokens` tokens;
- confident: the window's mean entropy is below `confident_below` nats (on vLLM from the sampled tokens'
  log-probs: -log p averages to the entropy);
- stop, reason "early_exit", once confident at `patience` checks in a row.
False positives count as breaker's do: stopped responses that would have ended correct (`stopped_correct_fraction`,
where the world knows the natural reward: the simulator). A trace without entropy signals refuses it.

Defaults: check_every=32, confident_below=0.1, patience=3, min_tokens=64.
"""

from __future__ import annotations

import numpy as np

from lssim.loop.policy import Action, Policy, PolicyNeeds, ProgressStops
from lssim.loop.signals import WINDOW_KEY


class EarlyExit(Policy):
    name = "early_exit"

    def __init__(self, check_every: int = 32, confident_below: float = 0.1, patience: int = 3, min_tokens: int = 64):
        if check_every < 1 or patience < 1 or min_tokens < 0:
            raise ValueError("early_exit: check_every and patience must be >= 1, min_tokens >= 0")
        if not confident_below > 0:
            raise ValueError(f"early_exit: confident_below must be > 0 nats, got {confident_below}")
        self.progress_interval = int(check_every)
        self.confident_below, self.patience, self.min_tokens = confident_below, patience, min_tokens
        self._confident: dict[int, int] = {}  # rid -> consecutive confident checks

    def needs(self):
        return PolicyNeeds(signals=frozenset({"entropy"}))

    def checks(self, generated, entropy):
        """What one checkpoint says, on one response's numbers or elementwise on arrays of many (both routes ask it):
        (whether the rule looks: `min_tokens` tokens; whether it is confident there)."""
        looked = generated >= self.min_tokens
        return looked, looked * (entropy < self.confident_below)

    def rule(self, generated, entropy, run):
        """The rule at one checkpoint of one response, after `run` confident checks in a row: (stop or not, the
        confident checks in a row after it, whether it looked). progress_stops runs the same counter along arrays."""
        looked, confident = self.checks(generated, entropy)
        run = confident * (run + 1) + (1 - looked) * run
        return looked * (run >= self.patience), run, looked

    def on_progress(self, request, state):
        signals = request.signals.get(WINDOW_KEY)
        if not signals:
            return None
        stop, run, looked = self.rule(request.generated, signals["entropy"], self._confident.get(request.rid, 0))
        if not looked:
            return None
        self._confident[request.rid] = run
        return Action.stop("early_exit", score=True) if stop else None

    def progress_stops(self, checkpoints):
        # The rule stops at the end of `patience` confident checks in a row, and any such run holds one of every
        # response's patience-th checkpoints: the signals are read there, and around the confident ones only.
        flat, p = checkpoints.flat(), self.patience
        sampled, rows = flat.every(p)
        confident = self._confident_at(flat, sampled, rows)
        candidates, row = sampled[confident], rows[confident][:, None]
        window = candidates[:, None] + np.arange(1 - p, p)  # the checks of every run that holds a candidate
        inside = (window >= flat.starts[row]) & (window < flat.starts[row + 1])
        confident = np.zeros(window.shape, bool)
        confident[inside] = self._confident_at(flat, window[inside], np.broadcast_to(row, window.shape)[inside])
        in_a_row = np.zeros((len(window), 2 * p), np.int64)
        np.cumsum(confident, axis=1, out=in_a_row[:, 1:])
        ends = in_a_row[:, p:] - in_a_row[:, :p] == p  # the run of p ending at each check from the candidate on
        stop = candidates + ends.argmax(axis=1)
        hit = np.zeros(flat.starts[-1], bool)
        hit[stop[ends.any(axis=1)]] = True
        _, at = flat.first_hits(hit)
        return ProgressStops.of(at, np.where(at >= 0, "early_exit", "").astype(object), score=True)

    def _confident_at(self, flat, index: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """Whether the rule counts the checkpoints at `index` (of Checkpoints.flat, rows `rows`) as confident."""
        generated = flat.generated_at(index, rows)
        signals, has = flat.points.windows(rows, generated, ("entropy",))  # the one signal the rule reads
        return has & self.checks(generated, signals["entropy"])[1]

    def on_finish(self, request, state):
        self._confident.pop(request.rid, None)

    def on_finishes(self, ended, state):
        if self._confident:  # the batch route keeps no counters of its own here
            for rid in ended.rid.tolist():
                self._confident.pop(rid, None)
