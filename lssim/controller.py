"""The rollout controller: runs synchronous RL steps, asks the policy, commands an engine.

Written once for both worlds. It sees an `Engine` (simulated or vLLM), a `Trainer` (a time model or a
torch GRPO trainer) and a `PromptSource` (a trace's prompts or a task's dataset); it never learns which.

A step: plan the groups (carried responses first), submit, react to events until the rollout ends,
settle what is still running (carry or drop), train on the finished groups, let the policy remember.
The books balance at every step: every response that entered the step ended in it or was carried out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable, Protocol

import numpy as np
import pandas as pd

from .core import (ABORT, FINISHED, LENGTH, POLICY_STOP, STOP, Engine, Group, GroupSpec, PromptPool, Request, RolloutState, StepContext, Trainer,
                   off_policy_tokens)
from .policy import CARRY, Policy, StepOutcome


class PromptSource(Protocol):
    """Where prompts come from: the trace's own prompts (simulator) or a task's dataset (real)."""

    pool: PromptPool

    def default_groups(self, step: int, n_groups: int, group_size: int, max_tokens: int) -> list[GroupSpec]:
        """What a policy with no opinion trains on at `step` (verl's default: a random batch).

        The controller asks for each step's batch once, steps in increasing order, always with the run's
        `groups_per_step`, and uses a prefix of it (see `Controller._take`)."""
        ...

    def prompt_len(self, prompt_id: int) -> int: ...


@dataclass(slots=True)
class RunConfig:
    """The RL run's shape. A run ends after `steps` steps or once `total_groups` groups have trained."""

    steps: int
    groups_per_step: int
    group_size: int
    max_tokens: int
    total_groups: int | None = None  # default: steps * groups_per_step (the same data for every policy)
    seed: int = 0

    def __post_init__(self):
        for name in ("steps", "groups_per_step", "group_size", "max_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"RunConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.total_groups is None:
            self.total_groups = self.steps * self.groups_per_step


# Lower bound of a step's rollout time, given its responses' prompt lengths, context at the start of
# the step (prompt + tokens carried in) and tokens generated in the step. See lssim.bounds.
LowerBound = Callable[[np.ndarray, np.ndarray, np.ndarray], float]


@dataclass
class RunResult:
    """Everything a run produced, as pandas frames (one row per response, one row per step)."""

    policy: str
    responses: pd.DataFrame
    steps: pd.DataFrame
    meta: dict = field(default_factory=dict)


class Controller:
    def __init__(self, engine: Engine, trainer: Trainer, prompts: PromptSource, policy: Policy, config: RunConfig,
                 lower_bound: LowerBound | None = None, oracle_length=None, on_step: Callable[[dict], None] | None = None):
        self.engine, self.trainer, self.prompts, self.policy, self.config = engine, trainer, prompts, policy, config
        self.lower_bound = lower_bound
        self.oracle_length = oracle_length
        self.on_step = on_step  # called with each step's row as it completes (progress bars, recorders)
        self.rng = np.random.default_rng(config.seed)
        self.policy_rng = np.random.default_rng([config.seed, 1])
        self._next_rid = 0
        self._next_group = 0
        self._carried: list[Request] = []  # unfinished responses waiting for the next step
        self._waiting_groups: dict[int, list[Request]] = {}  # carried groups: every member, ended or not
        self._batches: dict[int, list[GroupSpec]] = {}  # the data loader's batches fetched so far, by step
        self._cursor = (0, 0)  # (batch, offset) of the next group the data loader gives
        self._pending_rows: dict[int, int] = {}  # rid -> its response row, for members of groups not yet settled
        self._rows: dict[str, list] = {k: [] for k in RESPONSE_COLUMNS}
        self._step_rows: list[dict] = []
        self.groups_trained = 0
        # Skip hooks nobody overrides: the simulator's hot path runs these checks per event.
        self._asks = {h: policy.overrides(h) for h in ("priority", "place", "on_progress", "on_finish", "end_rollout", "top_up", "on_unfinished")}
        engine.set_progress_interval(policy.progress_interval if self._asks["on_progress"] else None)
        # Execution features are set once per run, before the first step (vLLM configures them at start); an
        # engine that cannot speculate refuses a policy that asks (lssim.core.Engine.set_speculation).
        engine.set_speculation(policy.needs().speculation)

    # -- the run -----------------------------------------------------------------------------------
    def run(self, progress: Callable[[Iterable[int]], Iterable[int]] | None = None) -> RunResult:
        steps = range(self.config.steps)
        for step in progress(steps) if progress else steps:
            # Done once enough groups trained, but not while responses are carried: those run to their end
            # first (steps with no fresh groups), so nothing is left hanging. `steps` bounds it all.
            if self.groups_trained >= self.config.total_groups and not self._carried:
                break
            self.run_step(step)
        return self.result()

    def result(self) -> RunResult:
        responses = pd.DataFrame(self._rows)
        steps = pd.DataFrame(self._step_rows)
        return RunResult(self.policy.name, responses, steps, meta={"policy": repr(self.policy), "seed": self.config.seed})

    def run_step(self, step: int) -> dict:
        cfg, policy, engine = self.config, self.policy, self.engine
        t0 = engine.now()
        busy_start = self._busy()
        state = RolloutState(step=step, started=t0, now=t0)
        self._group_members: dict[int, list[Request]] = {}
        self._samples_planned: dict[int, int] = {}  # prompt -> samples planned this step (keeps sample_idx unique)
        self._group_open: dict[int, int] = {}  # members of each group not yet ended
        self._ctx_at_start: dict[int, int] = {}
        carried_in = self._carried
        self._carried = []
        for gid, members in self._waiting_groups.items():
            self._group_members[gid] = members
            self._group_open[gid] = sum(not m.done for m in members)
        self._waiting_groups = {}
        for r in carried_in:
            self._ctx_at_start[r.rid] = r.prompt_len + r.generated
            r.tokens_before_resume = r.generated
            if r.generated == 0:  # it never started: its first token comes from this step's weights
                r.first_version = step
        groups_left = cfg.total_groups - self.groups_trained
        ctx = StepContext(step=step, groups_per_step=cfg.groups_per_step, group_size=cfg.group_size, max_tokens=cfg.max_tokens,
                          groups_left=groups_left, carried_groups=len(self._group_members), pool=self.prompts.pool,
                          rng=self.policy_rng, oracle_length=self.oracle_length, draw=lambda n: self._take(int(n)))
        n_default = max(0, min(cfg.groups_per_step - ctx.carried_groups, groups_left - ctx.carried_groups))
        self._cursor = max(self._cursor, (step, 0))  # a step's proposal starts at its own batch (or past what was drawn)
        proposal = self._take(n_default)
        plan = policy.plan(ctx, proposal)
        fresh = self._make_requests(plan, step)
        state.groups_submitted = len(self._group_members)
        self._submit(carried_in + fresh, state)

        self._in_flight = {r.rid: r for r in carried_in}
        self._in_flight.update((r.rid, r) for r in fresh)
        state.requests_in_flight = len(self._in_flight)
        self._ended_this_step: list[Request] = []
        self._topped_up: list[Request] = []
        self._rollout(state)
        carried_out = self._settle_unfinished(state)
        rollout_end = engine.now()
        busy_end = self._busy()
        for r in self._ended_this_step + carried_out:
            r.last_version = step

        done_groups = [Group(self._group_members[g][0].prompt_id, self._group_members[g][0].step, self._group_members[g])
                       for g in self._group_members if all(r.done for r in self._group_members[g])]
        for gid, members in self._group_members.items():
            if not all(r.done for r in members):
                self._waiting_groups[gid] = members
        trained = policy.select(done_groups, step)
        train_metrics = self.trainer.train(trained, step) if trained else {}
        self.groups_trained += len(trained)
        step_end = engine.now()

        trained_ids = {r.rid for g in trained for r in g.requests}  # rids: select may train on reshaped copies
        for g in done_groups:  # members that ended in earlier steps are settled now: trained, or never
            for r in g.requests:
                idx = self._pending_rows.pop(r.rid, None)
                if idx is not None and r.rid in trained_ids:
                    self._rows["trained"][idx] = True
                    self._rows["train_step"][idx] = step
                    self._rows["off_policy_tokens"][idx] = off_policy_tokens(r, step)
        row = self._record_step(step, t0, rollout_end, step_end, carried_in, fresh, carried_out, trained, train_metrics, trained_ids,
                                (busy_end[0] - busy_start[0], busy_end[1] - busy_start[1]))
        policy.end_step(self._outcome(step, rollout_end - t0, trained))
        if self.on_step:
            self.on_step(row)
        return row

    # -- the rollout phase -------------------------------------------------------------------------
    def _rollout(self, state: RolloutState) -> None:
        engine, policy, asks = self.engine, self.policy, self._asks
        while True:
            events = engine.next_events()
            if not events:
                more = policy.top_up(state) if asks["top_up"] else []
                if not more:
                    return
                self._submit_more(more, state)
                continue
            for ev in events:
                r = ev.request
                if r.rid not in self._in_flight:
                    continue  # a stale event for a request the controller already ended
                if ev.kind == FINISHED:
                    self._end(r, state)
                    if asks["on_finish"]:
                        policy.on_finish(r, state)
                elif asks["on_progress"]:
                    action = policy.on_progress(r, state)
                    if action is not None:
                        self._act(r, action, state)
            state.now = events[-1].time
            if asks["end_rollout"] and self._in_flight and policy.end_rollout(state):
                more = policy.top_up(state) if asks["top_up"] else []
                if not more:
                    return
                self._submit_more(more, state)

    def _act(self, r: Request, action, state: RolloutState) -> None:
        self.engine.abort(r)
        if action.kind == "requeue":  # resume in this step: new priority, maybe another instance
            if action.priority is not None:
                r.priority = action.priority
            r.instance = action.instance
            self._submit([r], state)
            return
        if action.kind == "stop":
            r.finish_reason, r.stop_reason = POLICY_STOP, action.reason
            if action.reward is not None:
                r.reward = action.reward
            self._end(r, state)
            if self._asks["on_finish"]:  # every policy hears of every response that ends during the rollout
                self.policy.on_finish(r, state)
        else:  # carry: pause now, resume next step
            del self._in_flight[r.rid]
            state.requests_in_flight -= 1
            r.stop_reason = action.reason
            self._carried.append(r)

    def _end(self, r: Request, state: RolloutState) -> None:
        del self._in_flight[r.rid]
        state.requests_in_flight -= 1
        state.responses_done += 1
        self._ended_this_step.append(r)
        self._group_open[r.group_id] -= 1
        if self._group_open[r.group_id] == 0:
            state.groups_done += 1
            rewards = [m.reward for m in self._group_members[r.group_id]]
            if len(rewards) > 1 and max(rewards) - min(rewards) > 0:  # NaN-safe: a NaN comparison is False
                state.groups_effective += 1

    def _settle_unfinished(self, state: RolloutState) -> list[Request]:
        """The rollout ended with requests still running: each is carried or dropped, never lost."""
        carried = list(self._carried)
        for r in list(self._in_flight.values()):
            self.engine.abort(r)
            if self._asks["on_unfinished"] and self.policy.on_unfinished(r) == CARRY:
                del self._in_flight[r.rid]
                state.requests_in_flight -= 1
                carried.append(r)
            else:
                r.finish_reason, r.stop_reason = ABORT, r.stop_reason or "rollout ended"
                self._end(r, state)
        self._carried = carried
        return carried

    # -- the data loader ---------------------------------------------------------------------------
    def _take(self, n: int) -> list[GroupSpec]:
        """The next n groups of the data loader: the rest of the current step's batch, then the next batches.
        Each batch is fetched once, in step order, so a source that is itself a cursor sees a plain stream."""
        out: list[GroupSpec] = []
        k, i = self._cursor
        while len(out) < n:
            batch = self._batch(k)
            if not batch:
                break
            if i >= len(batch):
                k, i = k + 1, 0
                continue
            taken = batch[i:i + n - len(out)]
            out.extend(taken)
            i += len(taken)
        self._cursor = (k, i)
        return out

    def _batch(self, k: int) -> list[GroupSpec]:
        batch = self._batches.get(k)
        if batch is None:
            cfg = self.config
            batch = self._batches[k] = self.prompts.default_groups(k, cfg.groups_per_step, cfg.group_size, cfg.max_tokens)
            for old in [j for j in self._batches if j < k - 1]:
                del self._batches[old]
        return batch

    # -- requests ----------------------------------------------------------------------------------
    def _make_requests(self, plan: list[GroupSpec], step: int) -> list[Request]:
        requests = []
        used = self._samples_planned  # samples of a prompt already planned this step (top-ups included): unique keys
        seeds = iter(self.rng.integers(2**31, size=sum(g.n_samples for g in plan)).tolist())
        for g in plan:
            gid = self._next_group
            self._next_group += 1
            first = used.get(g.prompt_id, 0)
            used[g.prompt_id] = first + g.n_samples
            prompt_len = self.prompts.prompt_len(g.prompt_id)
            members = []
            for k in range(g.n_samples):
                r = Request(rid=self._next_rid, group_id=gid, step=step, prompt_id=g.prompt_id, sample_idx=first + k,
                            prompt_len=prompt_len, max_tokens=g.max_tokens, priority=g.priority, instance=g.instance,
                            seed=next(seeds), first_version=step)
                self._next_rid += 1
                self._ctx_at_start[r.rid] = prompt_len
                members.append(r)
            self._group_members[gid] = members
            self._group_open[gid] = len(members)
            requests.extend(members)
        return requests

    def _submit(self, requests: list[Request], state: RolloutState) -> None:
        if self._asks["priority"]:
            for r in requests:
                choice = self.policy.priority(r)
                if choice is not None:
                    r.priority = choice
            requests = sorted(requests, key=lambda r: r.priority)  # placed and queued in priority order
        if self._asks["place"]:
            loads = self.engine.loads()
            for r in requests:
                choice = self.policy.place(r, loads)
                if choice is not None:
                    r.instance = choice
        self.engine.submit(requests)

    def _submit_more(self, more: list[GroupSpec], state: RolloutState) -> None:
        fresh = self._make_requests(more, state.step)
        self._topped_up.extend(fresh)
        state.groups_submitted += len(more)
        state.extra_rounds += 1
        self._in_flight.update((r.rid, r) for r in fresh)
        state.requests_in_flight += len(fresh)
        self._submit(fresh, state)

    # -- records -----------------------------------------------------------------------------------
    def _record_step(self, step, t0, rollout_end, step_end, carried_in, fresh, carried_out, trained, train_metrics, trained_ids,
                     busy) -> dict:
        extra = self._topped_up
        ended = self._ended_this_step
        rows = self._rows
        cf = [self.engine.counterfactual(r) for r in ended]
        cf = [(-1, float("nan")) if c is None else c for c in cf]  # None: the engine cannot tell
        trained_now = [r.rid in trained_ids for r in ended]
        first_row = len(rows["step"])
        for i, r in enumerate(ended):  # ended, but its group is still open: settled in a later step
            if r.group_id in self._waiting_groups:
                self._pending_rows[r.rid] = first_row + i
        # Column by column: one list comprehension per field is several times faster than a dict per row.
        for col, values in (
            ("step", [r.step for r in ended]), ("end_step", [step] * len(ended)), ("prompt_id", [r.prompt_id for r in ended]),
            ("sample_idx", [r.sample_idx for r in ended]), ("group_id", [r.group_id for r in ended]),
            ("prompt_len", [r.prompt_len for r in ended]), ("response_len", [r.generated for r in ended]),
            ("max_tokens", [r.max_tokens for r in ended]), ("reward", [r.reward for r in ended]),
            ("finish_reason", [r.finish_reason for r in ended]), ("stop_reason", [r.stop_reason for r in ended]),
            ("policy_version_first", [r.first_version for r in ended]), ("policy_version_last", [r.last_version for r in ended]),
            ("tokens_before_resume", [r.tokens_before_resume for r in ended]),
            ("instance", [-1 if r.instance is None else r.instance for r in ended]),
            ("submit_time", [r.submit_time - t0 for r in ended]), ("first_token_time", [r.first_token_time - t0 for r in ended]),
            ("finish_time", [r.finish_time - t0 for r in ended]), ("exact", [r.exact for r in ended]),
            ("trained", trained_now), ("train_step", [step if t else -1 for t in trained_now]),
            ("off_policy_tokens", [off_policy_tokens(r, step) for r in ended]),
            ("natural_len", [c[0] for c in cf]), ("natural_reward", [c[1] for c in cf]),
        ):
            rows[col].extend(values)
        # Tokens generated in this step, per response that ran in it (ended or carried out).
        ran = ended + carried_out
        ctx0 = np.array([self._ctx_at_start[r.rid] for r in ran], dtype=np.int64)
        ctx1 = np.array([r.prompt_len + r.generated for r in ran], dtype=np.int64)
        step_tokens = ctx1 - ctx0
        prompt_lens = np.array([r.prompt_len for r in ran], dtype=np.int64)
        finish = np.array([r.finish_time - t0 for r in ended if r.finish_reason in (STOP, LENGTH)], dtype=float)
        reasons = [r.finish_reason for r in ended]
        rollout_s = rollout_end - t0
        bound = self.lower_bound(prompt_lens, ctx0, step_tokens) if self.lower_bound and len(ran) else float("nan")
        # Off-policy share of what trains now: tokens generated under weights older than this step's.
        trained_requests = [r for g in trained for r in g.requests]
        off_policy = sum(off_policy_tokens(r, step) for r in trained_requests)
        trained_tokens = sum(r.generated for r in trained_requests)
        row = {
            "step": step,
            "rollout_seconds": rollout_s,
            "train_seconds": step_end - rollout_end,
            "step_seconds": step_end - t0,
            "tokens": int(step_tokens.sum()),
            "tokens_per_second": float(step_tokens.sum()) / rollout_s if rollout_s > 0 else float("nan"),
            "responses_in": len(carried_in) + len(fresh) + len(extra),
            "carried_in": len(carried_in),
            "finished": reasons.count(STOP),
            "truncated": reasons.count(LENGTH),
            "policy_stopped": reasons.count(POLICY_STOP),
            "dropped": reasons.count(ABORT),
            "carried_out": len(carried_out),
            "groups_trained": len(trained),
            "effective_groups": sum(g.has_signal for g in trained),
            "lower_bound_seconds": bound,
            "lower_bound_efficiency": bound / rollout_s if rollout_s > 0 else float("nan"),
            "long_tail_ratio": float(finish.max() / np.median(finish)) if len(finish) and np.median(finish) > 0 else float("nan"),
            "off_policy_token_fraction": off_policy / trained_tokens if trained_tokens else 0.0,
            "exact_fraction": float(np.mean([r.exact for r in ended])) if ended else float("nan"),
            "mean_reward": float(np.nanmean([r.reward for g in trained for r in g.requests])) if trained else float("nan"),
        }
        busy, seq_seconds = busy
        row["busy_fraction"] = busy / (self.engine.n_instances * rollout_s) if rollout_s > 0 else float("nan")
        row["mean_running"] = seq_seconds / (self.engine.n_instances * rollout_s) if rollout_s > 0 else float("nan")
        row.update({f"trainer_{k}": v for k, v in train_metrics.items()})
        self._step_rows.append(row)
        return row

    def _busy(self) -> tuple[float, float]:
        return self.engine.utilization()

    def _outcome(self, step: int, rollout_seconds: float, trained: list[Group]) -> StepOutcome:
        ended = self._ended_this_step
        return StepOutcome(
            step=step,
            prompt_id=np.array([r.prompt_id for r in ended], dtype=np.int64),
            sample_idx=np.array([r.sample_idx for r in ended], dtype=np.int64),
            response_len=np.array([r.generated for r in ended], dtype=np.int64),
            max_tokens=np.array([r.max_tokens for r in ended], dtype=np.int64),
            reward=np.array([r.reward for r in ended], dtype=float),
            finish_reason=np.array([r.finish_reason for r in ended], dtype=object),
            rollout_seconds=rollout_seconds,
            trained_prompt_ids=np.array([g.prompt_id for g in trained], dtype=np.int64),
        )


RESPONSE_COLUMNS = ("step", "end_step", "prompt_id", "sample_idx", "group_id", "prompt_len", "response_len", "max_tokens",
                    "reward", "finish_reason", "stop_reason", "policy_version_first", "policy_version_last",
                    "tokens_before_resume", "instance", "submit_time", "first_token_time", "finish_time", "exact", "trained",
                    "train_step", "off_policy_tokens", "natural_len", "natural_reward")
# trained / train_step: whether (and in which step) the response's group went to training; a member that ended
#   before its group completed is settled when the group is (partial rollouts), so its row is updated then.
# off_policy_tokens: its leading tokens generated under weights older than those of the step that trained it
#   (lssim.core.off_policy_tokens; for a response never trained, relative to the step it ended in).
# natural_len / natural_reward: what the response would have been had no policy stopped it (the simulator's
#   Workload at its budget; -1 / NaN where the engine cannot tell, as on vLLM: Engine.counterfactual).
