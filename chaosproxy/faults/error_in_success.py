from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from chaosproxy.engine.actions import Rewrite, Skip
from chaosproxy.engine.message import Phase
from chaosproxy.faults._effects import with_result
from chaosproxy.faults._schema import passed_off_as_success
from chaosproxy.faults.base import RESULTS, Component, Fault, FaultContext, Level, register
from chaosproxy.protocols.mcp import call_result

# How servers word a failure they report as a success: an upstream auth error flattened into text
# (MediaWiki-MCP-Server, opensearch-mcp-server-py #265, tavily-mcp #211).
DEFAULT_MESSAGE = "Error executing tool {tool}: 401 Unauthorized: invalid or expired access token"


@register
class ErrorInSuccess(Fault):
    """Answer a tool call with failure text in a result that claims success (isError: false).

    On A2A the failure text takes the place of what the remote agent says (its first text part, the
    others dropped), and a failed task is reported completed (protocols/a2a/texts).
    """

    type: Literal["error_in_success"] = "error_in_success"
    message: str = Field(DEFAULT_MESSAGE, min_length=1, description="the failure text; {tool}: the tool's name")
    structured: Literal["keep", "drop", "error"] = Field("keep", description=(
        "structuredContent: keep the real one (on a tool error, which has none, one valid for the tool's "
        "outputSchema is made up, so clients validating it accept the result), drop it, or replace it with "
        "{error: message} as some servers do (such clients then reject the result)"))
    respect_schema: bool = Field(True, description=(
        "keep: make up structuredContent valid for the tool's outputSchema when the result has none; "
        "false: leave it without, and validating clients reject the result"))

    component = Component.REWARD
    level = Level.CONTENT
    phase = Phase.RESPONSE
    methods = RESULTS

    @property
    def needs_output_schema(self) -> bool:
        return self.respect_schema and self.structured == "keep"

    def act(self, ctx: FaultContext) -> Rewrite | Skip | None:
        result = call_result(ctx.message)
        if result is None:
            return None
        text = self.message.replace("{tool}", ctx.message.tool or "")
        changed: dict[str, Any] = {**result, "content": [{"type": "text", "text": text}], "isError": False}
        if self.structured == "keep" and self.respect_schema:
            lie = passed_off_as_success(ctx, changed)
            if lie is None:
                return Skip("cannot make structuredContent valid for the tool's outputSchema")
            changed = lie
        elif self.structured == "drop":
            changed.pop("structuredContent", None)
        elif self.structured == "error":
            changed["structuredContent"] = {"error": text}
        return with_result(ctx.message, changed)
