"""The Workload: answers "what would this response be?" from a trace, and says how it knows.

A trace records what one policy saw. Under the baseline it is replayed exactly as recorded: the Workload is
also the run's data loader (`default_groups`), and gives each step's recorded batch whole -- its groups,
each group's size, each member's `max_tokens` and whether the recorded run trained it -- so the baseline's
tokens are the trace's, step by step, and every answer is exact. Another policy asks for other prompts,
other budgets, more samples. The Workload answers, in this order of preference:

1. exact      -- the trace holds (step, prompt, sample) and either the budget is the recorded one (it ends
                 as it did, whatever its finish reason: stop, length, an abort, a policy's stop) or the
                 response ended by itself within the budget;
2. truncated  -- the trace holds it but the budget is smaller than the recorded length: cut it there;
3. resampled  -- the trace does not hold it: a response of the same prompt from the nearest recorded
                 step (the same step first). A group asked at another step gets the recorded group,
                 rotated by a hash of the key (sampling with replacement would shrink its reward
                 spread); samples beyond the recorded group size are drawn by a hash. Either way the
                 answer is the same every time it is asked (the oracle and the engine agree);
4. global     -- the prompt never appears in the trace: a response of any prompt at the nearest step.

A response the trace saw cut short (by its own budget, or aborted) tells only that its natural length
exceeds what was recorded; asked with a larger budget it is resampled among the prompt's longer
responses, and runs to the budget if there are none (loops do). A response cut by a budget, here or in
the model, earns the lowest reward of the trace's scale (0 for 0/1 rewards, -5 for +5/-5; lssim.loop.rewards).

Samples are numbered per (step, prompt) across the prompt's groups at that step (group_id order), as the
controller numbers a prompt's samples within a step, so a prompt drawn twice in a step replays exactly.

The index and lookup kernels are lssim.traces.workload_index.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import NamedTuple

import numpy as np
import pandas as pd

from lssim.loop.contracts import OracleLength, PromptSource
from lssim.loop.core import LENGTH, STOP, GroupSpecs, PromptPool, loader_key, loader_keys
from lssim.loop.rewards import RewardScale
from lssim.traces.signal_trace import TraceSignals
from lssim.traces.workload_index import (answer_rows, drawn_ahead, hash01, hash01_many, nearest_many, probe,
                                         resampled_rows, sorted_rows)


EXACT, TRUNCATED, RESAMPLED, GLOBAL = "exact", "truncated", "resampled", "global"
_NAN = float("nan")


class Outcome(NamedTuple):
    """The Workload's answer for one response: what it will be, and how the Workload knows.

    A named tuple, so the simulator's hot path (one answer per response) pays no more than for a plain
    tuple; the response's signals are `Workload.signal_columns(row)`."""

    length: int  # tokens the response will have
    finish_reason: str  # "stop" or "length"; replayed as recorded, the trace's own (an abort, a policy's stop)
    reward: float
    source: str  # exact / truncated / resampled / global
    row: int  # the trace row the answer comes from


class Workload(PromptSource):
    """Counterfactual responses from a trace (a validated frame, see lssim.traces.trace), and the trace's own
    batches (a `PromptSource`: `default_groups` gives each step's recorded groups, as recorded).

    Prompt ids: a trace's integer ids are used as they are; text ids (verl uids, hashes) get dense int codes
    (0.. in text order) so that policies keep indexing numpy arrays and dicts by int. `prompt_ids_as_written`
    turns codes back into the trace's ids (lssim.analysis.replay does it for every result frame).

    The index is built as arrays, over all rows at once (`lookup_many` and the batches read them); the Python
    lists and dicts that make the scalar `lookup` fast (one answer per response on the event engine) are built
    from them part by part on first use (`_LAZY`), so a run that never asks one by one never pays for them;
    `length(step, prompt_id, sample_idx, max_tokens)`, the oracle's question, is one of them (`_length_function`)."""

    def __init__(self, trace: pd.DataFrame, seed: int = 0):
        self.seed = seed
        self.n_rows = len(trace)
        rows, self.prompt_names = sorted_rows(trace)
        self._rows = rows
        # Runs count steps from 0; a trace may start anywhere or skip steps: its i-th step is run step i.
        step = rows["step"]  # sorted: each new value starts the next run step
        new_step = np.r_[True, step[1:] != step[:-1]]
        self.trace_steps = step[new_step]
        steps = rows["step_index"] = np.cumsum(new_step, dtype=np.int64) - 1
        self.steps = list(range(len(self.trace_steps)))
        self._index_groups(steps, rows["prompt"])
        self._index_batches(steps, rows["prompt"], rows["group"])
        self._drawn_ahead = drawn_ahead(steps, rows["prompt"], rows["sample"], rows["batch"])
        # the pool lists prompts in the order they first appear (a prompt's first row starts its first group)
        first_group = np.sort(np.unique(self._g_pid, return_index=True)[1])
        first = self._g_start[first_group]
        prompt_len = rows["prompt_len"]
        self.pool = PromptPool(rows["prompt"][first], prompt_len[first])
        self._prompt_len = dict(zip(self.pool.prompt_id.tolist(), prompt_len[first].tolist()))
        by_id = np.argsort(self.pool.prompt_id, kind="stable")
        self._pool_sorted_ids = self.pool.prompt_id[by_id]
        self._pool_sorted_lens = self.pool.prompt_len[by_id].astype(np.int64)
        self.reward_scale = RewardScale.of(rows["reward"])
        self._low = self.reward_scale.low
        entropy = rows["entropy"]
        healthy = entropy[(rows["loop"] < 0) & (rows["collapse"] < 0) & ~np.isnan(entropy)]
        # The entropy of ordinary text: what a loop or a collapse departs from (lssim.loop.signals).
        self.text_entropy = float(np.median(healthy)) if len(healthy) else _NAN
        # The run's nominal shape (what policies that choose their own batches are told): median groups per
        # step and group size, the largest budget. The recorded batches themselves are replayed as they are.
        self.group_size = int(np.median(self._b_count))
        self.groups_per_step = int(np.median(self._step_groups))
        self.max_tokens = int(rows["max"].max())

    def _index_groups(self, steps: np.ndarray, pids: np.ndarray) -> None:
        """Where each (step, prompt)'s responses are (all its groups at that step, numbered across them, as the
        controller numbers a prompt's samples within a step), and the rows of each step."""
        new_group = np.r_[True, (steps[1:] != steps[:-1]) | (pids[1:] != pids[:-1])]
        self._g_start = np.flatnonzero(new_group)
        self._g_count = np.diff(np.r_[self._g_start, len(steps)])
        self._g_step, self._g_pid = steps[self._g_start], pids[self._g_start]
        self._step_bounds = np.searchsorted(steps, np.arange(len(self.steps) + 1))  # step s: rows [b[s], b[s + 1])
        self._holes = self._index_holes(steps, pids)

    def _index_holes(self, steps: np.ndarray, pids: np.ndarray) -> dict[tuple[int, int], dict[int, int]]:
        """(step, prompt)s whose recorded samples are not 0..count-1 (a member that never ended, filtered rows):
        their rows by sample number, so a hole does not shift the samples after it onto their neighbours' rows.
        (The fix /work/wt/segcount-workload.diff proposed for the row-by-row index, over arrays.)"""
        samples = self._rows["sample"]
        position = np.arange(len(samples)) - np.repeat(self._g_start, self._g_count)  # each row's place in its group
        off = np.logical_or.reduceat(samples != position, self._g_start) if len(samples) else np.zeros(0, bool)
        holes: dict[tuple[int, int], dict[int, int]] = {}
        for g in np.flatnonzero(off).tolist():
            start, count = int(self._g_start[g]), int(self._g_count[g])
            own = samples[start:start + count]
            # Numbers repeated (a prompt's groups each numbered from 0, as some importers write) stay positional.
            if len(np.unique(own)) == count:
                holes[(int(steps[start]), int(pids[start]))] = {v: start + i for i, v in enumerate(own.tolist())}
        return holes

    def _index_batches(self, steps: np.ndarray, pids: np.ndarray, group: np.ndarray) -> None:
        """Each step's recorded groups, in order: where they start and end, their prompt, their largest budget,
        and whether every member has that budget and is trained (GroupSpec arguments are made per step, on the
        first ask: `_recorded_specs`)."""
        new_group = np.r_[True, (steps[1:] != steps[:-1]) | (pids[1:] != pids[:-1]) | (group[1:] != group[:-1])]
        start = np.flatnonzero(new_group)
        self._b_start, self._b_count = start, np.diff(np.r_[start, len(steps)])
        self._b_pid = pids[start]
        budgets, trained = self._rows["max"], self._rows["trained"]
        self._b_cap = np.maximum.reduceat(budgets, start)
        self._b_plain = (np.minimum.reduceat(budgets, start) == self._b_cap) & np.logical_and.reduceat(trained, start)
        self._step_first_group = np.searchsorted(steps[start], np.arange(len(self.steps) + 1))
        self._step_groups = np.diff(self._step_first_group)

    def _recorded_specs(self, step: int) -> tuple:
        """The recorded step `step`'s groups as GroupSpecs columns (prompt ids, sizes, budgets, and the per-member
        fields of the groups whose members differ), made once, then kept (read-only)."""
        made = self.__dict__.setdefault("_spec_columns", {})  # (a workload pickled before it has none)
        specs = made.get(step)
        if specs is None:
            a, b = int(self._step_first_group[step]), int(self._step_first_group[step + 1])
            columns = [np.array(c[a:b], np.int64) for c in (self._b_pid, self._b_count, self._b_cap)]
            for c in columns:
                c.flags.writeable = False
            members = {}
            for j in np.flatnonzero(~self._b_plain[a:b]).tolist():  # members that differ: per-member budgets, flags
                lo = int(self._b_start[a + j])
                hi = lo + int(columns[1][j])
                members[j] = _recorded_spec(int(columns[0][j]), tuple(self._rows["max"][lo:hi].tolist()),
                                            tuple(self._rows["trained"][lo:hi].tolist()))[5:]
            specs = made[step] = (*columns, members)
        return specs

    # -- the scalar index: each part built on its first ask -----------------------------------------
    def __getattr__(self, name: str):
        # Only called for attributes not set yet: a part of the scalar index, or the array index of lookup_many.
        build = _LAZY.get(name)
        if build is None or "_rows" not in self.__dict__:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        value = self.__dict__[name] = build(self)
        return value

    def __getstate__(self) -> dict:
        # What is built on first use is left behind (and built again there): `length` is a closure, not picklable.
        return {k: v for k, v in self.__dict__.items() if k not in _LAZY and k != "_kept_lookup"}

    def _group_dict(self) -> dict[tuple[int, int], tuple[int, int]]:
        """(step, prompt) -> (first row, rows) of its responses at that step."""
        keys = zip(self._g_step.tolist(), self._g_pid.tolist())
        return dict(zip(keys, zip(self._g_start.tolist(), self._g_count.tolist())))

    def _prompt_step_lists(self) -> dict[int, list[int]]:
        """For each prompt, the steps it was recorded at (sorted), for nearest-step resampling."""
        order = np.lexsort((self._g_step, self._g_pid))
        prompt_steps: dict[int, list[int]] = {}
        for pid, step in zip(self._g_pid[order].tolist(), self._g_step[order].tolist()):
            prompt_steps.setdefault(pid, []).append(step)
        return prompt_steps

    def _step_row_ranges(self) -> dict[int, tuple[int, int]]:
        """The rows of each step: the global last resort."""
        bounds = self._step_bounds.tolist()
        return {s: (bounds[s], bounds[s + 1]) for s in self.steps}

    # -- PromptSource ------------------------------------------------------------------------------
    def prompt_len(self, prompt_id: int) -> int:
        """A prompt's length in tokens (its first recorded one)."""
        try:
            return self._prompt_len[prompt_id]
        except KeyError:
            raise KeyError(f"prompt_id {prompt_id} is not in the trace's prompt pool") from None

    def prompt_lens(self, prompt_ids: np.ndarray) -> np.ndarray:
        """`prompt_len` over an array of prompt ids."""
        ids, pool = np.asarray(prompt_ids, np.int64), self._pool_sorted_ids
        at = np.searchsorted(pool, ids)
        found = (at < len(pool)) & (pool[np.minimum(at, len(pool) - 1)] == ids)
        if not found.all():
            raise KeyError(f"prompt_id {int(ids[~found][0])} is not in the trace's prompt pool")
        return self._pool_sorted_lens[at]

    def default_groups(self, step: int, n_groups: int, group_size: int, max_tokens: int) -> GroupSpecs:
        """The batch the trace recorded at its `step`-th step, whole and as recorded (past the trace's end, it
        starts over): every group with its own size, every member with its own budget and whether the recorded
        run trained it. The run shape's `n_groups`, `group_size` and `max_tokens` are for sources that record
        nothing (a dataset's loader); a recorded batch keeps its own. The controller proposes a step's batch
        whole (lssim.loop.loader.DataLoader.proposal_size), so under the baseline each step replays exactly as recorded."""
        pid, count, cap, members = self._recorded_specs(step % len(self.steps))
        return GroupSpecs(pid, count, cap, members=dict(members))

    def groups_in(self, n_steps: int) -> int:
        """Groups the trace recorded in its first `n_steps` steps (starting over past its end): what a run over
        them uses, trained or, as recorded, left out."""
        per_step = self._step_groups
        full, rest = divmod(n_steps, len(per_step))
        return int(full * per_step.sum() + per_step[:rest].sum())

    def prompt_ids_as_written(self, codes):
        """The trace's own prompt ids for the int codes the run used (the same ints for an integer-id trace)."""
        if self.prompt_names is None:
            return codes
        return self.prompt_names[np.asarray(codes, dtype=np.int64)]

    # -- the counterfactual model ------------------------------------------------------------------
    def request_key(self, request) -> tuple[int, int]:
        """The (step, sample) this trace answers a request by (`loader_key` with the groups its run drew ahead)."""
        return loader_key(request, self._drawn_ahead)

    def request_keys(self, requests) -> tuple[np.ndarray, np.ndarray]:
        """`request_key` of every request of columns (lssim.loop.columns.RequestColumns): (step, sample) arrays."""
        return loader_keys(requests, self._drawn_ahead)

    def lookup(self, step: int, prompt_id: int, sample_idx: int, max_tokens: int) -> Outcome:
        """What response `sample_idx` of `prompt_id`'s group at run step `step` is, under budget `max_tokens`:
        exact from the trace where it holds it, else modelled (the module docstring says how)."""
        hit = self._groups.get((step, prompt_id))
        holes = self._holes.get((step, prompt_id)) if self._holes else None
        if holes is not None and sample_idx in holes:
            return self._from_row(holes[sample_idx], max_tokens, EXACT, step, prompt_id, sample_idx)
        if hit is not None and holes is None and sample_idx < hit[1]:
            return self._from_row(hit[0] + sample_idx, max_tokens, EXACT, step, prompt_id, sample_idx)
        steps = self._prompt_steps.get(prompt_id)
        if steps is None:
            lo, hi = self._step_rows[self._nearest(self.steps, step)]
            row = lo + int(hash01(self.seed, step, prompt_id, sample_idx) * (hi - lo))
            return self._from_row(row, max_tokens, GLOBAL, step, prompt_id, sample_idx)
        start, count = self._groups[(self._nearest(steps, step), prompt_id)]
        if sample_idx < count:  # a rotation of the recorded group: its members' spread and rewards stay a group's
            row = start + (sample_idx + int(hash01(self.seed, step, prompt_id) * count)) % count
        else:
            row = start + int(hash01(self.seed, step, prompt_id, sample_idx) * count)
        return self._from_row(row, max_tokens, RESAMPLED, step, prompt_id, sample_idx)

    response = lookup  # the same answer, under the name the oracle and the tests read best

    def signal_columns(self, row: int) -> tuple[int, int, float]:
        """(loop_start, entropy_collapse_start, entropy_mean) of a trace row: what lssim.loop.signals models from."""
        return self._loop[row], self._collapse[row], self._entropy[row]

    def _from_row(self, row: int, budget: int, source: str, step: int, prompt_id: int, sample_idx: int) -> Outcome:
        length, loop = self._len[row], self._loop[row]
        # A response cut by a budget earns the lowest reward of the trace's scale (0 on a 0/1 scale).
        if self._stopped[row]:
            if length <= budget:
                return Outcome(length, STOP, self._reward[row], source, row)
            return Outcome(budget, LENGTH, self._low, TRUNCATED if source == EXACT else source, row)
        if source == EXACT and budget == self._max[row]:  # asked as recorded: it ends as it did (length, abort, stop)
            return Outcome(length, self._reason[row], self._reward[row], EXACT, row)
        if budget <= length:  # cut short in the trace too; the budget cuts it no later
            return Outcome(budget, LENGTH, self._low, TRUNCATED if source == EXACT else source, row)
        # Recorded only up to `length`; the budget allows more. A loop or an entropy
        # collapse runs on; otherwise take one of the prompt's responses that is known to be longer.
        if loop < 0 and self._collapse[row] < 0:
            longer = self._longer_response(prompt_id, step, length, sample_idx)
            if longer is not None and self._len[longer] <= budget and self._stopped[longer]:
                return Outcome(self._len[longer], STOP, self._reward[longer], RESAMPLED, longer)
        return Outcome(budget, LENGTH, self._low, RESAMPLED, row)

    def _longer_response(self, prompt_id: int, step: int, than: int, sample_idx: int) -> int | None:
        candidates = []
        for s in self._prompt_steps.get(prompt_id, ()):
            start, count = self._groups[(s, prompt_id)]
            candidates.extend(r for r in range(start, start + count) if self._len[r] > than)
        if not candidates:
            return None
        return candidates[int(hash01(self.seed, step, prompt_id, sample_idx, than) * len(candidates))]

    @staticmethod
    def _nearest(sorted_steps: list[int], step: int) -> int:
        """The recorded step nearest to `step` (the earlier one on a tie)."""
        i = bisect_left(sorted_steps, step)
        if i == 0:
            return sorted_steps[0]
        if i == len(sorted_steps):
            return sorted_steps[-1]
        before, after = sorted_steps[i - 1], sorted_steps[i]
        return after if after == step or after - step < step - before else before


def _row_list(column: str):
    return lambda wl: wl._rows[column].tolist()


# What the scalar `lookup` reads, built on first use, part by part (Workload.__getattr__): per-row facts as Python
# lists (scalar indexing on them is several times faster than on numpy arrays) and dicts of the groups; the oracle's
# `length` needs four of them, the signals (`signal_columns`) three others. And lookup_many's sorted arrays.
_LAZY = {
    "_len": _row_list("length"), "_max": _row_list("max"), "_reward": _row_list("reward"),
    "_stopped": _row_list("stopped"),  # ended by itself: natural length known
    "_loop": _row_list("loop"), "_collapse": _row_list("collapse"),
    "signals": lambda wl: TraceSignals(wl._rows, wl.text_entropy),  # the early-exit signals, read by a policy that asks
    "_reason": lambda wl: wl._rows["reason_names"][wl._rows["reason"]].tolist(),
    # one NaN object: answers compare equal
    "_entropy": lambda wl: [x if x == x else _NAN for x in wl._rows["entropy"].tolist()],
    "_groups": lambda wl: wl._group_dict(),
    "_prompt_steps": lambda wl: wl._prompt_step_lists(),
    "_step_rows": lambda wl: wl._step_row_ranges(),
    "_array_index": lambda wl: _ArrayIndex(wl),
    "length": lambda wl: _length_function(wl),
}


def _length_function(wl: Workload):
    """`Workload.length(step, prompt_id, sample_idx, max_tokens)`: `lookup(...).length`, what the oracle asks for
    every response (twice). Where the trace holds the response as asked, the answer comes straight from the lists
    (a closure over them: a third faster than a method reading them off the Workload); otherwise from `lookup`."""
    get, stopped, lengths, budgets, lookup = wl._groups.get, wl._stopped, wl._len, wl._max, wl.lookup
    holes = wl._holes  # (step, prompt)s numbered with a hole: answered by lookup

    def length(step: int, prompt_id: int, sample_idx: int, max_tokens: int) -> int:
        hit = get((step, prompt_id))
        if hit is not None and sample_idx < hit[1] and not (holes and (step, prompt_id) in holes):
            row = hit[0] + sample_idx
            if stopped[row]:  # ended by itself: its length, or cut by a smaller budget
                n = lengths[row]
                return n if n <= max_tokens else max_tokens
            if max_tokens == budgets[row]:  # asked as recorded: it ends as it did
                return lengths[row]
        return lookup(step, prompt_id, sample_idx, max_tokens).length

    return length


def _recorded_spec(prompt_id: int, budgets: tuple[int, ...], trained: tuple[bool, ...]) -> tuple:
    """A recorded group's GroupSpec arguments: per-member budgets and trained flags only where members differ
    from a plain spec (every member at the group's budget, every member trained)."""
    cap = max(budgets)
    return (prompt_id, len(budgets), cap, 0, None, None if min(budgets) == cap else budgets,
            None if all(trained) else trained)


class _ArrayIndex:
    """The Workload's index as sorted arrays, for `Workload.lookup_many` (built on its first call)."""

    def __init__(self, wl: "Workload"):
        self.pids = np.unique(wl._g_pid)
        self.n_pids = len(self.pids)
        code = np.searchsorted(self.pids, wl._g_pid)
        combined = wl._g_step * self.n_pids + code  # (step, prompt code) -> one sortable int
        order = np.argsort(combined, kind="stable")  # already ascending: groups are in (step, prompt) order
        self.group_start, self.group_count = wl._g_start[order], wl._g_count[order]  # groups in (step, prompt code) order
        by_prompt = np.lexsort((wl._g_step, code))  # each prompt's recorded steps, sorted
        self.prompt_code, self.prompt_step = code[by_prompt], wl._g_step[by_prompt]
        self.prompt_lo = np.searchsorted(self.prompt_code, np.arange(self.n_pids))
        self.prompt_hi = np.searchsorted(self.prompt_code, np.arange(self.n_pids), side="right")
        place = np.empty_like(order)
        place[order] = np.arange(len(order))
        self.prompt_group = place[by_prompt]  # each (prompt, step) entry's group (its place in that order)
        self.steps = np.array(wl.steps, dtype=np.int64)
        self.step_lo, self.step_hi = wl._step_bounds[:-1], wl._step_bounds[1:]
        rows = wl._rows
        self.length, self.max, self.stopped, self.reward = rows["length"], rows["max"], rows["stopped"], rows["reward"]
        self.reason_code, self.reason_names = rows["reason"], rows["reason_names"]
        # an answer's reason by number (answer_rows): cut at its budget, ended by itself, or as the trace recorded it
        self.answer_reasons = np.array([LENGTH, STOP, *self.reason_names.tolist()], dtype=object)


SOURCES = np.array([RESAMPLED, EXACT, GLOBAL, TRUNCATED], dtype=object)  # lookup_coded's source numbers (0: resampled)
_SOURCE_NUMBER = {name: i for i, name in enumerate(SOURCES.tolist())}


def lookup_many(wl: Workload, step, prompt_id, sample_idx, budget) -> tuple:
    """`wl.lookup` for arrays of queries: (length, finish_reason, reward, source, row), each an array (reasons and
    sources as object arrays of the same strings). The cases the Workload answers from one row are computed over
    arrays; the rest (a response recorded cut short and asked with a larger budget) are asked one by one."""
    length, reason, reward, source, row = lookup_coded(wl, step, prompt_id, sample_idx, budget)
    return length, reason, reward, SOURCES[source], row


def lookup_coded(wl: Workload, step, prompt_id, sample_idx, budget, keep: bool = False) -> tuple:
    """`lookup_many` with each source as its number in SOURCES (an int8 array): the engine counts them. `keep`: the
    answer is kept (read-only) for the next call, which it answers if that asks the same (the oracle's predictions,
    then the engine's answers to the same requests: one lookup)."""
    step, pid = np.asarray(step, np.int64), np.asarray(prompt_id, np.int64)
    sample, budget = np.asarray(sample_idx, np.int64), np.asarray(budget, np.int64)
    asked = (step, pid, sample, budget)
    kept = wl.__dict__.pop("_kept_lookup", None)  # kept for one call only
    if kept is not None and all(np.array_equal(a, b) for a, b in zip(kept[0], asked)):
        return kept[1]
    out = _lookup_coded(wl, *asked)
    if keep:
        for column in out:
            column.flags.writeable = False
        wl.__dict__["_kept_lookup"] = (tuple(a.copy() for a in asked), out)
    return out


def _lookup_coded(wl: Workload, step, pid, sample, budget) -> tuple:
    index = wl._array_index  # built on the first call (Workload.__getattr__)
    code, known, hit, exact, row = probe(index.pids, index.prompt_lo, index.prompt_hi, index.prompt_step, index.prompt_group,
                                          index.group_start, index.group_count, step, pid, sample)
    source = exact.astype(np.int8)  # SOURCES: 1 exact, 0 resampled
    other = known & ~exact
    if other.any():
        row[other] = resampled_rows(index.prompt_step, index.prompt_lo, index.prompt_hi, index.prompt_group, index.group_start,
                                     index.group_count, wl.seed, step[other], code[other], pid[other], sample[other])
    unknown = ~known
    if unknown.any():
        s = step[unknown]
        near = nearest_many(index.steps, np.zeros(len(s), np.int64), np.full(len(s), len(index.steps)), s, index.steps, s)
        at = np.searchsorted(index.steps, near)
        lo, hi = index.step_lo[at], index.step_hi[at]
        row[unknown] = lo + np.floor(hash01_many(wl.seed, s, pid[unknown], sample[unknown]) * (hi - lo)).astype(np.int64)
        source[unknown] = _SOURCE_NUMBER[GLOBAL]
    out = _from_rows(wl, index, row, budget, source, exact, (step, pid, sample))
    if wl._holes:  # a (step, prompt) with a hole: its samples by number, asked one by one
        for j in np.flatnonzero(known & hit).tolist():
            if (int(step[j]), int(pid[j])) in wl._holes:
                a = wl.lookup(int(step[j]), int(pid[j]), int(sample[j]), int(budget[j]))
                for column, value in zip(out, (a.length, a.finish_reason, a.reward, _SOURCE_NUMBER[a.source], a.row)):
                    column[j] = value
    return out


def _from_rows(wl: Workload, index: _ArrayIndex, row, budget, source, exact, keys) -> tuple:
    """`Workload._from_row` over arrays; rows it cannot answer alone are asked of `wl.lookup` one by one."""
    length, reward, reason, cut, scalar = answer_rows(index.length, index.stopped, index.max, index.reward, index.reason_code,
                                                       row, budget, exact, float(wl._low))
    reason = index.answer_reasons[reason]
    source = source.copy()
    source[cut & exact] = _SOURCE_NUMBER[TRUNCATED]
    for j in np.flatnonzero(scalar).tolist():  # recorded cut short, asked with more budget: the scalar model
        a = wl.lookup(int(keys[0][j]), int(keys[1][j]), int(keys[2][j]), int(budget[j]))
        length[j], reason[j], reward[j], source[j], row[j] = a.length, a.finish_reason, a.reward, _SOURCE_NUMBER[a.source], a.row
    return length, reason, reward, source, row


class OracleLengths(OracleLength):
    """Every response's true length in advance (the oracle's `StepContext.oracle_length`): `workload.response`'s
    length for one response, and `many` for arrays of them (lookup_many; the batch route's oracle asks so)."""

    def __init__(self, workload: Workload):
        self.workload = workload

    def __call__(self, step: int, prompt_id: int, sample_idx: int, max_tokens: int) -> int:
        return self.workload.length(step, prompt_id, sample_idx, max_tokens)  # response(...).length, short-cut where exact

    def many(self, step, prompt_id, sample_idx, max_tokens) -> np.ndarray:
        # kept: the engine asks the same of the Workload when it runs these requests
        return np.asarray(lookup_coded(self.workload, step, prompt_id, sample_idx, max_tokens, keep=True)[0], np.int64)

    def key(self, request) -> tuple[int, int]:
        """The (step, sample) the engine answers `request` by (Workload.request_key): what to ask this for."""
        return self.workload.request_key(request)

    def keys(self, requests) -> tuple[np.ndarray, np.ndarray]:
        return self.workload.request_keys(requests)
