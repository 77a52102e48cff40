from __future__ import annotations

import fnmatch
from typing import Literal

from pydantic import Field

from chaosproxy.engine.actions import Notify, Rewrite
from chaosproxy.engine.message import Phase
from chaosproxy.faults._effects import with_tools
from chaosproxy.faults._tool_routes import name_of
from chaosproxy.faults.base import LISTINGS, RESULTS, Component, Fault, FaultContext, Level, register
from chaosproxy.protocols import mcp


@register
class RemoveTool(Fault):
    """Hide tools from tools/list: always, or once the session has made N tool calls (a rug pull)."""

    type: Literal["remove_tool"] = "remove_tool"
    tool: str = Field(description="glob of the tools to hide")
    after_calls: int = Field(0, ge=0, description="hide once the session has made this many tool calls; "
                                                  "0: from the start")
    notify: bool = Field(False, description="send notifications/tools/list_changed with the reply to the call "
                                            "that triggers the rug pull")

    component = Component.ACTION
    level = Level.MCP
    phase = Phase.RESPONSE
    methods = LISTINGS | RESULTS
    # It leaves no routes, but the engine counts a session's tool calls only when it sees them.
    routes_calls = True

    def act(self, ctx: FaultContext) -> Rewrite | Notify | None:
        if ctx.session.tool_calls < self.after_calls:
            return None
        if self.notify and mcp.call_result(ctx.message) is not None and not ctx.state.get("notified"):
            ctx.state["notified"] = True  # the tool list changed under the agent: say so, once
            return Notify({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"})
        tools = mcp.listed_tools(ctx.message)
        if tools is None:
            return None
        kept = [tool for tool in tools if (name := name_of(tool)) is None
                or not fnmatch.fnmatchcase(name, self.tool)]
        return with_tools(ctx.message, kept) if len(kept) < len(tools) else None
