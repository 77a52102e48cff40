from __future__ import annotations

from typing import Literal, Self

from pydantic import Field, model_validator

from chaosproxy.engine.actions import Truncate as TruncateAction
from chaosproxy.engine.message import Phase
from chaosproxy.faults.base import Component, Fault, FaultContext, Level, register


@register
class Truncate(Fault):
    """Relay only the first bytes (or a fraction) of the response body, then close the connection."""

    type: Literal["truncate"] = "truncate"
    bytes: int | None = Field(None, ge=0)
    fraction: float | None = Field(None, ge=0, lt=1)

    component = Component.TRANSITION
    level = Level.TRANSPORT
    phase = Phase.RESPONSE

    @model_validator(mode="after")
    def _one_limit(self) -> Self:
        if (self.bytes is None) == (self.fraction is None):
            raise ValueError("give exactly one of bytes or fraction")
        return self

    def act(self, ctx: FaultContext) -> TruncateAction:
        return TruncateAction(self.bytes, self.fraction)
