from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from chaosproxy.engine.actions import Reply, Rewrite
from chaosproxy.engine.message import Phase
from chaosproxy.faults.base import Component, Fault, FaultContext, Level, phase_parameter, register
from chaosproxy.protocols.mcp import error_reply


@register
class RpcErrorFault(Fault):
    """Answer a JSON-RPC request with an error object (upstream skipped, or its reply replaced)."""

    type: Literal["rpc_error"] = "rpc_error"
    code: int = Field(-32603, description="JSON-RPC error code, e.g. -32603, -32000, -32602")
    message: str = "Internal error"
    data: Any = None
    # (a parameter where other faults have a class attribute)
    phase: Phase = phase_parameter(  # type: ignore[misc]
        "request: upstream never sees the call; response: upstream did the work, the reply is lost")

    component = Component.TRANSITION
    level = Level.JSONRPC

    def act(self, ctx: FaultContext) -> Reply | Rewrite | None:
        rpc = ctx.message.rpc
        if rpc is None or "id" not in rpc:
            return None  # notifications get no reply, so there is nothing to fail
        if ctx.message.phase is Phase.REQUEST:
            return Reply(error_reply(ctx.message, self.code, self.message, self.data)) if "method" in rpc else None
        if "method" in rpc:
            return None  # a request from the server, not a reply
        return Rewrite(error_reply(ctx.message, self.code, self.message, self.data) | {"id": rpc["id"]})
