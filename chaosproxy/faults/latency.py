from __future__ import annotations

from typing import Literal, Self

from pydantic import Field, model_validator

from chaosproxy.actions import Delay
from chaosproxy.faults.base import Component, Fault, FaultContext, Level, register
from chaosproxy.message import Phase


@register
class Latency(Fault):
    """Delay the request (or the response) by a fixed, jittered or randomly distributed time."""

    type: Literal["latency"] = "latency"
    delay_ms: float = Field(ge=0, description="fixed: the delay; normal: mean; lognormal: median; "
                                              "uniform: lower bound; pareto: scale")
    jitter_ms: float = Field(0, ge=0, description="fixed: +/- uniform jitter; normal: std deviation")
    distribution: Literal["fixed", "uniform", "normal", "lognormal", "pareto"] = "fixed"
    sigma: float = Field(0.5, gt=0, description="lognormal: shape")
    alpha: float = Field(2.0, gt=0, description="pareto: shape (smaller = heavier tail)")
    max_ms: float | None = Field(None, ge=0, description="uniform: upper bound; others: a cap")
    at: Phase = Field(Phase.REQUEST, description="delay the request before forwarding, or the response")

    component = Component.TRANSITION
    level = Level.TRANSPORT

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.distribution == "uniform" and self.max_ms is None:
            raise ValueError("distribution 'uniform' needs max_ms (the upper bound)")
        if self.max_ms is not None and self.max_ms < self.delay_ms:
            raise ValueError(f"max_ms ({self.max_ms}) is below delay_ms ({self.delay_ms})")
        return self

    @property
    def phase(self) -> Phase:
        return self.at

    def sample_ms(self, rng) -> float:
        match self.distribution:
            case "fixed":
                ms = self.delay_ms + rng.uniform(-self.jitter_ms, self.jitter_ms) if self.jitter_ms else self.delay_ms
            case "uniform":
                ms = rng.uniform(self.delay_ms, self.max_ms)
            case "normal":
                ms = rng.gauss(self.delay_ms, self.jitter_ms)
            case "lognormal":
                ms = self.delay_ms * rng.lognormvariate(0.0, self.sigma)
            case "pareto":
                ms = self.delay_ms * rng.paretovariate(self.alpha)
        ms = max(ms, 0.0)
        return min(ms, self.max_ms) if self.max_ms is not None else ms

    def act(self, ctx: FaultContext) -> Delay:
        return Delay(self.sample_ms(ctx.rng) / 1000)
