"""Carried responses as rows across steps (lssim.loop.row_requests.CarriedRows): the carry route carries them out as
rows of its submission and resubmits them as rows; an object is made only where one is read (between steps: held(),
carried, a checkpoint's state), and reads what the event engine's object holds then.
"""

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lssim.loop.columns import RequestColumns
from lssim.loop.controller import Controller, RunConfig
from lssim.loop.core import note_resume
from lssim.loop.cut_books import resume_rows
from lssim.loop.modes import ModeConfig
import lssim.loop.rollout_books as rollout_books
from lssim.loop.row_requests import CarriedRows, GroupRows
from lssim.loop.policy import make_policy
from lssim.sim.trainer import SimTrainer
from lssim.sim.world import EngineConfig, SimEngine
from lssim.traces.workload import OracleLengths, Workload
from test_fastpath import ROOFLINE, TRAIN, make_trace

FIELDS = ("rid", "group_id", "generated", "first_version", "last_version", "tokens_before_resume", "reward", "ran_on",
          "submit_time", "first_token_time", "finish_time", "exact", "finish_reason", "stop_reason")


@settings(max_examples=100, deadline=None)
@given(data=st.data(), n=st.integers(1, 10), version=st.integers(0, 4))
def test_rows_resume_as_their_objects_do(data, n, version):
    """resume_rows of columns equals note_resume of each object made of them."""
    columns = RequestColumns.planned(rid=np.arange(n), prompt_len=np.full(n, 5))
    columns.generated[:] = data.draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))
    columns.first_version[:] = data.draw(st.lists(st.integers(-1, 4), min_size=n, max_size=n))
    spans = st.none() | st.lists(st.tuples(st.integers(0, 4), st.integers(1, 3)), min_size=1, max_size=3)
    resumes = data.draw(st.lists(spans, min_size=n, max_size=n))
    columns.resumes = None if resumes.count(None) == n else np.fromiter(resumes, object, n)
    objects = columns.to_requests()
    for r in objects:
        note_resume(r, version)
    resume_rows(columns, version)
    expected = RequestColumns.of(objects)
    for name in ("first_version", "tokens_before_resume", "generated"):
        assert getattr(columns, name).tolist() == getattr(expected, name).tolist()
    got = [None] * n if columns.resumes is None else columns.resumes.tolist()
    assert got == [r.resumes for r in objects]


def controller(trace, batch_route: bool, policy=None) -> tuple[Controller, SimEngine]:
    wl = Workload(trace)
    engine = SimEngine(wl, ROOFLINE, EngineConfig(2, 4, 100_000), batch_route=batch_route)
    cfg = RunConfig(steps=2 * len(wl.steps), groups_per_step=wl.groups_per_step, group_size=wl.group_size,
                    max_tokens=wl.max_tokens, total_groups=wl.groups_in(len(wl.steps)), seed=3)
    modes = ModeConfig(mode="collocated", rollout_devices=2, train_devices=2)
    ctl = Controller(engine, SimTrainer(engine, TRAIN, n_devices=2, collocated=True), wl,
                     policy or make_policy("segment(window=128, extend=0.5)"), cfg, mode=modes.build(),
                     oracle_length=OracleLengths(wl))
    return ctl, engine


def held_rows(ctl: Controller) -> dict[str, pd.DataFrame]:
    """Every response held between steps, by where, as the fields its object holds."""
    return {where: pd.DataFrame({name: [getattr(r, name) for r in held] for name in FIELDS})
            for where, held in ctl.held().items()}


@pytest.mark.parametrize("read_every", [1, 2, 0])
def test_objects_read_between_steps_are_the_event_engines(monkeypatch, read_every):
    """Objects made between steps (every step, every other one, never) hold what the event engine's objects hold, and
    reading them changes nothing: the frames equal the event engine's; a group's rewards, as its counters read them when
    it is done, are the event engine's too (a member carried over several steps read where it ran last)."""
    trace = make_trace(np.random.default_rng(11), 6, 6, 4, 700)  # long enough to be carried over several steps
    fast, _ = controller(trace, batch_route=True)
    slow, _ = controller(trace, batch_route=False)
    assert fast._cut and not slow._cut
    running, done = [None], {id(fast): {}, id(slow): {}}  # each group's rewards when done, by run
    group_done, groups_done = rollout_books._group_done, rollout_books._groups_done

    def note(gid, s):
        members = s.members[gid]
        if not isinstance(members, np.ndarray):  # (a group booked as rows is counted apart, over arrays)
            done[id(running[0])][gid] = members.rewards() if isinstance(members, GroupRows) else [r.reward for r in members]

    def noted(gid, s):
        note(gid, s)
        group_done(gid, s)

    def all_noted(gids, s):
        for gid in gids:
            note(gid, s)
        groups_done(gids, s)

    monkeypatch.setattr(rollout_books, "_group_done", noted)
    monkeypatch.setattr(rollout_books, "_groups_done", all_noted)
    carried_as_rows = 0
    for step in range(fast.config.steps):
        for ctl in (fast, slow):
            running[0] = ctl
            ctl.run_step(step)
        carried_as_rows += isinstance(fast._carried, CarriedRows)
        assert fast._waiting_groups.keys() == slow._waiting_groups.keys()
        if read_every and step % read_every == 0:
            fast_held, slow_held = held_rows(fast), held_rows(slow)
            for where in slow_held:
                pd.testing.assert_frame_equal(fast_held[where], slow_held[where], check_exact=True)
    assert carried_as_rows > 1 and len(done[id(fast)]) > 3
    for gid, rewards in done[id(fast)].items():
        np.testing.assert_array_equal(rewards, done[id(slow)][gid])
    fast_result, slow_result = fast.result(), slow.result()
    pd.testing.assert_frame_equal(fast_result.steps, slow_result.steps, check_exact=True)
    pd.testing.assert_frame_equal(fast_result.responses, slow_result.responses, check_exact=True)


def test_a_checkpoint_between_steps_holds_the_carried_rows_as_objects():
    """state() makes the objects of responses carried as rows (and of their open groups' members); a controller restored
    from it goes on as the uninterrupted run (the clock aside: its engine is new)."""
    import pickle

    trace = make_trace(np.random.default_rng(11), 4, 6, 4, 300)
    straight, _ = controller(trace, batch_route=True)
    expected = straight.run()
    first, _ = controller(trace, batch_route=True)
    first.run_step(0)
    first.run_step(1)
    assert isinstance(first._carried, CarriedRows) and len(first._carried)
    state = pickle.loads(pickle.dumps(first.state()))
    assert [r.rid for r in state["carried"]] == first._carried.rids().tolist()
    resumed, _ = controller(trace, True, first.policy)  # (the policy object travels beside the state: a checkpoint pickles both)
    resumed.restore(state)
    result = resumed.run(first_step=2)
    same = [c for c in expected.responses.columns if c not in ("submit_time", "first_token_time", "finish_time")]
    pd.testing.assert_frame_equal(result.responses[same], expected.responses[same], check_exact=True)


def test_a_run_keeps_only_the_submissions_that_open_responses_ran_in():
    """Submissions are linked only while rows carried out of them are still to be written back or read: a long run
    does not keep every step's submission alive (each one linked to the one before it would)."""
    import gc

    from lssim.loop.row_requests import RowRequests

    trace = make_trace(np.random.default_rng(11), 12, 6, 4, 700)
    ctl, _ = controller(trace, batch_route=True)
    alive = []
    for step in range(ctl.config.steps):
        ctl.run_step(step)
        gc.collect()
        alive.append(sum(isinstance(o, RowRequests) for o in gc.get_objects()))
    # bounded by the steps a response is carried through (700 tokens, a window of 128: up to 6), not the run's 24 steps
    assert len(alive) >= 20 and max(alive) <= 8 and alive[-1] == 0, alive
