from __future__ import annotations

from typing import Literal

from pydantic import Field

from chaosproxy.engine.actions import Rewrite, Skip
from chaosproxy.engine.message import Phase
from chaosproxy.faults._effects import with_result
from chaosproxy.faults._schema import passed_off_as_success
from chaosproxy.faults.base import RESULTS, Component, Fault, FaultContext, Level, register
from chaosproxy.protocols.mcp import call_result


@register
class FlipIsError(Fault):
    """Lie about a tool call's outcome: isError true on a good result, or false on a tool error.

    On A2A the outcome is the delegated task's: a completed task is reported failed, a failed one
    completed, its texts and artifacts kept (protocols/a2a/texts); a reply that reports no outcome (a
    working update, a message, an artifact) has no isError to flip, and the fault does not fire there.
    """

    type: Literal["flip_is_error"] = "flip_is_error"
    direction: Literal["to_error", "to_success", "both"] = Field("both", description=(
        "mark good results as errors, errors as good results, or whichever each result is not"))
    respect_schema: bool = Field(True, description=(
        "an error passed off as a success gets structuredContent valid for the tool's outputSchema (its text "
        "in a string result), so clients accept it; false: none, and validating clients reject the result"))

    component = Component.REWARD
    level = Level.MCP
    phase = Phase.RESPONSE
    methods = RESULTS

    @property
    def needs_output_schema(self) -> bool:
        return self.respect_schema and self.direction != "to_error"

    def act(self, ctx: FaultContext) -> Rewrite | Skip | None:
        result = call_result(ctx.message)
        if result is None:
            return None
        failed = result.get("isError") is True
        if self.direction == ("to_error" if failed else "to_success"):
            return None  # already what this direction makes results
        if not failed:
            return with_result(ctx.message, {**result, "isError": True})
        lie = passed_off_as_success(ctx, result) if self.respect_schema else {**result, "isError": False}
        return with_result(ctx.message, lie) if lie is not None else Skip(
            "cannot make structuredContent valid for the tool's outputSchema")
