"""Timing batches on the real engine, for the profile (real_backend.profile), the layouts (real_backend.layout) and
the speed probe (real_backend.speed_probe), with the engine serving the cell's prompts for exactly max_tokens tokens
(VLLMEngine.serving_exactly): one batch submitted at once and timed to each request's last token (`time_cell`), and
the long-tailed lengths such batches are drawn with (`longtail_lengths`).
"""

from __future__ import annotations

import numpy as np

from lssim.loop.core import Request


def longtail_lengths(rng, n: int, length: int) -> list[int]:
    """n lengths from a lognormal with median length/4 capped at `length`: about 5% at the cap, like the
    reference task's responses (real_backend/TASK.md)."""
    return np.clip(np.round(rng.lognormal(np.log(length / 4), 0.85, size=n)), 1, length).astype(int).tolist()


def time_cell(engine, requests: list[Request]) -> dict[int, float]:
    """Submit at once, wait for every finish: rid -> seconds from submission to its last token."""
    t0, finish = engine.now(), {}
    engine.submit(requests)
    while len(finish) < len(requests):
        for ev in engine.next_events():
            if ev.kind == "finished":
                finish[ev.request.rid] = ev.time - t0
    return finish
