from __future__ import annotations

import random
from typing import Literal, Self

from pydantic import Field, model_validator

from chaosproxy.engine.actions import Delay
from chaosproxy.engine.message import Phase
from chaosproxy.faults.base import (
    MAX_WAIT_MS,
    Component,
    Fault,
    FaultContext,
    Level,
    phase_parameter,
    register,
)


@register
class Latency(Fault):
    """Delay the request (or the response) by a fixed, jittered or randomly distributed time."""

    type: Literal["latency"] = "latency"
    delay_ms: float = Field(ge=0, le=MAX_WAIT_MS, description="fixed: the delay; normal: mean; lognormal: "
                                                              "median; uniform: lower bound; pareto: scale")
    jitter_ms: float = Field(0, ge=0, le=MAX_WAIT_MS, description="fixed: +/- uniform jitter; normal: std deviation")
    distribution: Literal["fixed", "uniform", "normal", "lognormal", "pareto"] = "fixed"
    sigma: float = Field(0.5, gt=0, description="lognormal: shape")
    alpha: float = Field(2.0, gt=0, description="pareto: shape (smaller = heavier tail)")
    max_ms: float | None = Field(None, ge=0, le=MAX_WAIT_MS, description="uniform: upper bound; others: a cap")
    # (a parameter where other faults have a class attribute)
    phase: Phase = phase_parameter("delay the request before forwarding, or the response")  # type: ignore[misc]

    component = Component.TRANSITION
    level = Level.TRANSPORT

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.distribution == "uniform" and self.max_ms is None:
            raise ValueError("distribution 'uniform' needs max_ms (the upper bound)")
        if self.max_ms is not None and self.max_ms < self.delay_ms:
            raise ValueError(f"max_ms ({self.max_ms}) is below delay_ms ({self.delay_ms})")
        return self

    def sample_ms(self, rng: random.Random) -> float:
        """A delay drawn from the distribution, in ms: never negative, never past max_ms or MAX_WAIT_MS
        (a heavy tail that overflows a float is the longest wait)."""
        try:
            ms = self._draw_ms(rng)
        except OverflowError:
            ms = MAX_WAIT_MS
        ms = min(max(ms, 0.0), MAX_WAIT_MS)
        return min(ms, self.max_ms) if self.max_ms is not None else ms

    def _draw_ms(self, rng: random.Random) -> float:
        match self.distribution:
            case "fixed":
                return self.delay_ms + rng.uniform(-self.jitter_ms, self.jitter_ms) if self.jitter_ms else self.delay_ms
            case "uniform":
                assert self.max_ms is not None  # (_check requires it)
                return rng.uniform(self.delay_ms, self.max_ms)
            case "normal":
                return rng.gauss(self.delay_ms, self.jitter_ms)
            case "lognormal":
                return self.delay_ms * rng.lognormvariate(0.0, self.sigma)
        return self.delay_ms * rng.paretovariate(self.alpha)

    def act(self, ctx: FaultContext) -> Delay:
        return Delay(self.sample_ms(ctx.rng) / 1000)
