"""The Workload's index and lookup kernels: the trace's rows as arrays in (step, prompt, group, sample) order
(`sorted_rows`), the hashes that pick a recorded response the same way every time (`hash01`, and `hash01_many` bit for
bit over arrays), the numba kernels that answer many lookups at once (`probe`, `resampled_rows`, `answer_rows`,
`nearest_many`), and the (step, sample) a request is answered by (`lssim.loop.core.loader_key`, `loader_keys`, with the groups a run
drew ahead: `drawn_ahead`).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from lssim.kernels import BOOLS_IN, F64, F64S_IN, I64, I64S_IN, U64, U64S_2D_IN, kernel
from lssim.loop.core import STOP
from lssim.traces.checks import is_sorted
from lssim.traces.signal_trace import SOURCE_CODES, default_source


_MASK = (1 << 64) - 1


def hash01(*parts: int) -> float:
    """A deterministic uniform in [0, 1) from integer parts (splitmix64): cheap, and no RNG state."""
    x = 0x9E3779B97F4A7C15
    for p in parts:
        x = (x ^ (p & _MASK)) * 0xBF58476D1CE4E5B9 & _MASK
        x = (x ^ (x >> 31)) * 0x94D049BB133111EB & _MASK
        x ^= x >> 29
    return (x >> 11) / float(1 << 53)


def _prompt_codes(ids: pd.Series) -> tuple[np.ndarray, np.ndarray | None]:
    """(int64 codes, the text id of each code) for text prompt ids; (the ids, None) for integer ones."""
    if pd.api.types.is_integer_dtype(ids.dtype) and not pd.api.types.is_bool_dtype(ids.dtype):
        return ids.to_numpy(np.int64), None
    codes, names = pd.factorize(ids, sort=True)
    return codes.astype(np.int64), np.asarray(names, dtype=object)


def signal_source_codes(trace: pd.DataFrame) -> np.ndarray:
    """lssim.traces.signal_trace.SOURCE_CODES of each row (a frame that never went through validate_trace: from its
    labels, as the schema's default)."""
    if "signal_source" in trace:  # validated: one of SOURCE_CODES (comparisons: a 1M-row map takes seconds)
        source = trace["signal_source"]
        return sum(code * (source == name).to_numpy(np.int64) for name, code in SOURCE_CODES.items() if code)
    return np.full(len(trace), SOURCE_CODES[default_source(trace.columns)], np.int64)


def sorted_rows(trace: pd.DataFrame) -> tuple[dict[str, np.ndarray], np.ndarray | None]:
    """The columns the Workload reads, as arrays in (step, prompt, group, sample) order (a prompt's groups at a
    step are one run of rows, group by group), and the text ids of the prompt codes (None for integer ids).
    A validated trace is usually in that order already: then nothing is reordered (`lssim.traces.checks.is_sorted`)."""
    n = len(trace)
    codes, names = _prompt_codes(trace["prompt_id"])

    def column(name, dtype, default):
        return trace[name].to_numpy(dtype) if name in trace else np.full(n, default, dtype)

    step, group, sample = trace["step"].to_numpy(np.int64), column("group_id", np.int64, 0), trace["sample_idx"].to_numpy(np.int64)
    reason, reason_names = pd.factorize(trace["finish_reason"], use_na_sentinel=False)
    rows = {
        "step": step, "prompt": codes, "group": group, "sample": sample,
        "length": trace["response_len"].to_numpy(np.int64), "max": trace["max_tokens"].to_numpy(np.int64),
        "reward": trace["reward"].to_numpy(float), "prompt_len": trace["prompt_len"].to_numpy(np.int64),
        "reason": reason.astype(np.int64), "loop": column("loop_start", np.int64, -1),
        "collapse": column("entropy_collapse_start", np.int64, -1), "entropy": column("entropy_mean", float, np.nan),
        "trained": column("trained", bool, True), "batch": column("batch", np.int64, -1),
        "signal_source": signal_source_codes(trace),
    }
    if "signal_repetition" in trace:  # measured signals (lssim.traces.signal_trace): read only by a policy that asks
        rows.update({name: trace[name].to_numpy(np.int64) for name in ("signal_window", "signal_ngram", "signal_stride")})
        rows.update({name: trace[name].to_numpy(object) for name in ("signal_repetition", "signal_entropy")})
    keys = (step, codes, group, sample)
    if not is_sorted(keys):
        order = np.lexsort(keys[::-1])
        rows = {k: v[order] for k, v in rows.items()}
    reason_names = np.asarray(reason_names, dtype=object)
    rows["reason_names"] = reason_names
    rows["stopped"] = np.isin(rows["reason"], np.flatnonzero(reason_names == STOP))
    return rows, names


_U = np.uint64


def hash01_many(seed: int, *parts: np.ndarray) -> np.ndarray:
    """`_hash01(seed, *parts)` for arrays of parts, equal to it bit for bit (splitmix64 in wrapping uint64)."""
    n = len(parts[0])
    words = np.empty((len(parts) + 1, n), np.int64)
    words[0] = seed
    for i, p in enumerate(parts):
        words[i + 1] = p
    return _splitmix01(words.view(_U))


@kernel(U64S_2D_IN)
def _splitmix01(words):
    """Each column's words folded through splitmix64 (wrapping uint64), as a float in [0, 1): one pass, where numpy
    made two dozen temporaries per call."""
    k, n = words.shape
    out = np.empty(n)
    for j in range(n):
        x = np.uint64(0x9E3779B97F4A7C15)
        for i in range(k):
            x = _fold(x, words[i, j])
        out[j] = _unit(x)
    return out


@kernel(U64, U64)
def _fold(x, word):
    """One word into the splitmix64 state (wrapping uint64)."""
    x = (x ^ word) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(31))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(29))


@kernel(U64)
def _unit(x):
    return float(x >> np.uint64(11)) / 9007199254740992.0  # 2**53


@kernel(I64, I64, I64, I64, I64)
def _hash01_words(seed, a, b, c, n_words):
    """hash01(seed, a, b) (n_words 2) or hash01(seed, a, b, c) (3) of int64 words, bit for bit hash01_many's."""
    x = _fold(np.uint64(0x9E3779B97F4A7C15), np.uint64(seed))
    x = _fold(_fold(x, np.uint64(a)), np.uint64(b))
    if n_words == 3:
        x = _fold(x, np.uint64(c))
    return _unit(x)


@kernel(*(I64S_IN,) * 10)
def probe(pids, prompt_lo, prompt_hi, prompt_step, prompt_group, group_start, group_count, step, pid, sample):
    """Each query's prompt code (its place among the trace's sorted prompt ids, the last where it is not one),
    whether its prompt is known, whether the trace recorded the (step, prompt), whether it recorded the sample too, and
    that row (0 where not): one pass. The (step, prompt) is searched among the prompt's own recorded steps (a few,
    where a search of every group misses the cache), once for all the consecutive queries of one group."""
    n = len(pid)
    code = np.empty(n, np.int64)
    known = np.empty(n, np.bool_)
    hit = np.zeros(n, np.bool_)
    exact = np.empty(n, np.bool_)
    row = np.zeros(n, np.int64)
    last_code = max(len(pids) - 1, 0)
    c = g = 0
    is_known = found = False
    for j in range(n):
        if j == 0 or pid[j] != pid[j - 1] or step[j] != step[j - 1]:
            c = min(np.searchsorted(pids, pid[j]), last_code)
            is_known = len(pids) > 0 and pids[c] == pid[j]
            found = False
            if is_known:
                lo, hi = prompt_lo[c], prompt_hi[c]
                at = lo + np.searchsorted(prompt_step[lo:hi], step[j])
                found = at < hi and prompt_step[at] == step[j]
                if found:
                    g = prompt_group[at]
        code[j] = c
        known[j] = is_known
        hit[j] = found
        exact[j] = found and sample[j] < group_count[g]
        if exact[j]:
            row[j] = group_start[g] + sample[j]
    return code, known, hit, exact, row


@kernel(I64S_IN, BOOLS_IN, I64S_IN, F64S_IN, I64S_IN, I64S_IN, I64S_IN, BOOLS_IN, F64)
def answer_rows(rec_length, rec_stopped, rec_max, rec_reward, rec_reason, row, budget, exact, low):
    """`Workload._from_row` of each (row, budget), where one row answers it: the length, the reward, the reason as a
    number into `_ArrayIndex.answer_reasons` (0 cut at the budget, 1 ended by itself, 2 + the trace's own reason:
    as recorded), whether it was cut, and whether the scalar model must answer it (recorded cut short, asked with
    more budget)."""
    n = len(row)
    length = np.empty(n, np.int64)
    reward = np.empty(n)
    reason = np.empty(n, np.int64)
    cut = np.empty(n, np.bool_)
    scalar = np.empty(n, np.bool_)
    for j in range(n):
        r, b = row[j], budget[j]
        stopped, rec = rec_stopped[r], rec_length[r]
        as_recorded = not stopped and exact[j] and b == rec_max[r]
        natural = (stopped and rec <= b) or as_recorded
        cut[j] = not natural and (stopped or b <= rec)
        scalar[j] = not natural and not cut[j]
        length[j] = rec if natural else b
        reward[j] = rec_reward[r] if natural else low
        reason[j] = 0 if cut[j] else 2 + rec_reason[r] if as_recorded else 1 if stopped else 0
    return length, reward, reason, cut, scalar


@kernel(*(I64S_IN,) * 6, I64, *(I64S_IN,) * 4)
def resampled_rows(prompt_step, prompt_lo, prompt_hi, prompt_group, group_start, group_count, seed, step, code, pid, sample):
    """The row answering each query of a known prompt at a step the trace did not record it at (lookup_many's
    resampling): its nearest recorded step (`_nearest_many`; the earlier on a tie), that group, and the sample
    drawn there (`Workload._resample`'s rotation, or a draw past the group's size). A group's members are consecutive
    queries of one (step, prompt): searched (among the prompt's own recorded steps) and hashed once for all of them."""
    n = len(step)
    rows = np.empty(n, np.int64)
    start = count = rotate = 0
    for j in range(n):
        s, c = step[j], code[j]
        if j == 0 or s != step[j - 1] or c != code[j - 1] or pid[j] != pid[j - 1]:
            lo, hi = prompt_lo[c], prompt_hi[c]
            g = prompt_group[_nearest_place(prompt_step, lo, hi, lo + np.searchsorted(prompt_step[lo:hi], s), s)]
            start, count = group_start[g], group_count[g]
            rotate = np.int64(np.floor(_hash01_words(seed, s, pid[j], 0, 2) * count))
        if sample[j] < count:
            rows[j] = start + (sample[j] + rotate) % max(count, 1)
        else:
            rows[j] = start + np.int64(np.floor(_hash01_words(seed, s, pid[j], sample[j], 3) * count))
    return rows


@kernel(I64S_IN, I64, I64, I64, I64)
def _nearest_place(sorted_steps, lo, hi, i, step):
    """Where in sorted_steps[lo:hi] the step nearest to `step` is (the earlier one on a tie), `i` being `step`'s place
    there (bisect_left): `_nearest_at`'s answer, as a place (the resampling reads that entry's group)."""
    if i == lo:
        return lo
    if i == hi:
        return max(hi - 1, lo)
    return i if sorted_steps[i] == step or sorted_steps[i] - step < step - sorted_steps[i - 1] else i - 1


@kernel(I64S_IN, I64, I64, I64, I64)
def _nearest_at(sorted_steps, lo, hi, i, step):
    """`Workload._nearest`: the step of sorted_steps[lo:hi] nearest to `step` (the earlier one on a tie), `i` being
    `step`'s place there (bisect_left)."""
    return sorted_steps[_nearest_place(sorted_steps, lo, hi, i, step)]


@kernel(*(I64S_IN,) * 6)
def nearest_many(sorted_steps, lo, hi, step, keys, query):
    """`_nearest_at` of each step within its sorted_steps[lo:hi]. `keys` are the sorted (range, step) pairs as one int
    and `query` each step's pair: one search finds its place in its range (other ranges' keys sort outside it)."""
    at = np.searchsorted(keys, query)
    out = np.empty(len(step), np.int64)
    for j in range(len(step)):
        out[j] = _nearest_at(sorted_steps, lo[j], hi[j], at[j], step[j])
    return out


def drawn_ahead(steps, prompts, samples, batches) -> dict[tuple[int, int], list[tuple[int, int]]]:
    """(loader batch, prompt) -> the (step, sample) of each of its responses, in order, for the rows a run recorded at
    a step other than their batch's (the trace's `batch` column); empty for a trace without them."""
    ahead = np.flatnonzero((batches >= 0) & (batches != steps))
    out: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for i in ahead[np.lexsort((samples[ahead], steps[ahead]))].tolist():
        out.setdefault((int(batches[i]), int(prompts[i])), []).append((int(steps[i]), int(samples[i])))
    return out
