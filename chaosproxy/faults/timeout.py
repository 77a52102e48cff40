from __future__ import annotations

from typing import Literal

from pydantic import Field

from chaosproxy.engine.actions import Reply
from chaosproxy.engine.message import Phase
from chaosproxy.faults.base import MAX_WAIT_MS, Component, Fault, FaultContext, Level, register
from chaosproxy.protocols.mcp import error_reply, result_reply, tool_error_result


@register
class Timeout(Fault):
    """Answer a request with a message-level timeout: JSON-RPC -32001, or a tool error result."""

    type: Literal["timeout"] = "timeout"
    after_ms: float = Field(0, ge=0, le=MAX_WAIT_MS,
                            description="wait this long before answering, as a real timeout would")
    form: Literal["rpc_error", "tool_error"] = Field(
        "rpc_error", description="rpc_error: -32001 'Request timed out' (the TS SDK's own); "
                                 "tool_error: an isError result saying the tool timed out")

    component = Component.TRANSITION
    level = Level.JSONRPC
    phase = Phase.REQUEST

    def act(self, ctx: FaultContext) -> Reply | None:
        rpc = ctx.message.rpc
        if rpc is None or "method" not in rpc or "id" not in rpc:
            return None
        delay = self.after_ms / 1000
        if self.form == "tool_error" and ctx.message.method == "tools/call":
            text = f"Tool call timed out after {self.after_ms / 1000:g} seconds"
            return Reply(result_reply(ctx.message, tool_error_result(text)), delay)
        return Reply(error_reply(ctx.message, -32001, "Request timed out",
                                 {"timeout": self.after_ms}), delay)
