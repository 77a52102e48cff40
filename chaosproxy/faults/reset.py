from __future__ import annotations

from typing import Literal

from pydantic import Field

from chaosproxy.engine.actions import Reset as ResetAction
from chaosproxy.engine.message import Phase
from chaosproxy.faults.base import Component, Fault, FaultContext, Level, register


@register
class Reset(Fault):
    """Drop the connection with a TCP reset: before any response, or after after_bytes of the body."""

    type: Literal["reset"] = "reset"
    after_bytes: int | None = Field(None, ge=0, description="relay this much of the response first")

    component = Component.TRANSITION
    level = Level.TRANSPORT

    @property
    def phase(self) -> Phase:
        return Phase.REQUEST if self.after_bytes is None else Phase.RESPONSE

    def act(self, ctx: FaultContext) -> ResetAction:
        return ResetAction(self.after_bytes)
