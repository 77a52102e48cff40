from __future__ import annotations

from typing import Literal, Self

from pydantic import Field, model_validator

from chaosproxy.engine.actions import Reset as ResetAction
from chaosproxy.engine.message import Phase
from chaosproxy.faults.base import MAX_WAIT_MS, Component, Fault, FaultContext, Level, register


@register
class Reset(Fault):
    """Drop the connection with a TCP reset: before any response, or after after_bytes of the body."""

    type: Literal["reset"] = "reset"
    after_bytes: int | None = Field(None, ge=0, description="relay this much of the response first")
    after_ms: float | None = Field(None, gt=0, le=MAX_WAIT_MS, description="hold the request this long first "
                                   "(nothing goes upstream), as Toxiproxy's reset_peer with a timeout")

    component = Component.TRANSITION
    level = Level.TRANSPORT

    @model_validator(mode="after")
    def _one_wait(self) -> Self:
        if self.after_ms is not None and self.after_bytes is not None:
            raise ValueError("give after_ms (before any response) or after_bytes (into the response), not both")
        return self

    @property  # (its parameters decide it, where other faults have a class attribute)
    def phase(self) -> Phase:  # type: ignore[override]
        return Phase.REQUEST if self.after_bytes is None else Phase.RESPONSE

    def act(self, ctx: FaultContext) -> ResetAction:
        return ResetAction(self.after_bytes, (self.after_ms or 0) / 1000)
