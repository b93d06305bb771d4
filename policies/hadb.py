"""hadb -- History-Aware Dynamic Batching (seed plan §1.1; history as in RhymeRL).

Rule:
- Scoreboard: for each prompt, an exponential average of the log of its responses' lengths, and how
  many of its latest groups in a row had zero reward everywhere.
- Warm-up: until the scoreboard knows `warmup_fraction` of the pool, take the proposal unchanged
  (the baseline's random batch: nothing to bucket by yet).
- Each epoch (a pass over the prompt pool), prompts with a score are split into buckets by predicted
  length: short (below the `short_quantile` of scores), long (above `long_quantile`), medium between;
  prompts never seen form their own "unknown" chunks, sampled at random as the baseline would.
- A step draws its prompts from ONE bucket, so a step's responses are of similar length: short steps
  take `short_batch_factor` x the nominal number of groups (filling the engine), long steps
  `long_batch_factor` x. The order of the epoch's chunks is shuffled by the run's seed.
- Adaptive truncation: a long-bucket prompt whose last `zero_reward_groups` groups had no correct response
  (none in the upper half of the run's reward range, lssim.loop.rewards: all zero for 0/1 rewards) gets
  `max_tokens * long_zero_budget` instead of the full budget (long and hopeless: stop early).

Because bucketed sampling changes which prompts meet at a step, replaying a trace under HADB asks the
Workload for (step, prompt) pairs the trace did not record: the result's exact fraction says how much.
Every prompt is still visited once per epoch, so the training data is the baseline's, reordered.
"""

from __future__ import annotations

import math

import numpy as np

from lssim.loop.columns import runs, stable_argsort
from lssim.loop.core import GroupSpecs
from lssim.loop.policy import Policy
from lssim.loop.rewards import RewardScale


class HADB(Policy):
    name = "hadb"
    _epochs, _warmup = 0, (0, 0)  # (instances set their own; a checkpoint from before they were kept reads these)

    def __init__(self, short_quantile: float = 0.5, long_quantile: float = 0.85, short_batch_factor: float = 2.0,
                 long_batch_factor: float = 1.0, ema: float = 0.5, zero_reward_groups: int = 2, long_zero_budget: float = 0.5,
                 warmup_fraction: float = 0.9):
        if not 0.0 < short_quantile <= long_quantile < 1.0:
            raise ValueError(f"hadb: need 0 < short_quantile <= long_quantile < 1, got {short_quantile}, {long_quantile}")
        if short_batch_factor <= 0 or long_batch_factor <= 0:
            raise ValueError("hadb: batch factors must be > 0")
        if not 0.0 < ema <= 1.0 or not 0.0 < long_zero_budget <= 1.0:
            raise ValueError("hadb: ema and long_zero_budget must be in (0, 1]")
        self.short_quantile, self.long_quantile = short_quantile, long_quantile
        self.short_batch_factor, self.long_batch_factor = short_batch_factor, long_batch_factor
        self.ema, self.zero_reward_groups, self.long_zero_budget = ema, zero_reward_groups, long_zero_budget
        self.warmup_fraction = warmup_fraction
        # The scoreboard, one slot per prompt (ids sorted): EMA of log(response length) (NaN: never seen), and the
        # consecutive all-zero-reward groups. Arrays, so a step's scores are updated and read without a loop.
        self._ids = np.zeros(0, np.int64)
        self._score = np.zeros(0)
        self._streak = np.zeros(0, np.int64)
        self._long = np.zeros(0, bool)  # this epoch's long bucket
        self._chunks: list[tuple] = []  # this epoch's remaining steps: (bucket, prompts, their slots, board size)
        self._scale = RewardScale()  # the run's, from each step's context
        self._epochs = 0  # epochs bucketed (0: still in its warm-up)
        self._warmup = (0, 0)  # (prompts known, the pool's size) at the last step of its warm-up

    @property
    def score(self) -> dict[int, float]:
        """prompt -> EMA of log(response length), for the prompts seen."""
        seen = ~np.isnan(self._score)
        return dict(zip(self._ids[seen].tolist(), self._score[seen].tolist()))

    @property
    def zero_streak(self) -> dict[int, int]:
        """prompt -> consecutive groups with no correct response, for the prompts seen."""
        seen = ~np.isnan(self._score)
        return dict(zip(self._ids[seen].tolist(), self._streak[seen].tolist()))

    def _slots(self, prompt_ids: np.ndarray) -> np.ndarray:
        """Each prompt's slot on the scoreboard, made for prompts it has none for yet."""
        at = np.searchsorted(self._ids, prompt_ids)
        inside = at < len(self._ids)
        if not inside.all() or (self._ids[at[inside]] != prompt_ids[inside]).any():
            ids = np.union1d(self._ids, prompt_ids)
            old = np.searchsorted(ids, self._ids)
            score, streak, long = np.full(len(ids), np.nan), np.zeros(len(ids), np.int64), np.zeros(len(ids), bool)
            score[old], streak[old], long[old] = self._score, self._streak, self._long
            self._ids, self._score, self._streak, self._long = ids, score, streak, long
            at = np.searchsorted(ids, prompt_ids)
        return at

    # -- deciding ----------------------------------------------------------------------------------
    def plan(self, ctx, proposal):
        self._scale = ctx.reward_scale
        if not self._chunks:  # a new epoch, once the scoreboard knows enough of the pool
            known = int(np.count_nonzero(~np.isnan(self._score)))
            if known < self.warmup_fraction * len(ctx.pool):
                self._warmup = (known, len(ctx.pool))
                return proposal
            self._new_epoch(ctx)
            self._epochs += 1
        bucket, prompts, slots, board = self._chunks.pop()
        take = max(0, ctx.groups_left - ctx.carried_groups)
        prompts, slots = prompts[:take], slots[:take]
        if board != len(self._ids):  # the scoreboard grew since the epoch began: the slots moved
            slots = self._slots(prompts)
        hopeless = self._long[slots] & (self._streak[slots] >= self.zero_reward_groups)
        budgets = np.where(hopeless, max(1, int(ctx.max_tokens * self.long_zero_budget)), ctx.max_tokens)
        return GroupSpecs(prompts, np.full(len(prompts), ctx.group_size, np.int64), budgets.astype(np.int64))

    def _new_epoch(self, ctx) -> None:
        pool = np.asarray(ctx.pool.prompt_id, np.int64)[ctx.rng.permutation(len(ctx.pool.prompt_id))]
        slots = self._slots(pool)  # (first: it may grow the scoreboard)
        scores = self._score[slots]  # NaN: never seen
        seen = ~np.isnan(scores)
        known, known_slots, scores = pool[seen], slots[seen], scores[seen]
        n = ctx.groups_per_step
        chunks: list[tuple[str, np.ndarray, np.ndarray]] = []  # (bucket, prompts, their slots)
        self._long[:] = False
        if len(known):
            lo, hi = np.quantile(scores, [self.short_quantile, self.long_quantile])
            self._long[known_slots[scores > hi]] = True
            for name, mask, factor in (("short", scores <= lo, self.short_batch_factor),
                                       ("medium", (lo < scores) & (scores <= hi), 1.0),
                                       ("long", scores > hi, self.long_batch_factor)):
                members, member_slots = known[mask], known_slots[mask]
                size = max(1, round(n * factor))
                chunks += [(name, members[i:i + size], member_slots[i:i + size]) for i in range(0, len(members), size)]
        unknown, unknown_slots = pool[~seen], slots[~seen]
        chunks += [("unknown", unknown[i:i + n], unknown_slots[i:i + n]) for i in range(0, len(unknown), n)]
        # Unknown prompts go first (they teach the scoreboard); the known chunks in a seeded random order.
        known_chunks = [c for c in chunks if c[0] != "unknown"]
        shuffled = [known_chunks[i] for i in ctx.rng.permutation(len(known_chunks))]
        ordered = reversed([c for c in chunks if c[0] == "unknown"] + shuffled)  # popped from the end
        board = len(self._ids)  # the scoreboard's size the slots hold for (the whole pool is on it now)
        self._chunks = [(name, members, member_slots, board) for name, members, member_slots in ordered]

    def ran_blind(self):
        if self._epochs or self._chunks:
            return None
        known, pool = self._warmup
        return (f"never left its warm-up: at its last step it knew {known:,} of the pool's {pool:,} prompts and buckets "
                f"once it knows {self.warmup_fraction:.0%} of them, so every step took the baseline's batch (a run "
                "shorter than a pass over the pool, or prompts that never recur)")

    # -- remembering -------------------------------------------------------------------------------
    def end_step(self, outcome):
        if len(outcome.prompt_id) == 0:
            return
        order = stable_argsort(outcome.prompt_id)
        pids = outcome.prompt_id[order]
        logs = np.log(np.maximum(outcome.response_len[order], 1))
        rewards = outcome.reward[order]
        starts, sizes = runs(pids)
        mean_log = np.add.reduceat(logs, starts) / sizes
        any_reward = np.maximum.reduceat(self._scale.correct(rewards), starts).astype(bool)
        slots = self._slots(pids[starts])
        old = self._score[slots]
        self._score[slots] = np.where(np.isnan(old), mean_log, self.ema * mean_log + (1 - self.ema) * old)
        self._streak[slots] = np.where(any_reward, 0, self._streak[slots] + 1)

    def predicted_length(self, prompt_id: int) -> float | None:
        """The scoreboard's length estimate for a prompt (None if never seen); other policies may use it."""
        at = int(np.searchsorted(self._ids, prompt_id))
        if at == len(self._ids) or self._ids[at] != prompt_id or np.isnan(self._score[at]):
            return None
        return math.exp(self._score[at])
