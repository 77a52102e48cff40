from __future__ import annotations

from typing import Literal

from pydantic import Field

from chaosproxy.engine.actions import FailStream
from chaosproxy.engine.message import Phase
from chaosproxy.faults._llm import LlmFault
from chaosproxy.faults.base import Component, FaultContext, register
from chaosproxy.protocols.llm import errors
from chaosproxy.protocols.llm.view import STREAM_EVENT


@register
class LlmStreamErrorFault(LlmFault):
    """End a streamed model reply mid-way, after a 200, with the provider's own error event."""

    type: Literal["llm_stream_error"] = "llm_stream_error"
    kind: errors.Kind = Field("overloaded", description="which error the event reports (see llm_error)")
    after_events: int = Field(2, ge=0, description=(
        "events the agent gets before the error event (0: right after the 200); a shorter reply ends as it "
        "would, and the fault does not fire"))

    component = Component.TRANSITION
    phase = Phase.RESPONSE
    target = "completion"
    # Asked where a stream is `after_events` events in, with the next one about to go: it fires when sent.
    methods = frozenset({STREAM_EVENT})

    def act(self, ctx: FaultContext) -> FailStream | None:
        msg = ctx.message
        rpc = msg.rpc or {}
        if msg.api is None or (rpc.get("params") or {}).get("relayed") != self.after_events:
            return None
        event, data = errors.stream_error(msg.api, self.kind, msg.model)
        return FailStream(self.after_events, event, data, errors.error_name(msg.api, self.kind))
