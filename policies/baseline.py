"""baseline -- verl's default: the batch the data loader gives, one budget, first come first served,
and the rollout waits for every response. Every hook is the base class's "no opinion"."""

from lssim.loop.policy import Policy


class Baseline(Policy):
    name = "baseline"
