from __future__ import annotations

from typing import Literal

import orjson

from chaosproxy.engine.actions import Respond
from chaosproxy.engine.message import Phase
from chaosproxy.faults.base import Component, Fault, FaultContext, Level, register


@register
class SessionExpire(Fault):
    """Answer a session's request with 404 as if the server restarted and forgot the session."""

    type: Literal["session_expire"] = "session_expire"

    component = Component.TRANSITION
    level = Level.HTTP
    phase = Phase.REQUEST

    def act(self, ctx: FaultContext) -> Respond | None:
        if "Mcp-Session-Id" not in ctx.message.headers:
            return None  # no session to lose (stateless era, or before initialize)
        rpc = ctx.message.rpc or {}
        body = orjson.dumps({"jsonrpc": "2.0", "id": rpc.get("id"),
                             "error": {"code": -32001, "message": "Session not found"}})
        return Respond(404, body, {"Content-Type": "application/json"})
