from __future__ import annotations

import random
from typing import Any, Literal

from pydantic import Field

from chaosproxy.engine.actions import Rewrite
from chaosproxy.engine.message import Phase
from chaosproxy.faults._effects import with_tools
from chaosproxy.faults._tool_routes import answer, crash_result, name_of, picked, stable_rng, stub_result
from chaosproxy.faults.base import LISTINGS, Component, Fault, FaultContext, Level, register
from chaosproxy.faults.tool_flood import made_up_tool
from chaosproxy.protocols import mcp

Variant = Literal["identical", "no_description", "wrong_description", "wrong_parameters", "swapped"]


@register
class DuplicateTool(Fault):
    """List a second tool under a real tool's name: identical, undescribed, or described or shaped wrongly."""

    type: Literal["duplicate_tool"] = "duplicate_tool"
    tool: str | None = Field(None, description="glob of the tools to duplicate; unset: the first one listed")
    variant: Variant = Field("identical", description=(
        "the copy: identical, no_description, or the description (wrong_description), input schema "
        "(wrong_parameters) or both (swapped) of another listed tool"))
    route: Literal["real", "stub", "error"] = Field("real", description=(
        "calls to the name: go upstream unchanged, get a stub result, or get a tool error"))
    position: Literal["after", "before"] = Field("after", description=(
        "the copy's place next to the real tool (clients keeping the last of a name see the copy)"))

    component = Component.ACTION
    level = Level.MCP
    phase = Phase.RESPONSE
    methods = LISTINGS
    routes_calls = True

    def act(self, ctx: FaultContext) -> Rewrite | None:
        tools = mcp.listed_tools(ctx.message)
        chosen = picked(tools, self.tool, first_page=mcp.is_first_page(ctx.message)) if tools else set()
        if not tools or not chosen:
            return None
        listed: list[Any] = []
        for i, tool in enumerate(tools):
            if i not in chosen:
                listed.append(tool)
                continue
            name = tool["name"]
            copy = self._copy(tool, tools, stable_rng(ctx, name))
            listed += [tool, copy] if self.position == "after" else [copy, tool]
            if self.route == "stub":
                answer(ctx, self.type, name, stub_result(tool))
            elif self.route == "error":
                answer(ctx, self.type, name, crash_result(name))
        return with_tools(ctx.message, listed)

    def _copy(self, tool: dict[str, Any], tools: list[Any], rng: random.Random) -> dict[str, Any]:
        copy = dict(tool)
        if self.variant == "no_description":
            copy.pop("description", None)
        elif self.variant != "identical":
            donor = _donor(tool, tools, rng)
            if self.variant in ("wrong_description", "swapped"):
                copy.pop("description", None)
                if "description" in donor:
                    copy["description"] = donor["description"]
            if self.variant in ("wrong_parameters", "swapped"):
                copy["inputSchema"] = donor.get("inputSchema", {"type": "object"})
        return copy


def _donor(tool: dict[str, Any], tools: list[Any], rng: random.Random) -> dict[str, Any]:
    """Another listed tool to take a wrong description or schema from (made up if there is none)."""
    others = [t for t in tools if (name := name_of(t)) is not None and name != tool["name"]]
    return rng.choice(others) if others else made_up_tool(rng, {tool["name"]})
