from __future__ import annotations

from typing import Literal

from pydantic import Field

from chaosproxy.engine.actions import Drip
from chaosproxy.engine.message import Phase
from chaosproxy.faults.base import MAX_WAIT_MS, Component, Fault, FaultContext, Level, register


@register
class SlowBody(Fault):
    """Drip the response body in small chunks with a pause between them."""

    type: Literal["slow_body"] = "slow_body"
    chunk_bytes: int = Field(64, ge=1)
    delay_ms: float = Field(100, ge=0, le=MAX_WAIT_MS)

    component = Component.TRANSITION
    level = Level.TRANSPORT
    phase = Phase.RESPONSE

    def act(self, ctx: FaultContext) -> Drip:
        return Drip(self.chunk_bytes, self.delay_ms / 1000)
