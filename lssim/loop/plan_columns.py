"""A step's planned groups (lssim.loop.core.GroupSpec, or a loader batch's GroupSpecs) as the columns of its requests:
the controller's one way to make a step's requests, on either route (lssim.loop.columns.RequestColumns).
"""

from __future__ import annotations

import itertools
import operator
from typing import Callable

import numpy as np

from lssim.loop.columns import RequestColumns, runs, stable_argsort
from lssim.loop.core import GroupSpecs


def plan_requests(plan, *, step: int, first_rid: int, first_group: int, version: int, rng: np.random.Generator,
                  prompt_lens: Callable[[np.ndarray], np.ndarray], samples_planned: dict[int, int],
                  batch_samples: dict[int, dict[int, int]]) -> tuple[RequestColumns, list[int]]:
    """A step's planned groups (lssim.loop.core.GroupSpec) as requests, group after group: ids from `first_rid` and groups
    from `first_group`, sample indices unique per prompt in the step (`samples_planned`, updated) and in its loader
    batch (`batch_samples`, batch -> prompt -> samples so far, updated), budgets, one seed per request from `rng`,
    prompt lengths from `prompt_lens(prompt_ids)`. Also returns the rids a recorded group says were not trained
    (GroupSpec.member_trained)."""
    if isinstance(plan, GroupSpecs) and plan.untouched:  # a loader batch passed on as columns: read them
        n, pids, batches, max_tokens = plan.n_samples, plan.prompt_id, plan.batch, plan.max_tokens
        priority = instance = None  # a loader's groups: every request at the defaults (priority 0, any instance)
        member_max_tokens = {i: m[0] for i, m in plan.members.items() if m[0] is not None}
        member_trained = {i: m[1] for i, m in plan.members.items() if m[1] is not None}
    else:
        by_field = list(zip(*map(_PLAN_FIELDS, plan))) if plan else [()] * 8  # one pass over the groups
        n, pids, batches, max_tokens, priority, instance = (_int_column(c, none)
                                                            for c, none in zip(by_field, (-1, -1, -1, -1, 0, -1)))
        member_max_tokens, member_trained = _not_none(by_field[6]), _not_none(by_field[7])
    fresh_step = not samples_planned
    first = count_on(samples_planned, pids, n)
    first_in_batch = first.copy()
    one_batch = len(batches) and batches[0] >= 0 and (batches == batches[0]).all()
    if one_batch and fresh_step and not batch_samples.get(int(batches[0])):  # the usual step: its own batch, new: the
        batch_samples[int(batches[0])] = dict(samples_planned)  # batch's counts are the step's (count_on gives both)
    else:
        for b in np.unique(batches[batches >= 0]).tolist():  # its place among the samples its loader batch holds of
            of = batches == b  # this prompt (the simulator answers from there)
            first_in_batch[of] = count_on(batch_samples.setdefault(b, {}), pids[of], n[of])
    total = int(n.sum())
    offsets = np.cumsum(n) - n
    within = np.arange(total) - np.repeat(offsets, n)  # each member's place in its group
    budget = np.repeat(max_tokens, n)
    for i, members in member_max_tokens.items():
        budget[offsets[i]:offsets[i] + n[i]] = np.minimum(members, max_tokens[i])
    placed = {} if priority is None else {"priority": np.repeat(priority, n), "instance": np.repeat(instance, n)}
    cols = RequestColumns.planned(
        rid=np.arange(first_rid, first_rid + total), group_id=np.repeat(np.arange(first_group, first_group + len(plan)), n),
        step=np.full(total, step), prompt_id=np.repeat(pids, n), sample_idx=np.repeat(first, n) + within,
        prompt_len=np.repeat(np.asarray(prompt_lens(pids), np.int64), n), max_tokens=budget, **placed,
        seed=rng.integers(2**31, size=total), first_version=np.full(total, version),
        batch=np.repeat(batches, n), batch_sample=np.repeat(first_in_batch, n) + within)
    left_out = [first_rid + int(offsets[i]) + k for i, members in member_trained.items() for k, t in enumerate(members) if not t]
    return cols, left_out


def _not_none(values: tuple) -> dict:
    """Each place where `values` is not None, with its value (most plans have no per-member fields: then no loop over
    the groups)."""
    return {} if values.count(None) == len(values) else {i: v for i, v in enumerate(values) if v is not None}


_PLAN_FIELDS = operator.attrgetter("n_samples", "prompt_id", "batch", "max_tokens", "priority", "instance",
                                   "member_max_tokens", "member_trained")


def _int_column(values: tuple, none: int) -> np.ndarray:
    """A tuple of ints (None read as `none`) as an int64 array."""
    try:
        return np.array(values, np.int64)  # the usual column: no None (looking for one costs more than converting)
    except TypeError:
        if values.count(None) == len(values):  # a field nobody set (instance, batch)
            return np.full(len(values), none, np.int64)
        return np.array([none if v is None else v for v in values], np.int64)


def count_on(counts: dict[int, int], keys: np.ndarray, n: np.ndarray) -> np.ndarray:
    """For each entry in order, how many were counted under its key before it (`counts` so far, then the entries
    before it with the same key), and `counts` updated with all of them: `n` samples per entry."""
    listed = keys.tolist()
    if not counts and len(set(listed)) == len(listed):  # the usual step: nothing counted yet, each key once
        counts.update(zip(listed, n.tolist()))
        return np.zeros(len(keys), np.int64)
    first = (np.fromiter(map(counts.get, listed, itertools.repeat(0)), np.int64, len(keys)) if counts
             else np.zeros(len(keys), np.int64))
    order = stable_argsort(keys)
    sorted_keys, sorted_n = keys[order], n[order]
    repeats = sorted_keys[1:] == sorted_keys[:-1]
    if repeats.any():  # (a step usually asks each prompt once: then each entry starts where `counts` left it)
        starts, sizes = runs(sorted_keys)
        ahead = np.cumsum(sorted_n) - sorted_n  # samples of earlier entries, all keys
        ahead -= np.repeat(ahead[starts], sizes)  # ... of the same key only
        first[order] += ahead
    counts.update(zip(listed, (first + n).tolist()))  # a key's last entry holds its total (dict keeps the last)
    return first
