from __future__ import annotations

from typing import Any, Literal, Self

from pydantic import Field, model_validator

from chaosproxy.engine.actions import Rewrite
from chaosproxy.engine.message import Phase
from chaosproxy.faults._effects import with_tools
from chaosproxy.faults._tool_routes import (
    answer,
    crash_result,
    forward,
    is_plain_name,
    name_of,
    picked,
    stub_result,
)
from chaosproxy.faults.base import LISTINGS, Component, Fault, FaultContext, Level, register
from chaosproxy.protocols import mcp


@register
class DistractorTool(Fault):
    """List a look-alike of a real tool (`<tool>_v2`); its calls get empty data, an error, or pass through."""

    type: Literal["distractor_tool"] = "distractor_tool"
    tool: str | None = Field(None, description="glob of the tools to imitate; unset: the first one listed")
    name: str | None = Field(None, min_length=1, description="the look-alike's name; unset: <tool>_v2")
    description: str | None = Field(None, description="the look-alike's description; unset: the real tool's")
    route: Literal["pass", "degraded", "error"] = Field("degraded", description=(
        "calls to the look-alike: forwarded to the real tool, answered with empty data, or a tool error"))

    component = Component.ACTION
    level = Level.MCP
    phase = Phase.RESPONSE
    methods = LISTINGS
    routes_calls = True

    @model_validator(mode="after")
    def _one_name_one_tool(self) -> Self:
        if self.name is not None and self.tool is not None and not is_plain_name(self.tool):
            raise ValueError(f"name {self.name!r} imitates one tool, but tool {self.tool!r} is a glob")
        if self.name is not None and self.name == self.tool:
            raise ValueError(f"name {self.name!r} is the imitated tool's own name (see duplicate_tool)")
        return self

    def act(self, ctx: FaultContext) -> Rewrite | None:
        tools = mcp.listed_tools(ctx.message)
        chosen = picked(tools, self.tool, first_page=mcp.is_first_page(ctx.message)) if tools else set()
        if not tools or not chosen:
            return None
        taken = {name for tool in tools if (name := name_of(tool)) is not None}
        listed: list[Any] = []
        for i, tool in enumerate(tools):
            listed.append(tool)
            if i not in chosen:
                continue
            real = tool["name"]
            look_alike = self.name or f"{real}_v2"
            if look_alike in taken:  # the server has a tool by that name: leave it be
                continue
            taken.add(look_alike)
            listed.append(self._imitate(tool, look_alike))
            if self.route == "pass":
                forward(ctx, self.type, look_alike, real)
            else:
                answer(ctx, self.type, look_alike, crash_result(look_alike) if self.route == "error"
                       else stub_result(tool, degraded=True))
        return with_tools(ctx.message, listed) if len(listed) > len(tools) else None

    def _imitate(self, tool: dict[str, Any], name: str) -> dict[str, Any]:
        copy = {**tool, "name": name}
        if self.description is not None:
            copy["description"] = self.description
        return copy
