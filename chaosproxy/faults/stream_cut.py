from __future__ import annotations

from typing import Literal

from pydantic import Field

from chaosproxy.engine.actions import CutStream
from chaosproxy.engine.message import Phase
from chaosproxy.faults.base import Component, Fault, FaultContext, Level, register


@register
class StreamCut(Fault):
    """End an SSE stream after N events, or keep it open but silent (then: idle)."""

    type: Literal["stream_cut"] = "stream_cut"
    after_events: int = Field(0, ge=0)
    then: Literal["close", "idle"] = "close"

    component = Component.TRANSITION
    level = Level.TRANSPORT
    phase = Phase.RESPONSE

    def act(self, ctx: FaultContext) -> CutStream | None:
        if "text/event-stream" not in ctx.message.headers.get("Content-Type", ""):
            return None
        return CutStream(self.after_events, idle=self.then == "idle")
