"""What the profile, layout and speed-probe code needs of VLLMEngine besides submit / next_events: serving a cell's
prompts for exactly max_tokens tokens, as VLLMEngine.serving_exactly does, for the tests' fake engines."""

from __future__ import annotations

import contextlib


class ServesExactly:
    """A fake engine's `serving_exactly`: `prompts` served with no reward and ignore_eos; put back after, nothing
    left in flight. The fake keeps `prompt_tokens`, `reward_fn`, `sampling_kwargs` and `abort_all` as VLLMEngine."""

    @contextlib.contextmanager
    def serving_exactly(self, prompts: dict):
        saved = self.prompt_tokens, self.reward_fn, dict(self.sampling_kwargs)
        self.prompt_tokens, self.reward_fn = prompts.__getitem__, None
        self.sampling_kwargs["ignore_eos"] = True
        try:
            yield
        finally:
            self.abort_all()
            self.prompt_tokens, self.reward_fn = saved[0], saved[1]
            self.sampling_kwargs.clear()
            self.sampling_kwargs.update(saved[2])
