"""The Workload index as it was before it was built from arrays (lssim/traces/workload.py at commit f53dcfe, with the fix
for samples numbered with a hole that /work/wt/segcount-workload.diff proposed, and absolute imports): the reference
tests/test_workload_index.py holds the array-built index to, answer for answer.
"""
from __future__ import annotations

from bisect import bisect_left
from typing import NamedTuple

import numpy as np
import pandas as pd

from lssim.loop.core import LENGTH, STOP, GroupSpec, PromptPool
from lssim.loop.rewards import RewardScale

EXACT, TRUNCATED, RESAMPLED, GLOBAL = "exact", "truncated", "resampled", "global"
_MASK = (1 << 64) - 1
_NAN = float("nan")


def _hash01(*parts: int) -> float:
    """A deterministic uniform in [0, 1) from integer parts (splitmix64): cheap, and no RNG state."""
    x = 0x9E3779B97F4A7C15
    for p in parts:
        x = (x ^ (p & _MASK)) * 0xBF58476D1CE4E5B9 & _MASK
        x = (x ^ (x >> 31)) * 0x94D049BB133111EB & _MASK
        x ^= x >> 29
    return (x >> 11) / float(1 << 53)


class Outcome(NamedTuple):
    """The Workload's answer for one response: what it will be, and how the Workload knows.

    A named tuple, so the simulator's hot path (one answer per response) pays no more than for a plain
    tuple; the response's signals are `Workload.signal_columns(row)`."""

    length: int  # tokens the response will have
    finish_reason: str  # "stop" or "length"; replayed as recorded, the trace's own (an abort, a policy's stop)
    reward: float
    source: str  # exact / truncated / resampled / global
    row: int  # the trace row the answer comes from


class Workload:
    """Counterfactual responses from a trace (a validated frame, see lssim.traces.trace), and the trace's own
    batches (a `PromptSource`: `default_groups` gives each step's recorded groups, as recorded).

    Prompt ids: a trace's integer ids are used as they are; text ids (verl uids, hashes) get dense int codes
    (0.. in text order) so that policies keep indexing numpy arrays and dicts by int. `prompt_ids_as_written`
    turns codes back into the trace's ids (lssim.analysis.replay does it for every result frame)."""

    def __init__(self, trace: pd.DataFrame, seed: int = 0):
        codes, self.prompt_names = _prompt_codes(trace["prompt_id"])
        group = trace["group_id"].to_numpy(np.int64) if "group_id" in trace else np.zeros(len(trace), np.int64)
        # Rows in (step, prompt, group, sample) order: a prompt's groups at a step are one run of rows, group by group.
        order = np.lexsort((trace["sample_idx"].to_numpy(np.int64), group, codes, trace["step"].to_numpy(np.int64)))
        df = trace.iloc[order].reset_index(drop=True)
        codes, group = codes[order], group[order]
        self.seed = seed
        self.n_rows = len(df)
        # Runs count steps from 0; a trace may start anywhere or skip steps: its i-th step is run step i.
        self.trace_steps, steps = np.unique(df["step"].to_numpy(np.int64), return_inverse=True)
        steps = steps.astype(np.int64)
        self._index_rows(df)
        self._index_groups(steps, codes)
        self._index_holes(df["sample_idx"].to_numpy(np.int64))
        self._index_batches(df, steps, codes, group)
        first = np.unique(codes, return_index=True)[1]
        first.sort()  # the pool lists prompts in the order they first appear
        self._prompt_len = dict(zip(codes[first].tolist(), df["prompt_len"].to_numpy(np.int64)[first].tolist()))
        self.pool = PromptPool(codes[first], df["prompt_len"].to_numpy(np.int64)[first])
        self.reward_scale = RewardScale.of(df["reward"].to_numpy(float))
        self._low = self.reward_scale.low
        # The run's nominal shape (what policies that choose their own batches are told): median groups per
        # step and group size, the largest budget. The recorded batches themselves are replayed as they are.
        self.group_size = int(np.median([g[1] for batch in self._batches.values() for g in batch]))
        self.groups_per_step = int(np.median([len(batch) for batch in self._batches.values()]))
        self.max_tokens = int(df["max_tokens"].max())

    def _index_rows(self, df: pd.DataFrame) -> None:
        """Per-row facts as Python lists: scalar indexing on them is several times faster than on numpy arrays."""
        self._len = df["response_len"].to_numpy(np.int64).tolist()
        self._max = df["max_tokens"].to_numpy(np.int64).tolist()
        reasons = df["finish_reason"].to_numpy()
        self._reason = reasons.tolist()
        self._stopped = (reasons == STOP).tolist()  # ended by itself: natural length known
        self._reward = df["reward"].to_numpy(float).tolist()
        loop = df["loop_start"].to_numpy(np.int64) if "loop_start" in df else np.full(len(df), -1, np.int64)
        self._loop = loop.tolist()
        collapse = (df["entropy_collapse_start"].to_numpy(np.int64) if "entropy_collapse_start" in df
                    else np.full(len(df), -1, np.int64))
        self._collapse = collapse.tolist()
        entropy = df["entropy_mean"].to_numpy(float) if "entropy_mean" in df else np.full(len(df), np.nan)
        self._entropy = [x if x == x else _NAN for x in entropy.tolist()]  # one NaN object: answers compare equal
        healthy = entropy[(loop < 0) & (collapse < 0) & ~np.isnan(entropy)]
        # The entropy of ordinary text: what a loop or a collapse departs from (lssim.loop.signals).
        self.text_entropy = float(np.median(healthy)) if len(healthy) else _NAN

    def _index_groups(self, steps: np.ndarray, pids: np.ndarray) -> None:
        """Where each (step, prompt)'s responses are (all its groups at that step, numbered across them, as the
        controller numbers a prompt's samples within a step), which steps each prompt was recorded at, and the
        rows of each step."""
        new_group = np.r_[True, (steps[1:] != steps[:-1]) | (pids[1:] != pids[:-1])]
        starts = np.flatnonzero(new_group)
        counts = np.diff(np.r_[starts, len(steps)])
        g_steps, g_pids = steps[starts], pids[starts]
        self._groups = dict(zip(zip(g_steps.tolist(), g_pids.tolist()), zip(starts.tolist(), counts.tolist())))
        # For each prompt, the steps it was recorded at (sorted), for nearest-step resampling.
        order = np.lexsort((g_steps, g_pids))
        self._prompt_steps: dict[int, list[int]] = {}
        for pid, step in zip(g_pids[order].tolist(), g_steps[order].tolist()):
            self._prompt_steps.setdefault(pid, []).append(step)
        # Rows of each step, for the global last resort.
        step_values, step_starts = np.unique(steps, return_index=True)
        self.steps = step_values.tolist()
        bounds = np.r_[step_starts, len(steps)]
        self._step_rows = {s: (int(bounds[i]), int(bounds[i + 1])) for i, s in enumerate(self.steps)}

    def _index_holes(self, samples: np.ndarray) -> None:
        """(step, prompt)s whose recorded samples are not 0..count-1 (a member that never ended, filtered rows):
        their rows by sample number, so a hole does not shift the samples after it onto their neighbours' rows."""
        self._holes: dict[tuple[int, int], dict[int, int]] = {}
        for key, (start, count) in self._groups.items():
            own = samples[start:start + count]
            # Numbers repeated (a prompt's groups each numbered from 0, as some importers write) stay positional.
            if not np.array_equal(own, np.arange(count)) and len(np.unique(own)) == count:
                self._holes[key] = {int(v): start + i for i, v in enumerate(own.tolist())}

    def _index_batches(self, df: pd.DataFrame, steps: np.ndarray, pids: np.ndarray, group: np.ndarray) -> None:
        """Each step's recorded groups, in order, as GroupSpec arguments (a fresh GroupSpec per ask: policies may
        keep the ones they are given)."""
        new_group = np.r_[True, (steps[1:] != steps[:-1]) | (pids[1:] != pids[:-1]) | (group[1:] != group[:-1])]
        starts = np.flatnonzero(new_group)
        ends = np.r_[starts[1:], len(steps)]
        trained = df["trained"].to_numpy(bool).tolist() if "trained" in df else [True] * len(df)
        self._batches: dict[int, list[tuple]] = {}
        for s, p, a, b in zip(steps[starts].tolist(), pids[starts].tolist(), starts.tolist(), ends.tolist()):
            self._batches.setdefault(s, []).append(_recorded_spec(p, tuple(self._max[a:b]), tuple(trained[a:b])))

    # -- PromptSource ------------------------------------------------------------------------------
    def prompt_len(self, prompt_id: int) -> int:
        """A prompt's length in tokens (its first recorded one)."""
        try:
            return self._prompt_len[prompt_id]
        except KeyError:
            raise KeyError(f"prompt_id {prompt_id} is not in the trace's prompt pool") from None

    def default_groups(self, step: int, n_groups: int, group_size: int, max_tokens: int) -> list[GroupSpec]:
        """The batch the trace recorded at its `step`-th step, whole and as recorded (past the trace's end, it
        starts over): every group with its own size, every member with its own budget and whether the recorded
        run trained it. The run shape's `n_groups`, `group_size` and `max_tokens` are for sources that record
        nothing (a dataset's loader); a recorded batch keeps its own. The controller proposes a step's batch
        whole (lssim.loop.loader.DataLoader.proposal_size), so under the baseline each step replays exactly as recorded."""
        return [GroupSpec(*g) for g in self._batches[step % len(self.steps)]]

    def groups_in(self, n_steps: int) -> int:
        """Groups the trace recorded in its first `n_steps` steps (starting over past its end): what a run over
        them uses, trained or, as recorded, left out."""
        per_step = [len(self._batches[s]) for s in self.steps]
        return sum(per_step[i % len(per_step)] for i in range(n_steps))

    def prompt_ids_as_written(self, codes):
        """The trace's own prompt ids for the int codes the run used (the same ints for an integer-id trace)."""
        if self.prompt_names is None:
            return codes
        return self.prompt_names[np.asarray(codes, dtype=np.int64)]

    # -- the counterfactual model ------------------------------------------------------------------
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
            row = lo + int(_hash01(self.seed, step, prompt_id, sample_idx) * (hi - lo))
            return self._from_row(row, max_tokens, GLOBAL, step, prompt_id, sample_idx)
        start, count = self._groups[(self._nearest(steps, step), prompt_id)]
        if sample_idx < count:  # a rotation of the recorded group: its members' spread and rewards stay a group's
            row = start + (sample_idx + int(_hash01(self.seed, step, prompt_id) * count)) % count
        else:
            row = start + int(_hash01(self.seed, step, prompt_id, sample_idx) * count)
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
        return candidates[int(_hash01(self.seed, step, prompt_id, sample_idx, than) * len(candidates))]

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


def _prompt_codes(ids: pd.Series) -> tuple[np.ndarray, np.ndarray | None]:
    """(int64 codes, the text id of each code) for text prompt ids; (the ids, None) for integer ones."""
    if pd.api.types.is_integer_dtype(ids.dtype) and not pd.api.types.is_bool_dtype(ids.dtype):
        return ids.to_numpy(np.int64), None
    codes, names = pd.factorize(ids, sort=True)
    return codes.astype(np.int64), np.asarray(names, dtype=object)


def _recorded_spec(prompt_id: int, budgets: tuple[int, ...], trained: tuple[bool, ...]) -> tuple:
    """A recorded group's GroupSpec arguments: per-member budgets and trained flags only where members differ
    from a plain spec (every member at the group's budget, every member trained)."""
    cap = max(budgets)
    return (prompt_id, len(budgets), cap, 0, None, None if min(budgets) == cap else budgets,
            None if all(trained) else trained)


_U = np.uint64


def hash01_many(seed: int, *parts: np.ndarray) -> np.ndarray:
    """`_hash01(seed, *parts)` for arrays of parts, equal to it bit for bit (splitmix64 in wrapping uint64)."""
    n = len(parts[0])
    x = np.full(n, 0x9E3779B97F4A7C15, dtype=_U)
    with np.errstate(over="ignore"):
        for p in (np.full(n, seed, dtype=np.int64), *parts):
            x = (x ^ np.asarray(p, dtype=np.int64).view(_U)) * _U(0xBF58476D1CE4E5B9)
            x = (x ^ (x >> _U(31))) * _U(0x94D049BB133111EB)
            x ^= x >> _U(29)
    return (x >> _U(11)).astype(float) / float(1 << 53)


class _ArrayIndex:
    """The Workload's index as sorted arrays, for `Workload.lookup_many` (built on its first call)."""

    def __init__(self, wl: "Workload"):
        keys = np.array(list(wl._groups.keys()), dtype=np.int64).reshape(-1, 2)
        spans = np.array(list(wl._groups.values()), dtype=np.int64).reshape(-1, 2)
        self.pids = np.unique(keys[:, 1])
        self.n_pids = len(self.pids)
        code = np.searchsorted(self.pids, keys[:, 1])
        combined = keys[:, 0] * self.n_pids + code  # (step, prompt code) -> one sortable int
        order = np.argsort(combined)
        self.group_key, self.group_start, self.group_count = combined[order], spans[order, 0], spans[order, 1]
        by_prompt = np.lexsort((keys[:, 0], code))  # each prompt's recorded steps, sorted
        self.prompt_code, self.prompt_step = code[by_prompt], keys[by_prompt, 0]
        self.prompt_key = self.prompt_code * _SPREAD + self.prompt_step
        self.prompt_lo = np.searchsorted(self.prompt_code, np.arange(self.n_pids))
        self.prompt_hi = np.searchsorted(self.prompt_code, np.arange(self.n_pids), side="right")
        self.steps = np.array(wl.steps, dtype=np.int64)
        self.step_lo = np.array([wl._step_rows[s][0] for s in wl.steps], dtype=np.int64)
        self.step_hi = np.array([wl._step_rows[s][1] for s in wl.steps], dtype=np.int64)
        self.length = np.array(wl._len, dtype=np.int64)
        self.max = np.array(wl._max, dtype=np.int64)
        self.stopped = np.array(wl._stopped, dtype=bool)
        self.reward = np.array(wl._reward, dtype=float)
        self.reason = np.array(wl._reason, dtype=object)

    def code_of(self, pid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        code = np.minimum(np.searchsorted(self.pids, pid), max(self.n_pids - 1, 0))
        return code, self.pids[code] == pid

    def group(self, step: np.ndarray, code: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(hit, start, count) of each (step, prompt code)."""
        key = step * self.n_pids + code
        i = np.minimum(np.searchsorted(self.group_key, key), len(self.group_key) - 1)
        hit = self.group_key[i] == key
        return hit, self.group_start[i], np.where(hit, self.group_count[i], 0)


def _nearest_many(sorted_steps: np.ndarray, lo: np.ndarray, hi: np.ndarray, step: np.ndarray, keys: np.ndarray,
                  query: np.ndarray) -> np.ndarray:
    """`Workload._nearest` of each step within sorted_steps[lo:hi] (the earlier one on a tie). `keys` are the
    sorted (range, step) pairs as one int and `query` each step's pair: one search finds its place in its range."""
    i = np.searchsorted(keys, query)  # = bisect_left within the row's own range (other ranges' keys sort outside)
    first, last = sorted_steps[lo], sorted_steps[np.maximum(hi - 1, lo)]
    after = sorted_steps[np.minimum(i, hi - 1)]
    before = sorted_steps[np.maximum(i - 1, lo)]
    pick = np.where((after == step) | (after - step < step - before), after, before)
    return np.where(i == lo, first, np.where(i == hi, last, pick))


_SPREAD = np.int64(1) << 31  # (prompt code, step) as one int: code * _SPREAD + step (steps are below 2**31)


def lookup_many(wl: Workload, step, prompt_id, sample_idx, budget) -> tuple:
    """`wl.lookup` for arrays of queries: (length, finish_reason, reward, source, row), each an array (reasons and
    sources as object arrays of the same strings). The cases the Workload answers from one row are computed over
    arrays; the rest (a response recorded cut short and asked with a larger budget) are asked one by one."""
    index = wl.__dict__.get("_array_index")
    if index is None:
        index = wl.__dict__["_array_index"] = _ArrayIndex(wl)
    step, pid = np.asarray(step, np.int64), np.asarray(prompt_id, np.int64)
    sample, budget = np.asarray(sample_idx, np.int64), np.asarray(budget, np.int64)
    n = len(step)
    code, known = index.code_of(pid)
    hit, start, count = index.group(step, code)
    exact = known & hit & (sample < count)
    row = np.where(exact, start + sample, 0)
    source = np.where(exact, EXACT, RESAMPLED).astype(object)
    other = known & ~exact
    if other.any():
        s, c = step[other], code[other]
        near = _nearest_many(index.prompt_step, index.prompt_lo[c], index.prompt_hi[c], s, index.prompt_key, c * _SPREAD + s)
        _, g_start, g_count = index.group(near, c)
        smp, p = sample[other], pid[other]
        rotate = np.floor(hash01_many(wl.seed, s, p) * g_count).astype(np.int64)
        drawn = np.floor(hash01_many(wl.seed, s, p, smp) * g_count).astype(np.int64)
        row[other] = g_start + np.where(smp < g_count, (smp + rotate) % np.maximum(g_count, 1), drawn)
    unknown = ~known
    if unknown.any():
        s = step[unknown]
        near = _nearest_many(index.steps, np.zeros(len(s), np.int64), np.full(len(s), len(index.steps)), s, index.steps, s)
        at = np.searchsorted(index.steps, near)
        lo, hi = index.step_lo[at], index.step_hi[at]
        row[unknown] = lo + np.floor(hash01_many(wl.seed, s, pid[unknown], sample[unknown]) * (hi - lo)).astype(np.int64)
        source[unknown] = GLOBAL
    out = _from_rows(wl, index, row, budget, source, exact, (step, pid, sample))
    if wl._holes:  # a (step, prompt) with a hole: its samples by number, asked one by one
        for j in np.flatnonzero(known & hit).tolist():
            if (int(step[j]), int(pid[j])) in wl._holes:
                a = wl.lookup(int(step[j]), int(pid[j]), int(sample[j]), int(budget[j]))
                for column, value in zip(out, (a.length, a.finish_reason, a.reward, a.source, a.row)):
                    column[j] = value
    return out


def _from_rows(wl: Workload, index: _ArrayIndex, row, budget, source, exact, keys) -> tuple:
    """`Workload._from_row` over arrays; rows it cannot answer alone are asked of `wl.lookup` one by one."""
    rec_len, stopped = index.length[row], index.stopped[row]
    as_recorded = ~stopped & exact & (budget == index.max[row])
    natural = (stopped & (rec_len <= budget)) | as_recorded
    cut = ~natural & (stopped | (budget <= rec_len))
    length = np.where(natural, rec_len, budget)
    reward = np.where(natural, index.reward[row], wl._low)
    reason = np.where(stopped, STOP, LENGTH).astype(object)
    reason[as_recorded] = index.reason[row[as_recorded]]
    reason[cut] = LENGTH
    source = source.copy()
    source[cut & exact] = TRUNCATED
    for j in np.flatnonzero(~natural & ~cut).tolist():  # recorded cut short, asked with more budget: the scalar model
        a = wl.lookup(int(keys[0][j]), int(keys[1][j]), int(keys[2][j]), int(budget[j]))
        length[j], reason[j], reward[j], source[j], row[j] = a.length, a.finish_reason, a.reward, a.source, a.row
    return length, reason, reward, source, row
