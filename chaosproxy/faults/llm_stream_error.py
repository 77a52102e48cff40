from __future__ import annotations

from typing import Literal

from pydantic import Field

from chaosproxy.faults._llm import LlmFault, is_stream
from chaosproxy.faults.base import Component, FaultContext, register
from chaosproxy.llm import errors
from chaosproxy.llm.actions import StreamError
from chaosproxy.llm.view import COMPLETION
from chaosproxy.message import Phase


@register
class LlmStreamError(LlmFault):
    """End a streamed model reply mid-way, after a 200, with the provider's own error event."""

    type: Literal["llm_stream_error"] = "llm_stream_error"
    kind: errors.Kind = Field("overloaded", description="which error the event reports (see llm_error)")
    after_events: int = Field(2, ge=0, description="events relayed before the error event")

    component = Component.TRANSITION
    acts_on = Phase.RESPONSE
    target = "completion"

    def act(self, ctx: FaultContext) -> StreamError | None:
        msg = ctx.message
        if msg.api is None or msg.method != COMPLETION or not is_stream(msg):
            return None
        event, data = errors.stream_error(msg.api, self.kind, msg.model)
        return StreamError(self.after_events, event, data)
