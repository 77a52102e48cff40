from __future__ import annotations

from typing import Literal

from pydantic import Field

from chaosproxy.engine.actions import EndStream, Withhold
from chaosproxy.engine.message import Phase
from chaosproxy.faults._task_state import remembered
from chaosproxy.faults.base import Component, Fault, FaultContext, Level, register
from chaosproxy.protocols import a2a
from chaosproxy.protocols.tasks import INTERRUPTED, TERMINAL


@register
class StreamDrop(Fault):
    """An A2A task stream is cut after N events, without its final event (or loses the events before it)."""

    type: Literal["stream_drop"] = "stream_drop"
    after_events: int = Field(1, ge=0, description="events the agent gets before the drop")
    keep_final: bool = Field(False, description=(
        "false: the stream closes after them, the task's final event never comes; true: the events between "
        "are lost, the final (terminal or input-required) event still comes"))

    component = Component.TRANSITION
    level = Level.A2A
    phase = Phase.RESPONSE
    methods = a2a.STREAMING

    def act(self, ctx: FaultContext) -> EndStream | Withhold | None:
        call = ctx.message.a2a
        if call is None or call.event is None or call.event < self.after_events:
            return None
        # the first stream of the task it met: a resubscription is a new connection, and goes through
        if remembered(ctx, call.task_id or f"stream {call.stream}", call.stream) != call.stream:
            return None
        if not self.keep_final:
            return EndStream(call.event)
        if call.state in TERMINAL or call.state in INTERRUPTED:
            return None
        return Withhold(f"event {call.event} of the stream")
