"""real_backend/speculation_fit.py (and the experiment paper/experiments/measure_speculation.py) without vLLM: a fake engine that speaks VLLMEngine's protocol and vLLM's
stat-logger records, so the cells, the per-step rows, the summary and the refit are checked end to end."""

import json
import time
import types

import pandas as pd
import pytest

from lssim.loop.core import Event
from paper.experiments.measure_speculation import plain_check
from real_backend import speculation_fit as ms
from real_backend.spec_stats import SpecCounts


class FakeEngine:
    """Each request generates 20 + prompt_id % 7 tokens, one per step; drafting (limit > 0) drafts 4 tokens per
    running request and gets half a token accepted per request."""

    def __init__(self, speculation=True):
        self.speculation = object() if speculation else None
        self._spec = SpecCounts(keep_iterations=True)
        self.limit, self.limits = None, []
        self.prompt_tokens = lambda p: [1] * 7

    def set_draft_limit(self, n):
        self.limit = n
        self.limits.append(n)

    def set_progress_interval(self, n):
        pass

    def reset_spec_counters(self):
        self._spec.reset()

    def spec_counters(self):
        return self._spec.snapshot()

    def submit(self, requests):
        self.requests, self.k = list(requests), 0
        for r in self.requests:
            r.tokens = []

    def next_events(self):
        self.k += 1
        live = [r for r in self.requests if len(r.tokens) < 20 + r.prompt_id % 7]
        n, on = len(live), bool(self.limit)
        d = types.SimpleNamespace(num_drafts=n * on, num_draft_tokens=4 * n * on, num_accepted_tokens=(n // 2) * on,
                                  num_accepted_tokens_per_pos=[0, 0, 0, 0])
        self._spec.add(types.SimpleNamespace(spec_decoding_stats=d, num_running_reqs=n),
                       types.SimpleNamespace(iteration_timestamp=time.time(), num_generation_tokens=n, num_prompt_tokens=0))
        events = []
        for r in live:
            r.tokens.append(5)
            if len(r.tokens) == 20 + r.prompt_id % 7:
                events.append(Event("finished", r, 0.0))
        return events


def test_measure_runs_each_cell_on_off_and_alternating_and_refits(tmp_path):
    engine = FakeEngine()
    cells, steps = ms.measure(engine, list(range(50)), [1, 4], 64, repeats=2, seed=0, progress=lambda s: None)
    assert sorted(cells.groupby("cell")["mode"].apply(sorted).map(tuple).unique()) == [("alt", "off", "on")]
    assert cells["same_tokens"].all() and set(cells["batch"]) == {1, 4} and len(cells) == 2 * 2 * 3
    assert 0 in engine.limits and 4 in engine.limits  # the proposer was switched off and on
    on = steps[steps["mode"] == "on"]
    assert (on["draft_tokens"] == 4 * on["drafts"]).all() and (steps.loc[steps["mode"] == "off", "drafts"] == 0).all()
    plain, figures = plain_check(FakeEngine(speculation=False), cells, 64)
    assert (plain["mode"] == "plain").all() and figures["cells"] == 2 and figures["spec_engine_off_over_plain"] > 0
    cells = pd.concat([cells, plain], ignore_index=True)
    summary = {"kind": "speculation_profile", "gamma": 4, **ms.summarize(cells, steps)}
    assert set(summary["by_batch"]) == {1, 4} and summary["by_batch"][4]["same_tokens"] is True
    assert summary["by_batch"][4]["accepted_per_draft"] == pytest.approx(0.5, abs=0.15)
    out = tmp_path / "spec.json"
    ms.write(out, summary, cells, steps)
    refitted = ms.refit(out, ms.Path(ms.__file__).parent / "data" / "profile_cpu.json")
    on_disk = json.loads(out.read_text())
    assert on_disk["fit"]["params"] == refitted["fit"]["params"] and "held_out" in on_disk["fit"]
    assert {c["batch"] for c in on_disk["fit"]["held_out"]["cells"]} == {1, 4}
