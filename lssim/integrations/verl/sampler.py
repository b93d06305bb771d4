"""`LssimSampler`: verl's v1 custom sampler, driven by an lssim policy, recording an lssim trace.

verl 0.9.1 (PyPI wheel verl-0.9.1, sha256 db6e6f2a8d9d5808...): `verl/trainer/ppo/v1/trainer_base.py`,
`PPOTrainer._build_replay_buffer`, loads `trainer.v1.sampler.custom_sampler.{path,name}` with
`verl.utils.import_utils.load_extern_type` (a file path, or `pkg://module.path`) and builds it with the keyword
arguments `trainer_mode, trainer_config, max_off_policy_threshold, max_off_policy_strategy, sampler_kwargs,
refill_fn`; `_step_once` then calls `sample(global_steps=..., partition_id="train", batch_size=train_batch_size)`
each step (and `_validate` with partition_id="val"), which returns `(KVBatchMeta, metrics)`: the trajectories the
step trains on. The built-in one is `verl/trainer/ppo/v1/replay_buffer.py`, `ReplayBuffer.sample`; this one reads
the same TransferQueue state (`tq.kv_list`: the prompts' status tags and the trajectories' tags) and answers the
same way (`KVBatchMeta(partition_id, keys, tags)`, prompt keys cleared, groups it drops cleared whole).

What the sampler decides -- which is all verl lets it decide -- is when the step's rollout ends and which finished
groups train. It is NOT where prompts, group sizes and budgets are chosen: verl's data loader picks the prompts
(see driver.py and dataset.py for how lssim's policy chooses them anyway), and `refill_fn(n)` only asks verl to
fetch n more rows. Per step, on the train partition:

1. Refill: the groups the policy planned beyond the `train_batch_size` rows verl fetched (`driver.pending`).
2. Wait (polling TransferQueue) until the rollout ends, counting groups as lssim's RolloutState does:
   - sync trainer (`trainer.v1.trainer_mode=sync`): when every registered group has ended. verl sleeps the rollout
     replicas right after `sample` returns, so ending earlier would lose the running requests; a policy's
     end_rollout is not asked.
   - colocate_async: when the policy's `end_rollout(state)` says so (APRIL: once the target groups are done), else
     once `batch_size` groups are done (verl's rule), or when nothing is in flight. verl then aborts the unfinished
     requests and resumes them under the new weights (llm_server.FullyAsyncLLMServerClient): they are carried.
     `max_off_policy_threshold` with strategy "drop" drops finished groups drawn more steps ago than that;
     "wait" holds the step while an in-flight group has reached it (verl's ReplayBufferAsync semantics).
   - when nothing is in flight and the rollout has not ended, the policy's `top_up(state)` may add groups.
3. Select: `policy.select(groups, step)` over the finished groups (lssim Groups of Requests read from the
   trajectories). Groups it leaves out are cleared from TransferQueue (generated, not trained; rewards it reshapes
   are not written back). In colocate_async without a policy opinion on end_rollout or select, the `batch_size`
   oldest finished groups train and the rest wait for the next step, as verl's own sampler does.
4. Record (recorder.py) and tell the policy (`end_step`).

`separate_async` is not supported: its trainer also calls `get_sampleable_count` and `wait_for_sampleable`.
"""

from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass, fields
from typing import Any, Callable, Mapping

from lssim.loop.core import Group, Request, RolloutState

from lssim.integrations.verl.driver import DriverConfig, PolicyDriver, start_run
from lssim.integrations.verl.records import PROMPT_ID_FIELD, VerlResponse, parse_key, responses_from_batch
from lssim.integrations.verl.recorder import TraceRecorder, step_outcome

MODES = ("sync", "colocate_async")
_TERMINAL = ("finished", "failure")


@dataclass(slots=True, frozen=True)
class SamplerSettings:
    """`trainer.v1.sampler.sampler_kwargs`: what lssim needs and verl does not hand a sampler (see __main__.py for
    the overrides that fill these from verl's own config keys)."""

    policy: str  # an lssim policy spec, e.g. "hadb+april"
    groups_per_step: int  # ${data.train_batch_size}
    group_size: int  # ${actor_rollout_ref.rollout.n}
    max_tokens: int  # ${actor_rollout_ref.rollout.response_length}
    trace_path: str | None = None  # where to write the lssim trace (None: record nothing)
    total_groups: int | None = None
    seed: int = 0
    run: str = "lssim"  # the name the dataset finds the run under (driver.get_run)
    poll_interval: float = 1.0  # seconds between TransferQueue polls

    def __post_init__(self):
        if not isinstance(self.policy, str) or not self.policy:
            raise ValueError(f"sampler_kwargs.policy must be an lssim policy spec (e.g. 'hadb+april'), got {self.policy!r}")
        if not self.poll_interval > 0:
            raise ValueError(f"sampler_kwargs.poll_interval must be > 0, got {self.poll_interval!r}")

    @classmethod
    def from_kwargs(cls, kwargs: Mapping[str, Any] | None) -> "SamplerSettings":
        given = {str(k): kwargs[k] for k in (kwargs or {})}  # a plain dict or an OmegaConf DictConfig
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(given) - known)
        if unknown:
            raise ValueError(f"trainer.v1.sampler.sampler_kwargs: unknown key(s) {unknown}; known: {sorted(known)}")
        try:
            return cls(**given)
        except TypeError as e:  # a required key is missing
            raise ValueError(f"trainer.v1.sampler.sampler_kwargs: {e}") from None


class LssimSampler:
    """verl's custom sampler (`trainer.v1.sampler.custom_sampler.name=LssimSampler`); see the module docstring."""

    def __init__(self, trainer_mode: str, trainer_config: Any, max_off_policy_threshold: int | None,
                 max_off_policy_strategy: str, sampler_kwargs: Mapping[str, Any], refill_fn: Callable[[int], int] | None = None,
                 *, store: Any = None, batch_meta: Callable[..., Any] | None = None, wait: Callable[[], None] | None = None,
                 clock: Callable[[], float] = time.monotonic):
        if trainer_mode not in MODES:
            raise ValueError(f"LssimSampler supports trainer.v1.trainer_mode in {MODES}, got {trainer_mode!r}")
        if max_off_policy_strategy not in ("drop", "wait"):
            raise ValueError(f"max_off_policy_strategy must be 'drop' or 'wait', got {max_off_policy_strategy!r}")
        self.settings = s = SamplerSettings.from_kwargs(sampler_kwargs)
        self.trainer_mode, self.refill_fn = trainer_mode, refill_fn
        self.max_off_policy_threshold, self.max_off_policy_strategy = max_off_policy_threshold, max_off_policy_strategy
        if store is None or batch_meta is None:  # verl's own TransferQueue, imported only when verl runs us
            import transfer_queue
            store = store if store is not None else transfer_queue
            batch_meta = batch_meta if batch_meta is not None else transfer_queue.KVBatchMeta
        self.store, self.batch_meta = store, batch_meta
        self.wait = wait if wait is not None else (lambda: time.sleep(s.poll_interval))
        self.clock = clock
        config = DriverConfig(s.groups_per_step, s.group_size, s.max_tokens, s.total_groups, s.seed)
        self.driver = start_run(s.run, PolicyDriver(s.policy, config))
        self.policy = self.driver.policy
        self.recorder = TraceRecorder(s.trace_path) if s.trace_path else None
        self._read: dict[str, list[VerlResponse]] = {}  # uid -> its finished group's responses, read once
        self._evicted: dict[str, list[VerlResponse]] = {}  # uid -> responses of groups dropped in this step
        self._asks = {h: self.policy.overrides(h) for h in ("end_rollout", "select", "top_up")}
        if trainer_mode == "sync" and self._asks["end_rollout"]:
            warnings.warn(f"policy {self.policy.name} ends rollouts early (end_rollout), which verl's sync trainer cannot "
                          "do (it sleeps the replicas after sampling): every group runs to its end. Use "
                          "trainer.v1.trainer_mode=colocate_async for partial rollouts.", stacklevel=2)

    # -- verl's entry point ---------------------------------------------------------------------------------
    def sample(self, global_steps: int, partition_id: str, batch_size: int) -> tuple[Any, dict]:
        if partition_id != "train":
            return self._sample_all(partition_id, batch_size), {}
        started = self.clock()
        refilled = self._refill(self.driver.pending)
        state = RolloutState(step=global_steps - 1, started=started, now=started)
        while True:
            prompts, trajectories = self._snapshot(partition_id)
            self._read_finished(partition_id, prompts, trajectories)
            stale = [uid for uid in self._done(prompts) if self._stale(prompts[uid], global_steps)]
            if stale:  # verl's ReplayBufferAsync: evict the groups past the staleness bound, refill as many
                self._evict(partition_id, stale, trajectories)
                refilled += self._refill(len(stale))
                continue
            in_flight = self._update_state(state, prompts, trajectories)
            if not in_flight:  # the rollout would end: a policy may add groups first (lssim's controller does the same)
                more = self.policy.top_up(state) if self._asks["top_up"] else []
                if more:
                    self.driver.enqueue(more)
                    refilled += self._refill(len(more))
                    continue
                if state.groups_done == 0:
                    raise RuntimeError(f"step {global_steps}: every group ended and none finished: nothing to train on")
                break
            if self._rollout_ends(state, prompts, global_steps, batch_size):
                break
            self.wait()
        return self._settle(state, prompts, trajectories, global_steps, batch_size, refilled)

    # -- TransferQueue --------------------------------------------------------------------------------------
    def _snapshot(self, partition_id: str) -> tuple[dict[str, dict], dict[str, list[tuple[str, dict]]]]:
        """The partition's prompts (uid -> status tag) and trajectories (uid -> [(key, tag)])."""
        listed = (self.store.kv_list(partition_id) or {}).get(partition_id, {})
        prompts, trajectories = {}, {}
        for key, tag in listed.items():
            if tag.get("is_prompt", False):
                prompts[key] = tag
            else:
                trajectories.setdefault(parse_key(key)[0], []).append((key, tag))
        return prompts, trajectories

    def _read_finished(self, partition_id: str, prompts: dict, trajectories: dict) -> None:
        """Fetch rewards, prompt ids and lssim's extra fields of groups that finished since the last poll."""
        new = [uid for uid, tag in prompts.items() if tag.get("status") == "finished" and uid not in self._read
               and trajectories.get(uid)]
        if not new:
            return
        keys = [k for uid in new for k, _ in trajectories[uid]]
        tags = [t for uid in new for _, t in trajectories[uid]]
        id_field = PROMPT_ID_FIELD if self.driver.pool is not None else "index"  # lssim's dataset, else verl's
        fetched = self.store.kv_batch_get(keys=keys, partition_id=partition_id,
                                          select_fields=[id_field, "rm_scores", "extra_fields"])
        for r in responses_from_batch(keys, tags, fetched, self.settings.max_tokens):
            self._read.setdefault(r.uid, []).append(r)

    def _clear(self, partition_id: str, uids: list[str], trajectories: dict) -> None:
        if uids:
            keys = list(uids) + [k for uid in uids for k, _ in trajectories.get(uid, [])]
            self.store.kv_clear(keys=keys, partition_id=partition_id)
            for uid in uids:
                self._read.pop(uid, None)

    def _evict(self, partition_id: str, uids: list[str], trajectories: dict) -> None:
        """Drop finished groups (generated, not trained): cleared from TransferQueue, kept for the step's record."""
        for uid in uids:
            self._evicted[uid] = self._read.pop(uid)
        self._clear(partition_id, uids, trajectories)

    def _refill(self, n: int) -> int:
        if n <= 0:
            return 0
        if self.refill_fn is None:
            raise RuntimeError(f"the policy planned {n} groups beyond verl's batch, and verl gave no refill_fn")
        try:
            self.refill_fn(n)
        except ValueError as e:  # verl: "num_prompts must be a positive multiple of gen_batch_size"
            raise ValueError(f"verl refused to fetch the policy's {n} extra groups ({e}); set data.gen_batch_size=1") from e
        return n

    # -- the rollout's end ----------------------------------------------------------------------------------
    def _done(self, prompts: dict) -> list[str]:
        return sorted((uid for uid, tag in prompts.items() if tag.get("status") == "finished" and uid in self._read),
                      key=lambda uid: (prompts[uid].get("global_steps", 0), uid))

    def _update_state(self, state: RolloutState, prompts: dict, trajectories: dict) -> int:
        done = self._done(prompts)
        in_flight = sum(tag.get("status") not in _TERMINAL for tag in prompts.values())
        state.now = self.clock()
        state.groups_submitted = len(prompts)
        state.groups_done = len(done)
        state.groups_effective = sum(len({r.reward for r in self._read[uid]}) > 1 for uid in done)
        state.requests_in_flight = in_flight  # groups: verl's tags do not say how many of a group's sessions are left
        state.responses_done = sum(len(self._read[uid]) for uid in done)
        return in_flight

    def _rollout_ends(self, state: RolloutState, prompts: dict, global_steps: int, batch_size: int) -> bool:
        """Asked while groups are in flight (with none, the rollout ends unless the policy tops up)."""
        if self.trainer_mode == "sync" or state.groups_done == 0:
            return False
        if self.max_off_policy_threshold is not None and self.max_off_policy_strategy == "wait":
            if any(global_steps - tag.get("global_steps", global_steps) + 1 >= self.max_off_policy_threshold
                   for tag in prompts.values() if tag.get("status") not in _TERMINAL):
                return False
        if self._asks["end_rollout"]:
            return bool(self.policy.end_rollout(state))
        return state.groups_done >= batch_size

    # -- the step's batch -----------------------------------------------------------------------------------
    def _settle(self, state: RolloutState, prompts: dict, trajectories: dict, global_steps: int, batch_size: int,
                refilled: int) -> tuple[Any, dict]:
        partition, step = "train", global_steps - 1
        failed = [uid for uid, tag in prompts.items()  # failed, or finished without a trajectory
                  if tag.get("status") == "failure" or (tag.get("status") == "finished" and not trajectories.get(uid))]
        done = self._done(prompts)
        trained_uids = self._select(done, step, batch_size)
        if not trained_uids:
            raise RuntimeError(f"step {global_steps}: policy {self.policy.name} selected none of the {len(done)} finished "
                               "groups, and verl cannot train on an empty batch")
        unselected = [uid for uid in done if uid not in trained_uids and self._drops_unselected()]
        self._evict(partition, unselected, trajectories)
        dropped, self._evicted = self._evicted, {}  # uid -> responses of every group dropped in this step
        settled = [r for uid in trained_uids for r in self._read[uid]] + [r for rs in dropped.values() for r in rs]
        wait_s = state.now - state.started
        if self.recorder is not None:
            seconds = wait_s if self.trainer_mode == "sync" else math.nan
            self.recorder.add([r for uid in trained_uids for r in self._read[uid]], trained=True, rollout_seconds=seconds)
            self.recorder.add([r for rs in dropped.values() for r in rs], trained=False, rollout_seconds=seconds)
            self.recorder.write()
        carried = sum(tag.get("status") not in _TERMINAL for tag in prompts.values())
        self.driver.end_step(step_outcome(step, settled, set(trained_uids), wait_s), len(trained_uids), carried)
        keys, tags = _members(trained_uids, trajectories)
        self._clear(partition, failed, trajectories)
        if trained_uids:  # as verl's ReplayBuffer._materialize_batch: the prompt keys go, the trajectories stay
            self.store.kv_clear(keys=list(trained_uids), partition_id=partition)
        for uid in trained_uids:
            self._read.pop(uid, None)
        metrics = {"lssim/groups_trained": len(trained_uids), "lssim/groups_dropped": len(dropped),
                   "lssim/groups_failed": len(failed), "lssim/groups_carried": carried, "lssim/groups_refilled": refilled,
                   "lssim/rollout_wait_s": wait_s}
        return self.batch_meta(partition_id=partition, keys=keys, tags=tags), metrics

    def _stale(self, tag: dict, global_steps: int) -> bool:
        return (self.trainer_mode != "sync" and self.max_off_policy_threshold is not None
                and self.max_off_policy_strategy == "drop"
                and global_steps - tag.get("global_steps", global_steps) + 1 > self.max_off_policy_threshold)

    def _drops_unselected(self) -> bool:
        """A finished group not trained this step: dropped (sync; or the policy's select left it out), or kept for
        the next step (async with verl's rule: it was past the batch_size oldest)."""
        return self.trainer_mode == "sync" or self._asks["select"] or self._asks["end_rollout"]

    def _select(self, done: list[str], step: int, batch_size: int) -> list[str]:
        if self.trainer_mode != "sync" and not self._asks["select"] and not self._asks["end_rollout"]:
            return done[:batch_size]  # verl's rule: the oldest batch_size finished groups
        groups, owner = [], {}
        for uid in done:
            requests = []
            for r in sorted(self._read[uid], key=lambda r: r.session_id):
                req = Request(rid=len(owner), group_id=len(groups), step=r.step, prompt_id=r.prompt_id,
                              sample_idx=r.session_id, prompt_len=r.prompt_len, max_tokens=r.max_tokens,
                              generated=r.response_len, finish_reason=r.finish_reason, reward=r.reward,
                              first_version=r.version_first, last_version=r.version_last)
                owner[req.rid] = uid
                requests.append(req)
            groups.append(Group(requests[0].prompt_id, requests[0].step, requests))
        chosen = self.policy.select(groups, step)
        trained = {owner[r.rid] for g in chosen for r in g.requests}
        return [uid for uid in done if uid in trained]

    def _sample_all(self, partition_id: str, batch_size: int) -> Any:
        """Validation: wait until every registered group ended, return the batch_size oldest (verl's sync rule)."""
        while True:
            prompts, trajectories = self._snapshot(partition_id)
            ended = [uid for uid, tag in prompts.items() if tag.get("status") in _TERMINAL]
            if len(ended) == len(prompts) and len(ended) >= batch_size:
                break
            self.wait()
        chosen = sorted(ended, key=lambda uid: (prompts[uid].get("global_steps", 0), uid))[:batch_size]
        keys, tags = _members(chosen, trajectories)
        self.store.kv_clear(keys=chosen, partition_id=partition_id)
        return self.batch_meta(partition_id=partition_id, keys=keys, tags=tags)


def _members(uids: list[str], trajectories: dict) -> tuple[list[str], list[dict]]:
    """The trajectory keys and tags of these groups, each group's in session order."""
    pairs = [kt for uid in uids for kt in sorted(trajectories.get(uid, []), key=lambda kt: parse_key(kt[0])[1:])]
    return [k for k, _ in pairs], [t for _, t in pairs]
