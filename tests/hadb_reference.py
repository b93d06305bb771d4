"""hadb as it was before its scoreboard became arrays (policies/hadb.py at commit 501bb37: dicts and a list of
GroupSpec): the reference tests/test_policies.py holds the array version to, frame for frame."""
from __future__ import annotations

import numpy as np

from lssim.loop.core import GroupSpec
from lssim.loop.policy import Policy
from lssim.loop.rewards import RewardScale


class HADBReference(Policy):
    name = "hadb"

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
        self.score: dict[int, float] = {}  # prompt -> EMA of log(response length)
        self.zero_streak: dict[int, int] = {}  # prompt -> consecutive all-zero-reward groups
        self._chunks: list[tuple[str, list[int]]] = []  # this epoch's remaining steps: (bucket, prompts)
        self._long: set[int] = set()
        self._scale = RewardScale()  # the run's, from each step's context

    # -- deciding ----------------------------------------------------------------------------------
    def plan(self, ctx, proposal):
        self._scale = ctx.reward_scale
        if not self._chunks and len(self.score) < self.warmup_fraction * len(ctx.pool):
            return proposal
        if not self._chunks:
            self._new_epoch(ctx)
        bucket, prompts = self._chunks.pop()
        prompts = prompts[: max(0, ctx.groups_left - ctx.carried_groups)]
        budget_cut = int(ctx.max_tokens * self.long_zero_budget)
        return [GroupSpec(pid, ctx.group_size,
                          budget_cut if pid in self._long and self.zero_streak.get(pid, 0) >= self.zero_reward_groups else ctx.max_tokens)
                for pid in prompts]

    def _new_epoch(self, ctx) -> None:
        pool = np.asarray(ctx.pool.prompt_id)[ctx.rng.permutation(len(ctx.pool.prompt_id))]
        scores = np.array([self.score.get(p, np.nan) for p in pool.tolist()])  # NaN: never seen
        seen = ~np.isnan(scores)
        known, scores, unknown = pool[seen], scores[seen], pool[~seen].tolist()
        n = ctx.groups_per_step
        chunks: list[tuple[str, list[int]]] = []
        self._long = set()
        if len(known):
            lo, hi = np.quantile(scores, [self.short_quantile, self.long_quantile])
            long = known[scores > hi].tolist()
            self._long = set(long)
            for name, members, factor in (("short", known[scores <= lo].tolist(), self.short_batch_factor),
                                          ("medium", known[(lo < scores) & (scores <= hi)].tolist(), 1.0),
                                          ("long", long, self.long_batch_factor)):
                size = max(1, round(n * factor))
                chunks += [(name, members[i:i + size]) for i in range(0, len(members), size)]
        chunks += [("unknown", unknown[i:i + n]) for i in range(0, len(unknown), n)]
        # Unknown prompts go first (they teach the scoreboard); the known chunks in a seeded random order.
        known_chunks = [c for c in chunks if c[0] != "unknown"]
        shuffled = [known_chunks[i] for i in ctx.rng.permutation(len(known_chunks))]
        self._chunks = list(reversed([c for c in chunks if c[0] == "unknown"] + shuffled))  # popped from the end

    # -- remembering -------------------------------------------------------------------------------
    def end_step(self, outcome):
        if len(outcome.prompt_id) == 0:
            return
        order = np.argsort(outcome.prompt_id, kind="stable")
        pids = outcome.prompt_id[order]
        logs = np.log(np.maximum(outcome.response_len[order], 1))
        rewards = outcome.reward[order]
        starts = np.flatnonzero(np.r_[True, pids[1:] != pids[:-1]])
        mean_log = np.add.reduceat(logs, starts) / np.diff(np.r_[starts, len(pids)])
        any_reward = np.maximum.reduceat(self._scale.correct(rewards), starts)
        for pid, m, hit in zip(pids[starts].tolist(), mean_log.tolist(), any_reward.tolist()):
            old = self.score.get(pid)
            self.score[pid] = m if old is None else self.ema * m + (1 - self.ema) * old
            self.zero_streak[pid] = 0 if hit else self.zero_streak.get(pid, 0) + 1

