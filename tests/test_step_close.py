"""lssim.loop.closed_books: an event-route step's responses gathered into columns once, against gathering each object.

The closed columns must hold what RequestColumns.of reads from the objects (on the cut route, the rows of the
responses that ended in the cut read from its submission's columns); the done groups must hand a policy the very
objects and the trainer the same columns; the books must be the ones gathered object by object.
"""

from dataclasses import fields

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from lssim.loop.columns import RequestColumns, gather, natural_outcomes
from lssim.loop.core import ABORT, Group, Request, RolloutState, field_of
from lssim.loop.closed_books import close_step, held_rows, with_rows
from lssim.loop.records import StepEnd, StepState

ARRAYS = [f.name for f in fields(RequestColumns) if f.name != "resumes"]


def same_columns(a: RequestColumns, b: RequestColumns) -> bool:
    return _listed(a.resumes) == _listed(b.resumes) and all(
        getattr(a, n).dtype == getattr(b, n).dtype and np.array_equal(getattr(a, n), getattr(b, n), equal_nan=getattr(a, n).dtype.kind == "f")
        for n in ARRAYS)


def _listed(resumes):
    """RequestColumns.resumes as a list; None where no row resumed (rows taken may keep an array of None)."""
    return None if resumes is None or not resumes.astype(bool).any() else resumes.tolist()


def in_order(s: StepState, objects: list[Request]) -> RequestColumns:
    """The step's closed rows of `objects`, in their order."""
    row_of = dict(zip(map(id, s.closed_objects), s.closed_place.tolist()))
    return s.closed.take(np.array([row_of[id(r)] for r in objects], np.int64))


def made(rng: np.random.Generator, rid: int, group: int) -> Request:
    r = Request(rid=rid, group_id=group, step=int(rng.integers(0, 3)), prompt_id=100 + group, sample_idx=rid % 4,
                prompt_len=int(rng.integers(1, 50)), max_tokens=200, priority=int(rng.integers(0, 3)),
                instance=None if rng.random() < 0.5 else int(rng.integers(0, 3)), seed=int(rng.integers(0, 99)),
                generated=int(rng.integers(0, 200)), first_version=int(rng.integers(0, 3)),
                reward=float(rng.integers(0, 2)), finish_reason=str(rng.choice(["stop", "length", ""])),
                submit_time=float(rng.random()), finish_time=float(rng.random()), ran_on=int(rng.integers(0, 3)))
    if rng.random() < 0.3:
        r.resumes, r.tokens_before_resume = [(r.first_version + 1, r.generated // 2)], r.generated // 2
    return r


@settings(max_examples=100, deadline=None)
@given(sizes=st.lists(st.integers(1, 4), min_size=1, max_size=8), seed=st.integers(0, 2**31), cut=st.booleans())
def test_a_closed_step_holds_what_its_objects_hold(sizes, seed, cut):
    rng = np.random.default_rng(seed)
    groups = [[made(rng, 10 * g + k, g) for k in range(n)] for g, n in enumerate(sizes)]
    fate = {id(r): rng.choice(["ended", "carried", "earlier"]) for members in groups for r in members}
    for r in (r for members in groups for r in members):  # a carried response has not ended; the others have
        r.finish_reason = "" if fate[id(r)] == "carried" else r.finish_reason or ABORT
    s = StepState(step=3, started=0.0, busy_at_start=(0.0, 0.0), rollout=RolloutState(step=3, started=0.0), carried_in=[])
    s.ended = [r for members in groups for r in members if fate[id(r)] == "ended"][::-1]  # in the order they ended
    s.carried_out = [r for members in groups for r in members if fate[id(r)] == "carried"]
    s.context_at_start = {r.rid: r.prompt_len + int(rng.integers(0, 5)) for r in s.ended + s.carried_out}
    done = [members for members in groups if not any(fate[id(r)] == "carried" for r in members)]
    version = 7
    counterfactual = lambda r: None if r.rid % 3 == 0 else (r.rid + 1, r.rid / 7)  # noqa: E731
    if cut:  # some responses ended in a cut rollout: their rows of the submission's columns, filled as they were
        in_cut = [r for r in s.ended if rng.random() < 0.6]
        submission = in_cut + [made(rng, 1000 + i, 99) for i in range(2)]
        queued = [submission[i] for i in rng.permutation(len(submission))]
        columns = RequestColumns.of(queued)
        columns.natural_len[:], columns.natural_reward[:] = natural_outcomes(queued, counterfactual)  # as run_cut does
        row_of = dict(zip(columns.rid.tolist(), range(len(columns))))
        s.cut = (columns, np.array([row_of[r.rid] for r in in_cut], np.int64))  # the step's first ended, in order
        s.cut_objects, s.ended = in_cut, [r for r in s.ended if all(r is not o for o in in_cut)]
    ended_in_order = s.cut_objects + s.ended
    for r in ended_in_order + s.carried_out:
        r.last_version = version
    closed_groups = close_step(s, done, version)

    objects = [r for members in done for r in members]
    objects += [r for r in ended_in_order + s.carried_out if all(r is not o for o in objects)]
    assert same_columns(in_order(s, objects), RequestColumns.of(objects))
    for g, members in zip(closed_groups, done):
        assert g.requests is members and len(g) == len(members)
        for name in ("rid", "generated", "reward", "instance", "finish_reason", "last_version"):
            assert np.array_equal(g.column(name), field_of(members, name), equal_nan=name == "reward")
        keep = rng.random(len(members)) < 0.5
        part = g.subset(keep)
        assert part.requests == [r for r, k in zip(members, keep) if k]
        assert part.column("rid").tolist() == [r.rid for r, k in zip(members, keep) if k]
    own = [Group(g.prompt_id, g.step, g.requests[::-1]) for g in closed_groups]  # a policy's groups of the objects
    own.append(Group(7, 3, [made(rng, 999, 7)]))  # ... and of a copy the step never held
    for g, mine in zip(with_rows(s, own), own):
        assert g.requests is mine.requests and (g.columns is None) == (g.prompt_id == 7)
        assert np.array_equal(g.column("generated"), field_of(mine.requests, "generated"))
    trained, sizes_ = gather(closed_groups)
    assert same_columns(trained, RequestColumns.of(objects[:len(trained)])) and sizes_.tolist() == list(map(len, done))

    end = StepEnd(rollout_end=1.0, step_end=2.0, busy_at_rollout_end=(0.0, 0.0), done_groups=closed_groups,
                  trained=closed_groups, trained_members=(trained, sizes_), trained_rids=np.sort(trained.rid),
                  train_metrics={})
    books = s.books(end, counterfactual)
    ended = RequestColumns.of(ended_in_order, s.context_at_start, counterfactual)
    assert same_columns(books.ended, ended)
    assert same_columns(books.ran, RequestColumns.concat([ended, RequestColumns.of(s.carried_out, s.context_at_start)]))

    # the next step: the carried members end, their groups complete, their earlier members read from the held rows
    waiting = [members for members in groups if any(fate[id(r)] == "carried" for r in members)]
    kept = held_rows(s, [members[0].group_id for members in waiting])  # the waiting groups, by id
    assert (kept is None) == (not any(fate[id(r)] == "ended" for members in waiting for r in members))
    later = StepState(step=4, started=0.0, busy_at_start=(0.0, 0.0), rollout=RolloutState(step=4, started=0.0), carried_in=[])
    later.ended = [r for members in waiting for r in members if fate[id(r)] == "carried"]
    for r in later.ended:
        r.generated, r.finish_reason, r.last_version = r.generated + 1, ABORT, version + 1
    close_step(later, waiting, version + 1, kept)
    members = [r for group_members in waiting for r in group_members]
    assert same_columns(in_order(later, members), RequestColumns.of(members))


def test_a_group_needs_its_members_one_way_or_both():
    r = Request(rid=0, group_id=0, step=0, prompt_id=1, sample_idx=0, prompt_len=3, max_tokens=9, finish_reason=ABORT)
    columns = RequestColumns.of([r])
    both = Group(1, 0, [r], columns=columns, rows=np.arange(1))
    assert both.requests[0] is r and both.column("finish_reason").tolist() == [ABORT]
    for bad in ({}, {"columns": columns}, {"rows": np.arange(1)}):
        try:
            Group(1, 0, **bad)
        except ValueError as e:
            assert "Group" in str(e)
        else:
            raise AssertionError(f"Group(1, 0, **{bad}) was accepted")
