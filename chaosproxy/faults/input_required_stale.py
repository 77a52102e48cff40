from __future__ import annotations

from typing import Literal

from pydantic import Field

from chaosproxy.engine.actions import Reply
from chaosproxy.engine.message import Phase
from chaosproxy.faults._input_required import ROUND_METHODS, params_of
from chaosproxy.faults.base import Component, Fault, FaultContext, Level, register
from chaosproxy.protocols.mcp import error_reply

INVALID_PARAMS = -32602
# What the Python SDK's servers say, whatever the real reason (mcp.server.request_state)
STALE = "Invalid or expired requestState"


@register
class InputRequiredStale(Fault):
    """The server rejects the requestState an answer echoes as expired (-32602): the agent must start over."""

    type: Literal["input_required_stale"] = "input_required_stale"
    message: str = Field(STALE, min_length=1, max_length=512, description="the error's message")

    component = Component.TRANSITION
    level = Level.JSONRPC
    phase = Phase.REQUEST
    methods = ROUND_METHODS

    def act(self, ctx: FaultContext) -> Reply | None:
        msg = ctx.message
        if params_of(msg.rpc).get("requestState") is None or "method" not in (msg.rpc or {}):
            return None  # a first round, or one the server sent no state for: nothing to expire
        return Reply(error_reply(msg, INVALID_PARAMS, self.message, {"reason": "invalid_request_state"}))
