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
the model, earns the lowest reward of the trace's scale (0 for 0/1 rewards, -5 for +5/-5; lssim.rewards).

Samples are numbered per (step, prompt) across the prompt's groups at that step (group_id order), as the
controller numbers a prompt's samples within a step, so a prompt drawn twice in a step replays exactly.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import NamedTuple

import numpy as np
import pandas as pd

from .core import LENGTH, STOP, GroupSpec, PromptPool
from .rewards import RewardScale

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
    """Counterfactual responses from a trace (a validated frame, see lssim.trace), and the trace's own
    batches (a `PromptSource`: `default_groups` gives each step's recorded groups, as recorded).

    Prompt ids: a trace's integer ids are used as they are; text ids (verl uids, hashes) get dense int codes
    (0.. in text order) so that policies keep indexing numpy arrays and dicts by int. `prompt_ids_as_written`
    turns codes back into the trace's ids (lssim.replay does it for every result frame)."""

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
        # The entropy of ordinary text: what a loop or a collapse departs from (lssim.signals).
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
        whole (Controller._proposal_size), so under the baseline each step replays exactly as recorded."""
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
        if hit is not None and sample_idx < hit[1]:
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
        """(loop_start, entropy_collapse_start, entropy_mean) of a trace row: what lssim.signals models from."""
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
