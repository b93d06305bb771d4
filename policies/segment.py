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
- Once past its window, the remaining length is predicted from history (lssim.loop.history: the prompt's past
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

Value bridging (seed plan §3.2, `bridge=True`): without it a carried response's tokens wait, untrained, until its
response and its whole group have ended. With it, each step trains every carried response's new segment (the
tokens it generated since its last trained one) beside the step's groups, with a bootstrapped value standing in
for the reward it has not earned yet. GRPO has no critic, so the value here is a Monte Carlo one: the mean
reward of the prompt's past responses that ran longer than this one has so far (the return of "still going at
this length"), else the same over every prompt's recent responses, else none (that member waits). Not the mean
of its group's ended members: added to the group, that value is the group's mean, so its advantage is exactly 0
and the segment would be computed for nothing. Its
group is offered to the trainer as a copy (`Policy.bridge`): ended members with their rewards give the baseline
only (no loss: not computed), carried members train their segment with advantage (value - group mean) / std.
When the group completes it trains as usual, except that each bridged response's already-trained prefix stays
out of the loss (it is the context of its last segment: still computed). Each token is trained once, and
earlier; what it costs is the forward over each bridged response's prefix again at every step it is bridged
(the step rows: `trainer_bridged_tokens`, `trainer_bridged_sequences`). The seed's deferred update (re-training
segment t once segment t+1 begins) is not done: a bridged segment keeps the value it was trained with.

Defaults: window=4096 tokens, extend=0.25, checks=4, refill=True, keep=32 (responses remembered per
prompt), bridge=False. Extending trades throughput for staleness: an extended response keeps the step running at a small
batch after the others have stopped (a cut costs nothing in continuous batching, unlike the padding a fixed
cut wastes in static batches, the plan's motivation), and not extending carries more responses.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import replace

import numpy as np

from lssim.loop.core import LENGTH, STOP, Group
from lssim.loop.history import LengthHistory
from lssim.loop.policy import CARRY, Action, Policy, ProgressStops, TrainMask

_REASON = "segment: window"  # a carry's stop_reason


class Segment(Policy):
    name = "segment"

    def __init__(self, window: int = 4096, extend: float = 0.25, checks: int = 4, refill: bool = True, keep: int = 32,
                 bridge: bool = False):
        if not isinstance(window, int) or window < 1:
            raise ValueError(f"segment: window must be an int >= 1, got {window!r}")
        if not isinstance(checks, int) or not 1 <= checks <= window:
            raise ValueError(f"segment: checks must be an int in [1, window], got {checks!r}")
        if extend < 0:
            raise ValueError(f"segment: extend must be >= 0, got {extend}")
        if not isinstance(bridge, bool):
            raise ValueError(f"segment: bridge must be a bool, got {bridge!r}")
        self.window, self.extend, self.checks, self.refill, self.keep = window, extend, checks, refill, keep
        self.bridge_values = bridge
        self.progress_interval = max(1, window // checks)
        self.history = LengthHistory(keep)
        self._returns: dict[int, deque] = {}  # prompt -> its latest (length, reward) of responses that ended naturally
        self._all_returns: deque = deque(maxlen=4096)  # the same over every prompt (the value of a prompt never seen)
        self._trained: dict[int, int] = {}  # rid -> response tokens already trained by bridges (its prefix)
        self._segments: dict[int, tuple[int, int] | None] = {}  # this step's bridged rids: (start, end), None: baseline
        self._trained_now: dict[int, int] = {}  # rids whose segment the trainer was asked to train this step

    def overrides(self, hook: str) -> bool:
        if hook in ("bridge", "train_mask") and not self.bridge_values:
            return False  # no opinion on training: runs with any trainer
        return super().overrides(hook)

    def plan(self, ctx, proposal):
        if not self.refill or ctx.draw is None or not ctx.carried_groups:
            return proposal
        room = ctx.groups_left - ctx.carried_groups - len(proposal)
        return proposal + ctx.draw(max(0, min(ctx.groups_per_step - len(proposal), room)))

    def reads_history(self, in_step):
        """Whether the rule asks the history at a checkpoint `in_step` tokens into the step: past the window, within
        its extension (one response's numbers, or elementwise on arrays)."""
        return (in_step >= self.window) * (in_step < self.window * (1 + self.extend))

    def carries(self, in_step, left):
        """The window rule at a checkpoint `in_step` tokens into the step, the history predicting `left` tokens still
        to come (NaN: it cannot say): carry, unless within the window, or within its extension and predicted to finish
        soon. On one response's numbers or elementwise on arrays (on_progress and progress_carries both ask it)."""
        return (in_step >= self.window) * (1 - self.reads_history(in_step) * (left <= self.extend * self.window))

    def on_progress(self, request, state):
        in_step = request.generated - request.tokens_before_resume  # tokens generated in this step
        left = self.history.remaining(request.prompt_id, request.generated) if self.reads_history(in_step) else None
        if not self.carries(in_step, float("nan") if left is None else left):
            return None
        return Action.carry(_REASON)

    def progress_carries(self, checkpoints):
        # A response's first carry is one of its first checkpoints past the window: those within the extension, then
        # the one after it (every one past the extension carries). Only those are read, all at once (the history, read
        # where the rule asks it, moves only in end_step); then each response's first carry.
        flat, requests, interval = checkpoints.flat(), checkpoints.requests, checkpoints.interval
        count, before = np.diff(flat.starts), requests.tokens_before_resume
        past = np.maximum(0, -(-(self.window - (flat.first - before)) // interval))  # its first checkpoint past the window
        read = np.clip(count - past, 0, math.ceil(self.window * self.extend / interval) + 2)  # (one spare)
        rows = np.repeat(np.arange(len(count)), read)
        generated = flat.first[rows] + interval * (past[rows] + np.arange(len(rows)) - np.repeat(np.cumsum(read) - read, read))
        in_step = generated - before[rows]
        asked = np.flatnonzero(self.reads_history(in_step))
        left = np.full(len(in_step), np.nan)
        left[asked] = self.history.remainings(requests.prompt_id[rows[asked]], generated[asked])
        hit = np.flatnonzero(self.carries(in_step, left) > 0)  # in checkpoint order: a response's first comes first
        first = hit[np.r_[True, rows[hit[1:]] != rows[hit[:-1]]]] if len(hit) else hit
        at = np.full(len(checkpoints), -1, np.int64)
        at[rows[first]] = generated[first]
        reason = np.full(len(at), "", object)
        reason[at >= 0] = _REASON
        return ProgressStops.of(at, reason)

    def on_unfinished(self, request):
        return CARRY

    def end_step(self, outcome):
        self.history.update(outcome)
        if self.bridge_values:  # only value bridging reads the returns
            self._remember_returns(outcome)
        self._trained.update(self._trained_now)
        self._trained_now, self._segments = {}, {}

    def _remember_returns(self, outcome) -> None:
        """What `value` reads: each response that ended by itself or by its budget, (length, reward), per prompt and
        over every prompt."""
        natural = np.isin(outcome.finish_reason.astype(str), (STOP, LENGTH)) & np.isfinite(outcome.reward)
        for pid, n, reward in zip(outcome.prompt_id[natural].tolist(), outcome.response_len[natural].tolist(),
                                  outcome.reward[natural].tolist()):
            self._returns.setdefault(pid, deque(maxlen=self.keep)).append((n, reward))
            self._all_returns.append((n, reward))

    # -- value bridging ------------------------------------------------------------------------------------
    def value(self, request) -> float | None:
        """The bootstrapped value of a carried response: the mean reward of its prompt's past responses longer than
        it is now, else of every prompt's recent responses longer than it, else None."""
        for returns in (self._returns.get(request.prompt_id, ()), self._all_returns):
            longer = [reward for n, reward in returns if n > request.generated]
            if longer:
                return sum(longer) / len(longer)
        return None

    def bridge(self, open_groups, step):
        self._segments, out = {}, []
        for g in open_groups:
            members, segments = [], {}
            for r in g.requests:
                start = self._trained.get(r.rid, 0)
                value = None if r.done else self.value(r)
                if r.done:
                    members.append(r)
                    segments[r.rid] = None
                elif value is not None and r.generated > start:
                    members.append(replace(r, reward=value))
                    segments[r.rid] = (start, r.generated)
            if len(members) >= 2 and any(seg is not None for seg in segments.values()):
                out.append(Group(g.prompt_id, g.step, members))
                self._segments.update(segments)
        return out

    def train_mask(self, batch):
        if batch.rid is None:
            raise ValueError("segment(bridge=True) needs each trained sequence's request id (TrainBatch.rid)")
        resp = np.asarray(batch.response_len, np.int64)
        start, end = np.zeros(len(batch), np.int64), resp.copy()
        for i, rid in enumerate(batch.rid.tolist()):
            if rid in self._segments:
                seg = self._segments[rid]
                start[i], end[i] = (0, 0) if seg is None else seg
            else:  # a completed group: each bridged response's trained prefix stays out of the loss
                start[i] = min(self._trained.get(rid, 0), resp[i])
        bridged = [i for i, rid in enumerate(batch.rid.tolist()) if self._segments.get(rid) is not None]
        self._trained_now.update({int(batch.rid[i]): int(end[i]) for i in bridged})
        notes = {"bridged_sequences": len(bridged), "bridged_tokens": int(sum(end[i] - start[i] for i in bridged))}
        if batch.logprobs is None:  # no tokens: the loss covers [start, end), the forward everything up to `end`
            return TrainMask.from_counts(end, end - start, notes)
        keep = []
        for i, n in enumerate(resp.tolist()):
            k = np.zeros(n, bool)
            k[start[i]:end[i]] = True
            keep.append(k & (np.ones(n, bool) if batch.in_loss is None else np.asarray(batch.in_loss[i], bool)))
        return TrainMask.from_keep(keep, compact=True, notes=notes)
