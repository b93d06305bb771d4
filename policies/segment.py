"""segment -- elastic segment rollout (UloRL, Du et al. 2025, arXiv 2507.19766; T-PPO, arXiv 2506.15050;
seed plan §3.1).

Source: UloRL decodes ultra-long outputs in segments of a fixed number of tokens per step: responses that
finish within the segment train now, the others are set aside and continue in the next step, so no step
waits for the longest response (2.06x faster training with 4 segments on Qwen3-30B-A3B). T-PPO likewise
bounds each step's generation and trains on what is finished. The seed plan's "elastic" twist (§3.1): a
fixed cut wastes a step on a response that would have ended a few tokens later, so a response predicted to
finish soon gets its window extended instead of being cut; only the ones predicted long are cut.

Rule:
- Window: each step a response generates at most `window` tokens (counted from where it started or resumed
  in the step), checked at progress checkpoints every `window / checks` tokens.
- Once past its window, the remaining length is predicted from history (lssim.history: the prompt's past
  responses longer than this one so far, what they had left). If it is at most `extend * window`, the window
  is extended, up to `extend * window` tokens more; otherwise, if the history cannot say, or once the
  extension is used up, the response is carried (Action.carry): paused now, resumed next step from where it
  stopped. Its group trains once every member has ended (the controller keeps carried groups open).
- Refill: carried responses keep their groups open, and the controller counts those groups against the
  step's nominal number, so a step would start fewer fresh groups and run a smaller batch. With `refill`,
  the plan tops the proposal up from the data loader (`ctx.draw`) to the nominal number of groups, so
  every step starts a full batch of fresh prompts beside the carried ones (UloRL's pending pool).
- At the end of a rollout cut short by another policy, unfinished responses are carried too.

Staleness: a carried response's tokens come from more than one policy version. The step table's
`off_policy_token_fraction` (tokens generated under weights older than the step that trains them, over the
tokens trained) and the response columns `policy_version_first` / `policy_version_last` /
`off_policy_tokens` report it. UloRL trains such tokens with pseudo-on-policy importance weights; nothing
here corrects them.

Defaults: window=4096 tokens, extend=0.25, checks=4, refill=True, keep=32 (responses remembered per
prompt). Extending trades throughput for staleness: an extended response keeps the step running at a small
batch after the others have stopped (a cut costs nothing in continuous batching, unlike the padding a fixed
cut wastes in static batches, the plan's motivation), and not extending carries more responses.
"""

from __future__ import annotations

from lssim.history import LengthHistory
from lssim.policy import CARRY, Action, Policy


class Segment(Policy):
    name = "segment"

    def __init__(self, window: int = 4096, extend: float = 0.25, checks: int = 4, refill: bool = True, keep: int = 32):
        if not isinstance(window, int) or window < 1:
            raise ValueError(f"segment: window must be an int >= 1, got {window!r}")
        if not isinstance(checks, int) or not 1 <= checks <= window:
            raise ValueError(f"segment: checks must be an int in [1, window], got {checks!r}")
        if extend < 0:
            raise ValueError(f"segment: extend must be >= 0, got {extend}")
        self.window, self.extend, self.checks, self.refill, self.keep = window, extend, checks, refill, keep
        self.progress_interval = max(1, window // checks)
        self.history = LengthHistory(keep)

    def plan(self, ctx, proposal):
        if not self.refill or ctx.draw is None or not ctx.carried_groups:
            return proposal
        room = ctx.groups_left - ctx.carried_groups - len(proposal)
        return proposal + ctx.draw(max(0, min(ctx.groups_per_step - len(proposal), room)))

    def on_progress(self, request, state):
        in_step = request.generated - request.tokens_before_resume  # tokens generated in this step
        if in_step < self.window:
            return None
        if in_step < self.window * (1 + self.extend):
            left = self.history.remaining(request.prompt_id, request.generated)
            if left is not None and left <= self.extend * self.window:
                return None  # predicted to finish soon: extend its window instead of cutting it
        return Action.carry("segment: window")

    def on_unfinished(self, request):
        return CARRY

    def end_step(self, outcome):
        self.history.update(outcome)
