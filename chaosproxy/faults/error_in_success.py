from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from chaosproxy.actions import Rewrite
from chaosproxy.faults.base import Component, Fault, FaultContext, Level, register
from chaosproxy.mcp import call_result, with_result
from chaosproxy.message import Phase

# How servers word a failure they report as a success: an upstream auth error flattened into text
# (MediaWiki-MCP-Server, opensearch-mcp-server-py #265, tavily-mcp #211).
DEFAULT_MESSAGE = "Error executing tool {tool}: 401 Unauthorized: invalid or expired access token"


@register
class ErrorInSuccess(Fault):
    """Answer a tool call with failure text in a result that claims success (isError: false)."""

    type: Literal["error_in_success"] = "error_in_success"
    message: str = Field(DEFAULT_MESSAGE, min_length=1, description="the failure text; {tool}: the tool's name")
    structured: Literal["keep", "drop", "error"] = Field("keep", description=(
        "structuredContent: keep the real one (clients validating outputSchema accept the result), drop it, "
        "or replace it with {error: message} as some servers do (such clients then reject the result)"))

    component = Component.REWARD
    level = Level.CONTENT
    acts_on = Phase.RESPONSE

    def act(self, ctx: FaultContext) -> Rewrite | None:
        result = call_result(ctx.message)
        if result is None:
            return None
        text = self.message.replace("{tool}", ctx.message.tool or "")
        changed: dict[str, Any] = {**result, "content": [{"type": "text", "text": text}], "isError": False}
        if self.structured == "drop":
            changed.pop("structuredContent", None)
        elif self.structured == "error":
            changed["structuredContent"] = {"error": text}
        return with_result(ctx.message, changed)
