"""Timing batches on the real engine, for the profile (real_backend.profile), the layouts (real_backend.layout) and
the speed probe (real_backend.speed_probe), with the engine serving the cell's prompts for exactly max_tokens tokens
(VLLMEngine.serving_exactly): one batch submitted at once and timed to each request's last token (`time_cell`), the
long-tailed lengths such batches are drawn with (`longtail_lengths`), and cells of random prompts (`random_requests`).
"""

from __future__ import annotations

import numpy as np

from lssim.loop.core import Request


def longtail_lengths(rng, n: int, length: int) -> list[int]:
    """n lengths from a lognormal with median length/4 capped at `length`: about 5% at the cap, like the
    reference task's responses (real_backend/TASK.md)."""
    return np.clip(np.round(rng.lognormal(np.log(length / 4), 0.85, size=n)), 1, length).astype(int).tolist()


def random_requests(rng, vocab: int, lengths, first_rid: int, prompt_len: int,
                    instance: int | None = None) -> tuple[dict[int, list[int]], list[Request]]:
    """One request per budget in `lengths`, each with a fresh random `prompt_len`-token prompt (distinct prompts: no
    prefix-cache hits, as for a run's), rids (and prompt ids) from `first_rid` on: their prompts (prompt id ->
    tokens, for VLLMEngine.serving_exactly) and the requests. Per request the prompt is drawn, then the seed."""
    prompts, requests = {}, []
    for rid, tokens in enumerate(lengths, start=first_rid):
        prompts[rid] = rng.integers(0, vocab, size=prompt_len).tolist()
        requests.append(Request(rid=rid, group_id=rid, step=0, prompt_id=rid, sample_idx=0, prompt_len=prompt_len,
                                max_tokens=int(tokens), seed=int(rng.integers(1 << 30)), instance=instance))
    return prompts, requests


def time_cell(engine, requests: list[Request]) -> dict[int, float]:
    """Submit at once, wait for every finish: rid -> seconds from submission to its last token."""
    t0, finish = engine.now(), {}
    engine.submit(requests)
    while len(finish) < len(requests):
        for ev in engine.next_events():
            if ev.kind == "finished":
                finish[ev.request.rid] = ev.time - t0
    return finish
