from __future__ import annotations

import copy
from typing import Any, Literal, Self

from pydantic import Field, model_validator

from chaosproxy.engine.actions import Rewrite
from chaosproxy.engine.message import Phase
from chaosproxy.engine.session_state import ToolRoute
from chaosproxy.faults._effects import with_tools
from chaosproxy.faults._tool_routes import picked
from chaosproxy.faults.base import LISTINGS, Component, Fault, FaultContext, Level, register
from chaosproxy.protocols import mcp

RETYPED = {"string": "integer", "integer": "string", "number": "string", "boolean": "string",
           "array": "string", "object": "string"}


@register
class InputSchemaDrift(Fault):
    """Change a tool's input schema mid-session: rename, retype or require a parameter; old shapes may get -32602."""

    type: Literal["input_schema_drift"] = "input_schema_drift"
    tool: str = Field("*", description="glob of the tools whose schema drifts")
    parameter: str | None = Field(None, description="the parameter to change; unset: the first one listed")
    mode: Literal["rename", "retype", "require"] = Field(
        "rename", description="rename (calls with the new name are renamed back upstream), retype (the "
                              "advertised type changes), require (an optional parameter becomes required)")
    suffix: str = Field("_v2", min_length=1, description="rename: appended to the parameter's name")
    reject_old: bool = Field(False, description="rename: calls still using the old name get -32602, as a "
                                                "server that moved on would answer")

    component = Component.ACTION
    level = Level.MCP
    phase = Phase.RESPONSE
    methods = LISTINGS
    routes_calls = True

    @model_validator(mode="after")
    def _reject_needs_rename(self) -> Self:
        if self.reject_old and self.mode != "rename":
            raise ValueError(f"reject_old applies to mode rename (a parameter's old name), not {self.mode}")
        return self

    def act(self, ctx: FaultContext) -> Rewrite | None:
        tools = mcp.listed_tools(ctx.message)
        chosen = picked(tools, self.tool, first_page=True) if tools else set()
        if not tools or not chosen:
            return None
        listed: list[Any] = list(tools)
        changed = False
        for i in sorted(chosen):
            drifted = self._drift(ctx, tools[i])
            if drifted is not None:
                listed[i], changed = drifted, True
        return with_tools(ctx.message, listed) if changed else None

    def _drift(self, ctx: FaultContext, tool: dict[str, Any]) -> dict[str, Any] | None:
        schema: Any = tool.get("inputSchema")
        properties = schema.get("properties") if isinstance(schema, dict) else None
        if not isinstance(properties, dict) or not properties:
            return None
        name = self.parameter if self.parameter is not None else next(iter(properties))
        if name not in properties:
            return None
        schema = copy.deepcopy(schema)
        required = list(schema.get("required", []))
        match self.mode:
            case "rename":
                new = name + self.suffix
                schema["properties"] = {new if key == name else key: value
                                        for key, value in schema["properties"].items()}
                schema["required"] = [new if key == name else key for key in required]
                ctx.session.routes.add(tool["name"], ToolRoute(
                    ctx.rule, self.type, real=tool["name"], arguments={new: name},
                    refused=frozenset({name}) if self.reject_old else frozenset()))
            case "retype":
                old_type = schema["properties"][name].get("type", "string")
                schema["properties"][name] = {**schema["properties"][name],
                                              "type": RETYPED.get(str(old_type), "string")}
            case "require":
                if name in required:
                    return None
                schema["required"] = [*required, name]
        return {**tool, "inputSchema": schema}
