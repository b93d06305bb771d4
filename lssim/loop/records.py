"""The controller's books: what it tracks while a step runs, and the records a step leaves behind.

The controller (lssim.loop.controller) creates a `StepState` when a step starts and fills it as the step runs;
once the step has trained it closes the step with a `StepEnd` and hands both here:

    state.books(end, counterfactual)      the step's responses as columns (StepBooks), from either route
    ResponseTable.settle(end, step)       members that ended in earlier steps, whose groups completed now:
                                          their rows learn whether (and when) they trained
    ResponseTable.add(books, ...)         one row per response that ended in the step (RESPONSE_COLUMNS)
    step_row(state, books, end, ...)      the step's row (RunResult.steps; lssim.loop.step_row)
    step_outcome(state, books, end)       what the policy is told (Policy.end_step; lssim.loop.step_row)

Both worlds and both routes keep the same books: nothing here knows whether the engine is simulated, and past
`StepState.books` nothing knows whether the step ran as Request objects (the event route) or as columns (the
batch route, lssim.sim.fastsim).
"""

from __future__ import annotations

import itertools
import operator
from dataclasses import dataclass, field
from typing import Callable, Collection, Sequence

import numpy as np
import pandas as pd

from lssim.loop.closed_books import natural_outcomes_of
from lssim.loop.columns import GroupBatch, RequestColumns, gather, rid_order, rows_by_rid, rows_of_one, runs, TakenRows, VersionSpans, with_signal
from lssim.loop.core import LENGTH, STOP, Group, Request, RolloutState
from lssim.loop.row_requests import CarriedRows, GroupRows, RowRequests
from lssim.loop.contracts import TrainTiming

# Lower bound of a step's rollout time, given its responses' prompt lengths, context at the start of
# the step (prompt + tokens carried in), tokens generated in the step, and which were still generating when
# it began (None: none). See lssim.sim.bounds.
LowerBound = Callable[..., float]

RESPONSE_COLUMNS = ("step", "end_step", "prompt_id", "sample_idx", "group_id", "prompt_len", "response_len", "max_tokens",
                    "reward", "finish_reason", "stop_reason", "policy_version_first", "policy_version_last",
                    "tokens_before_resume", "instance", "submit_time", "first_token_time", "finish_time", "exact", "trained",
                    "train_step", "off_policy_tokens", "natural_len", "natural_reward", "batch")
# trained / train_step: whether (and in which step) the response's group went to training; a member that ended
#   before its group completed is settled when the group is (partial rollouts), so its row is updated then.
# off_policy_tokens: its leading tokens generated under weights older than those of the step that trained it
#   (lssim.loop.core.off_policy_tokens; for a response never trained, relative to the step it ended in).
# natural_len / natural_reward: what the response would have been had no policy stopped it (the simulator's
#   Workload at its budget; -1 / NaN where the engine cannot tell, as on vLLM: Engine.counterfactual).
# batch: the data loader's batch its group came from (lssim.loop.core.Request.batch; -1: a group the policy chose). A run
#   that draws groups ahead (april) submits batch k + 1's in step k; a trace that keeps the column lets the
#   simulator answer them exactly (lssim.traces.workload.Workload.request_key).


@dataclass(slots=True, eq=False)
class StepState:
    """One step's books, created when the step starts and read by the records when it ends."""

    step: int
    started: float  # the world's clock at the step's start
    busy_at_start: tuple[float, float]  # Engine.utilization() at the step's start
    rollout: RolloutState  # the counters policies read during the rollout
    carried_in: list[Request] | CarriedRows  # unfinished responses of the last step, resubmitted first (as carried out)
    carried_rows: RequestColumns | None = None  # ... their rows as the last step closed them (before they resumed)
    # group id -> every member (carried groups too); on the cut and carry routes (lssim.loop.cut_books), a group whose
    # every member ended in the rollout as its rows of the submission's columns (`cut`: no object made), one with an
    # open member as a GroupRows (objects only of its open members), held so across steps
    members: dict[int, list[Request] | np.ndarray | GroupRows] = field(default_factory=dict)
    open_members: dict[int, int] = field(default_factory=dict)  # group id -> members not yet ended
    # rid -> prompt + tokens generated before the step, of the responses that came into it with tokens (carried in, kept
    # generating); every other response starts the step at its prompt
    context_at_start: dict[int, int] = field(default_factory=dict)
    samples_planned: dict[int, int] = field(default_factory=dict)  # prompt -> samples planned (keeps sample_idx unique)
    fresh: list[Request] = field(default_factory=list)  # submitted by the plan
    fresh_rows_only: int = 0  # ... and booked as rows only (the cut route: no object made)
    topped_up: list[Request] = field(default_factory=list)  # submitted by top-ups during the rollout
    in_flight: dict[int, Request] = field(default_factory=dict)  # rid -> submitted and not yet ended or carried
    ended: list[Request] = field(default_factory=list)  # ended in this step, in the order they ended, after the cut's
    # unfinished, to resume next step (or kept generating); carried out of a carried rollout (lssim.loop.cut_books), as
    # rows of its submission (objects made only where read)
    carried_out: list[Request] | CarriedRows = field(default_factory=list)
    kept_in: list[Request] = field(default_factory=list)  # still generating since an earlier step (async modes)
    version: int = 0  # the weights version on the rollout engine when the step's rollout started
    waited: float = 0.0  # seconds between the last rollout's end and this one's start (weights, switches)
    dropped_groups: set[int] = field(default_factory=set)  # cancelled as stale: never trained
    batch: RequestColumns | None = None  # the batch route: the step's requests as columns (no Request objects)
    batch_ended: np.ndarray | None = None  # ... its rows in the order they ended
    groups_done: GroupBatch | None = None  # ... its groups (all of them end in the step)
    batch_signal: np.ndarray | None = None  # ... whether each group's rewards differ
    # the cut route (lssim.loop.cut_books): its submission's columns, filled as its requests were, and the rows of the
    # responses that ended in the rollout, in the order they ended (the step's first ended, none of them in `ended`)
    cut: tuple[RequestColumns, np.ndarray] | None = None
    cut_objects: list[Request] = field(default_factory=list)  # ... the objects made of those (they hold the rows' values)
    # ... and the submission's rows still open when the rollout left them (running at the cut, carried), with their
    # objects (RowRequests): the step closes them from there (RowRequests.left_open)
    open_cut: tuple[RowRequests, np.ndarray] | None = None
    in_flight_rows: tuple[RowRequests, np.ndarray] | None = None  # a cut's rows still running (cut_books.settle_rows)
    closed: RequestColumns | None = None  # the event route, once the rollout is over: its responses gathered (closed_books.close_step)
    closed_ended: np.ndarray | None = None  # ... the rows of `ended`, in its order
    closed_objects: list[Request] = field(default_factory=list)  # ... the objects gathered
    closed_place: np.ndarray | None = None  # ... and the row of each
    closed_carried: np.ndarray | None = None  # ... the rows of `carried_out`, in its order

    @property
    def ended_count(self) -> int:
        """Responses that ended in the step's rollout: the cut's rows, then `ended`."""
        return len(self.ended) + (len(self.cut[1]) if self.cut is not None else 0)

    def open_carried_rows(self) -> None:
        """The books of responses carried in as rows (CarriedRows) at the step's start, read from their rows as the last
        step closed them (`carried_rows`): each starts the step at its prompt and the tokens it has, an open member of
        its group."""
        rows, open_members = self.carried_rows, self.open_members
        if rows is None or not np.array_equal(rows.rid, self.carried_in.rids()):
            raise RuntimeError(f"step {self.step}: the carried rows are not those the last step closed")
        self.context_at_start.update(zip(rows.rid.tolist(), (rows.prompt_len + rows.generated).tolist()))
        gids, counts = np.unique(rows.group_id, return_counts=True)
        gids = gids.tolist()
        open_members.update(zip(gids, map(operator.add, map(open_members.__getitem__, gids), counts.tolist())))

    def set_last_version(self, version: int) -> None:
        """Every response that ran in the step's rollout last ran under weights `version`: the objects, and the cut's rows
        (a member held as a row makes its object from them: GroupRows)."""
        carried = self.carried_out
        if isinstance(carried, CarriedRows):
            carried.set_last_version(version)
            carried = ()
        for r in itertools.chain(self.cut_objects, self.ended, carried):
            r.last_version = version
        if self.cut is not None:
            self.cut[0].last_version[self.cut[1]] = version

    def batch_groups(self) -> GroupBatch:
        """The batch route's groups, in the order they were planned: rows of the step's columns."""
        # Members in the order they were made, as on the event route (a priority hook may have reordered the rows; the
        # trainer packs members in this order): by (group, rid). Rids are made group after group, so rid order is
        # that order; a batch made otherwise is sorted by both.
        rid, group = self.batch.rid, self.batch.group_id
        order = rid_order(rid)
        ordered = group[order]
        if len(ordered) > 1 and (ordered[1:] < ordered[:-1]).any():
            order = np.lexsort((rid, group))
            ordered = group[order]
        return GroupBatch(self.batch, order, runs(ordered)[1])

    def books(self, end: "StepEnd", counterfactual: Callable[[Request], tuple[int, float] | None]) -> "StepBooks":
        """The step's responses as columns: the same books whichever route the step ran on."""
        running = None
        if self.batch is not None:  # nothing carried in or out of a batch-route step
            ended = ran = self.batch.take(self.batch_ended)
        else:
            if self.closed is None:
                raise RuntimeError(f"step {self.step}: its books are read before the step was closed (closed_books.close_step)")
            ran = self.closed.take(np.concatenate([self.closed_ended, self.closed_carried]))
            self._context_at_start(ran)
            ended = ran.take(slice(0, self.ended_count))  # ran's first rows (views: the books are read-only)
            ended.natural_len[:], ended.natural_reward[:] = natural_outcomes_of(self, counterfactual)
            if self.kept_in:  # still generating when the step began (async): no prefill, maybe mid-iteration
                running = np.isin(ran.rid, [r.rid for r in self.kept_in])
        trained, sizes = end.trained_members
        reasons = ended.finish_reason
        # the rollout's own count where the policy trained the step's groups as they were (rewards are read-only)
        signal = self.batch_signal if end.trained is self.groups_done else with_signal(trained.reward, sizes)
        return StepBooks(ended, ran, running, trained, trained.version_spans(), signal, reasons == STOP, reasons == LENGTH)

    def _context_at_start(self, ran: RequestColumns) -> None:
        """`ran`'s context at the step's start (filled in place): its prompt, plus the tokens it came in with where it
        did (`context_at_start`)."""
        ran.context_at_start[:] = ran.prompt_len
        came_with = self.context_at_start
        if came_with:
            at = rows_by_rid(ran.rid, np.arange(len(ran)), np.fromiter(came_with, np.int64, len(came_with)))
            tokens = np.fromiter(came_with.values(), np.int64, len(came_with))
            ran.context_at_start[at[at >= 0]] = tokens[at >= 0]


@dataclass(slots=True, frozen=True)
class StepBooks:
    """A step's responses as columns (lssim.loop.columns.RequestColumns), for its records."""

    ended: RequestColumns  # ended in the step, in the order they ended (natural_len / natural_reward filled)
    ran: RequestColumns  # generated in the step: ended or carried out (context_at_start filled)
    running: np.ndarray | None  # of `ran`: generating since before the step (async); None: none was
    trained: RequestColumns | TakenRows  # the members of the groups the step trained, group after group
    trained_spans: VersionSpans  # trained's version spans (read once for its row's off-policy tokens and staleness)
    trained_signal: np.ndarray  # per trained group: do its rewards differ
    stopped: np.ndarray  # of `ended`: ended by itself (finish_reason "stop")
    truncated: np.ndarray  # of `ended`: cut at its budget ("length")


@dataclass(slots=True, frozen=True)
class StepEnd:
    """How a step ended: its clock readings, the engine's utilization over its rollout, what trained."""

    rollout_end: float
    step_end: float
    busy_at_rollout_end: tuple[float, float]  # Engine.utilization() when the rollout ended
    done_groups: list[Group]  # groups whose every member has ended (this step or before)
    trained: list[Group]  # what the policy selected from them (possibly subsets or reshaped copies)
    trained_members: tuple  # (RequestColumns or TakenRows, sizes): the trained groups' members, group after group (columns.gather)
    trained_rids: np.ndarray  # rids of the trained responses, sorted (select may train on copies: match by rid)
    train_metrics: dict
    timing: TrainTiming | None = None  # when the training ran (lssim.loop.modes); None: ended with the rollout
    previous_end: float = float("nan")  # when the previous step's training ended (the step's time runs from it)


class ResponseTable:
    """The response rows of a run, a step's columns at a time, with the rows of members whose groups are still open,
    to settle when the groups complete. Numeric columns are written as they come into rows of one preallocated block
    per dtype (`capacity`: the rows a run is expected to make): a block is large enough for the kernel to back it
    with huge pages, and the final frame is a view of it, not a copy made at the end. An outgrown block keeps its
    rows where they are and a block twice its size takes the next ones (copying them into one larger block at every
    doubling cost a 10M-response run a copy of 12M rows of every column); the final frame then gathers the columns
    it is asked for, once."""

    def __init__(self, capacity: int = 0):
        self._capacity = max(0, int(capacity))
        self._columns: dict[str, np.ndarray] = {}  # numeric: rows of blocks, `_capacity` long, [:_rows - _base] written
        self._filled: list[dict[str, np.ndarray]] = []  # outgrown blocks' columns, each cut to the rows written in it
        self._base = 0  # rows in `_filled`
        self._strings: dict[str, list[np.ndarray]] = {name: [] for name in STRING_COLUMNS}  # object chunks
        self._rows = 0
        self._pending: dict[int, int] = {}  # rid -> its row, for members of groups not yet settled
        self._settled: list[tuple[int, int, int]] = []  # (row, train step, off-policy tokens) of members settled later

    def __getstate__(self) -> dict:
        """Only the rows written: the blocks are preallocated for the whole run (a real run bounded by wall-clock asks
        for millions of rows), and a checkpoint pickles the table after every step (it was 556 MB after 127 steps)."""
        state = dict(self.__dict__)
        state["_columns"] = self._gathered(list(self._columns))
        state["_filled"], state["_base"] = [], 0
        state["_capacity"] = self._rows  # the next step's rows grow the blocks again
        return state

    def __setstate__(self, state: dict) -> None:
        chunks = state.pop("_chunks", None)  # a checkpoint written before the blocks: its step chunks, added again
        if chunks is None:
            self.__dict__.update({"_filled": [], "_base": 0, **state})  # (pickled before outgrown blocks were kept apart)
            return
        self.__init__()
        self._pending, self._settled = state["_pending"], state["_settled"]
        for chunk in chunks:
            self._store(chunk)

    def frame(self, columns: Sequence[str] | None = None, *, share: bool = False) -> pd.DataFrame:
        """The rows as one frame: every column of RESPONSE_COLUMNS, or those of `columns`. `share`: the numeric
        columns are views of the table's own blocks (the run is over: nothing is added or settled after); by default
        they are copies, so a frame taken between steps (the real backend writes one each step) stays as taken."""
        wanted = set(RESPONSE_COLUMNS if columns is None else columns)
        names = [c for c in RESPONSE_COLUMNS if c in wanted]
        unknown = wanted - set(RESPONSE_COLUMNS)
        if unknown:
            raise ValueError(f"no response column(s) {', '.join(sorted(unknown))}; there are {', '.join(RESPONSE_COLUMNS)}")
        if not self._columns:  # nothing added (a step with no rows still makes the blocks)
            return pd.DataFrame({name: [] for name in names})
        numeric = [name for name in names if name not in STRING_COLUMNS]
        if share and not self._filled:
            cols = {name: self._columns[name][:self._rows] for name in numeric}
        else:
            cols = self._gathered(numeric)
        cols.update((name, string_column(self._strings[name])) for name in names if name in STRING_COLUMNS)
        cols = {name: cols[name] for name in names}
        if self._settled:
            rows, steps, off = (np.array(x, np.int64) for x in zip(*self._settled))
            for name, value in (("trained", True), ("train_step", steps), ("off_policy_tokens", off)):
                if name in cols:
                    cols[name][rows] = value
        return pd.DataFrame(cols, copy=False)  # the columns are arrays of their own: no copy into consolidated blocks

    def settle(self, end: StepEnd, step: int) -> None:
        """Members of the groups completed this step that ended in earlier steps: trained now, or never."""
        if not self._pending:
            return
        rids, sizes = gather(end.done_groups, "rid")  # the done groups' members, group after group
        pending = np.isin(rids, np.fromiter(self._pending, np.int64, len(self._pending)))
        if not pending.any():
            return
        one = rows_of_one(end.done_groups)
        if one is not None:  # every group rows of one step's columns (close_step's): only the pending rows read, and
            members = TakenRows(one[0], one[1][pending])  # only the columns read below
        else:
            groups = [g for g in end.done_groups if len(g)]  # (reduceat's sums: one per group with members)
            some = np.add.reduceat(pending, (np.cumsum(sizes) - sizes)[sizes > 0]) > 0
            members, _ = gather([groups[i] for i in np.flatnonzero(some).tolist()])  # the groups with pending members
            members = members.take(np.flatnonzero(pending[np.repeat(some, sizes[sizes > 0])]))
        rids = members.rid
        rows = [self._pending.pop(rid) for rid in rids.tolist()]
        trained = in_sorted(rids, end.trained_rids)
        off = members.off_policy_tokens(step)[trained]  # (each row's own)
        self._settled.extend(zip(np.array(rows, np.int64)[trained].tolist(), itertools.repeat(step), off.tolist()))

    def add(self, books: "StepBooks", step: int, started: float, trained_rids: np.ndarray, open_groups: Collection[int]) -> None:
        """A row for each response that ended in the step; one whose group is in `open_groups` (not complete)
        is settled in a later step."""
        e, n = books.ended, len(books.ended)
        if open_groups:
            pending = np.flatnonzero(np.isin(e.group_id, np.fromiter(open_groups, np.int64, len(open_groups))))
            self._pending.update(zip(e.rid[pending].tolist(), (pending + self._rows).tolist()))
        trained_now = in_sorted(e.rid, trained_rids)
        self._store({
            "step": e.step, "end_step": np.full(n, step, np.int64), "prompt_id": e.prompt_id, "sample_idx": e.sample_idx,
            "group_id": e.group_id, "prompt_len": e.prompt_len, "response_len": e.generated, "max_tokens": e.max_tokens,
            "reward": e.reward, "finish_reason": _finish_reasons(books), "stop_reason": coded_if_one(e.stop_reason),
            "policy_version_first": e.first_version, "policy_version_last": e.last_version,
            "tokens_before_resume": e.tokens_before_resume, "instance": np.where(e.ran_on >= 0, e.ran_on, e.instance), "submit_time": e.submit_time - started,
            "first_token_time": e.first_token_time - started, "finish_time": e.finish_time - started, "exact": e.exact,
            "trained": trained_now, "train_step": np.where(trained_now, step, -1),
            "off_policy_tokens": e.off_policy_tokens(step), "natural_len": e.natural_len, "natural_reward": e.natural_reward,
            "batch": e.batch,
        })

    def _store(self, chunk: dict[str, np.ndarray]) -> None:
        """A step's rows written after the others: numeric columns into the current blocks (a new block when they are
        outgrown, a column widened to what np.concatenate would have made of it where needed), string columns kept
        as chunks."""
        n = len(chunk["step"])
        numeric = {name: np.asarray(v) for name, v in chunk.items() if name not in STRING_COLUMNS}
        if not self._columns:
            self._capacity = max(n, self._capacity)
            self._columns = _blocks({name: v.dtype for name, v in numeric.items()}, self._capacity)
        elif self._rows + n - self._base > self._capacity:
            self._filled.append({name: column[:self._rows - self._base] for name, column in self._columns.items()})
            self._base = self._rows
            self._capacity = max(n, 2 * self._capacity)
            self._columns = _blocks({name: column.dtype for name, column in self._columns.items()}, self._capacity)
        at = self._rows - self._base
        for name, values in numeric.items():
            column = self._columns[name]
            if values.dtype != column.dtype:
                column = self._columns[name] = _widened(column, np.result_type(column, values), at)
            column[at:at + n] = values
        for name in STRING_COLUMNS:
            self._strings[name].append(chunk[name])
        self._rows += n

    def _gathered(self, names: list[str]) -> dict[str, np.ndarray]:
        """Copies of the numeric columns `names`, every row written, in blocks by dtype (`_blocks`); a column widened
        in a later block is widened in all."""
        parts = [*self._filled, {name: self._columns[name][:self._rows - self._base] for name in names}]
        out = _blocks({name: np.result_type(*(part[name].dtype for part in parts)) for name in names}, self._rows)
        for name in names:
            np.concatenate([part[name] for part in parts], out=out[name])
        return out


STRING_COLUMNS = ("finish_reason", "stop_reason")


def in_sorted(values: np.ndarray, sorted_keys: np.ndarray) -> np.ndarray:
    """np.isin(values, sorted_keys) for keys already sorted. Rids are numbered in order, so a step's keys span a
    short range: a mask over it answers each value in one lookup (a search per value costs more than sorting both)."""
    if not len(sorted_keys):
        return np.zeros(len(values), bool)
    lo, hi = int(sorted_keys[0]), int(sorted_keys[-1])
    if hi - lo + 1 == len(sorted_keys) and len(values) and lo <= values.min() and values.max() <= hi \
            and (sorted_keys[1:] > sorted_keys[:-1]).all():  # the keys are the whole range (a step that trained all)
        return np.ones(len(values), bool)
    if hi - lo > 8 * (len(sorted_keys) + len(values)):  # spread out: np.isin's sort
        return np.isin(values, sorted_keys)
    mask = np.zeros(hi - lo + 1, bool)
    mask[sorted_keys - lo] = True
    inside = (values >= lo) & (values <= hi)
    return np.where(inside, mask[np.clip(values - lo, 0, hi - lo)], False)


def _blocks(dtypes: dict[str, np.dtype], capacity: int) -> dict[str, np.ndarray]:
    """A column per name, the columns of one dtype as rows of one block (one large allocation is backed by huge
    pages: numpy advises the kernel to for 4 MB and more, where a column of its own would fault every 4 kB)."""
    by_dtype: dict[np.dtype, list[str]] = {}
    for name, dtype in dtypes.items():
        by_dtype.setdefault(np.dtype(dtype), []).append(name)
    out = {}
    for dtype, group in by_dtype.items():
        out.update(zip(group, np.empty((len(group), capacity), dtype)))
    return out


def _widened(column: np.ndarray, dtype: np.dtype, rows: int) -> np.ndarray:
    """`column` as `dtype` (its first `rows` kept) where that is wider than its own; else `column` itself."""
    dtype = np.result_type(column.dtype, dtype)
    if dtype == column.dtype:
        return column
    out = np.empty(len(column), dtype)
    out[:rows] = column[:rows]
    return out


@dataclass(slots=True, frozen=True)
class Coded:
    """A step's string column as numbers into a few words (Arrow turns it into strings without reading a Python
    str per row, which costs ~40 ns each)."""

    codes: np.ndarray  # int8, into words
    words: tuple[str, ...]

    def objects(self) -> np.ndarray:
        return np.array(self.words, dtype=object)[self.codes]


_NATURAL = (LENGTH, STOP)  # _finish_reasons' words: a response that ended by itself or at its budget


def _finish_reasons(books: StepBooks):
    """The ended responses' finish reasons, as numbers where every one ended by itself or at its budget (the books
    have compared them already), else the objects."""
    if (books.stopped | books.truncated).all():
        return Coded(books.stopped.view(np.int8), _NATURAL)
    return books.ended.finish_reason


def coded_if_one(values: np.ndarray):
    """A column of one str throughout (stop_reason: "" unless a policy stopped something) as numbers, else as is."""
    if len(values) and isinstance(values[0], str) and (values == values[0]).all():
        return Coded(np.zeros(len(values), np.int8), (values[0],))
    return values


def string_column(chunks: list):
    """Object arrays of str (or `Coded` ones) as one pandas string column: through Arrow, what pandas would infer
    from the objects (its str dtype) at a fraction of the cost (inferring it from a million Python strings takes
    seconds)."""
    inferred = pd.Series(["x"]).dtype
    try:
        import pyarrow as pa
    except ImportError:
        pa = None
    if pa is None or inferred == object:  # no Arrow, or a pandas that keeps str as objects: pandas infers it
        return np.concatenate([c.objects() if isinstance(c, Coded) else c for c in chunks])
    arrow = pa.chunked_array(_arrow_chunks(pa, chunks), type=pa.large_string())
    return pd.array(arrow, dtype=inferred)


def _arrow_chunks(pa, chunks: list) -> list:
    """The chunks as Arrow string arrays; each run of coded chunks (most runs: every step's) as one take from the
    words of all of them (a take per step costs more than the rows)."""
    out, run = [], []
    for c in [*chunks, None]:
        if isinstance(c, Coded):
            run.append(c)
            continue
        if run:
            vocabulary: dict[str, int] = {}
            codes = [np.array([vocabulary.setdefault(w, len(vocabulary)) for w in r.words], np.int32)[r.codes] for r in run]
            out.append(pa.array(list(vocabulary), type=pa.large_string()).take(pa.array(np.concatenate(codes))))
            run = []
        if c is not None:
            out.append(pa.array(c, type=pa.large_string()))
    return out
