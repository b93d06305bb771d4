"""VLLMEngine's events around a wake (real_backend.engine): a wake comes alone, as the simulator's, so the controller
acts on it before anything its streams delivered later is applied. Without vLLM: the queue items are put by hand."""

import threading
import time
from types import SimpleNamespace

from lssim.loop.core import FINISHED, WAKE, Request
from lssim.loop.signals import DEFAULT
from real_backend.engine import _WAKE_KEY, VLLMEngine
from real_backend.engine_books import BusyMeter, StreamInbox
from real_backend.engine_stream import Live


def _engine(requests: list[Request]) -> VLLMEngine:
    eng = VLLMEngine.__new__(VLLMEngine)
    eng._t0, eng._inbox, eng._timers = time.monotonic(), StreamInbox(), []
    eng._pending_wakes, eng._wake_generation, eng._interval = 1, 0, None
    eng._meter, eng.observers = BusyMeter(1), []
    eng.signal_spec, eng.exact_entropy, eng.reward_fn, eng.stall_timeout = DEFAULT, False, None, 5.0
    eng._llm, eng._thread = SimpleNamespace(errored=False, abort=lambda key: None), threading.current_thread()
    eng._call = lambda result, timeout=None: result
    eng._live, eng._by_rid, eng._switch = {}, {}, None
    for r in requests:
        r.tokens, r.signals = [], {"logprobs": [], "entropy": []}
        eng._live[f"{r.rid}.0"], eng._by_rid[r.rid] = Live(r), f"{r.rid}.0"
        eng._meter.in_flight[0] += 1
    return eng


def _request(rid: int) -> Request:
    return Request(rid=rid, group_id=0, step=0, prompt_id=0, sample_idx=rid, prompt_len=4, max_tokens=3)


def test_a_wake_is_delivered_before_a_finish_that_came_after_it_and_that_finish_is_not_applied_yet():
    a, b = _request(0), _request(1)
    eng = _engine([a, b])
    eng._inbox.put(("0.0", 0.1, [5, 6, 7], [-1.0] * 3, [], "length"))  # a finishes, then the train job is done,
    eng._inbox.put((_WAKE_KEY, 0.2, 0, None, None, None))  # then b's last tokens and finish arrive
    eng._inbox.put(("1.0", 0.3, [8, 9, 10], [-1.0] * 3, [], "length"))
    first = eng.next_events()
    assert [(e.kind, e.request) for e in first] == [(FINISHED, a)]
    assert [e.kind for e in eng.next_events()] == [WAKE]
    assert b.generated == 0 and b.finish_reason == ""  # the caller may still abort b and resume it elsewhere
    eng.abort(b)  # (an async mode aborts what is in flight at the wake)
    assert eng.next_events() == []  # b's late finish is not reported: b was aborted
    assert b.generated == 0 and b.finish_reason == ""


def test_a_wake_from_an_earlier_run_is_ignored_and_events_after_it_come_in_one_batch():
    a, b = _request(0), _request(1)
    eng = _engine([a, b])
    eng._pending_wakes, eng._wake_generation = 0, 1  # abort_all started a new generation
    eng._inbox.put(("0.0", 0.1, [5], [-1.0], [], None))
    eng._inbox.put((_WAKE_KEY, 0.2, 0, None, None, None))
    eng._inbox.put(("0.0", 0.3, [6, 7], [-1.0] * 2, [], "length"))
    eng._inbox.put(("1.0", 0.4, [8, 9, 10], [-1.0] * 3, [], "length"))
    assert [(e.kind, e.request) for e in eng.next_events()] == [(FINISHED, a), (FINISHED, b)]
    assert a.tokens == [5, 6, 7] and b.generated == 3


def test_abort_many_aborts_everything_in_flight_with_one_call_and_leaves_what_ended_alone():
    a, b, c = _request(0), _request(1), _request(2)
    eng = _engine([a, b, c])
    calls = []
    eng._llm.abort = lambda keys: calls.append(list(keys))
    eng._inbox.put(("0.0", 0.1, [5, 6, 7], [-1.0] * 3, [], "length"))  # a ends; b has two tokens so far
    eng._inbox.put(("1.0", 0.1, [8, 9], [-1.0] * 2, [], None))
    eng._pending_wakes = 0
    assert [e.request for e in eng.next_events() if e.kind == FINISHED] == [a]
    eng.abort_many([a, b, c])
    assert calls == [["1.0", "2.0"]]  # one call, only what was in flight
    assert b.generated == 2 and b.tokens == [8, 9] and c.generated == 0 and not eng._live
    assert eng._meter.in_flight == [0]
