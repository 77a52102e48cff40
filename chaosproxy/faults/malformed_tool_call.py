from __future__ import annotations

from typing import Any, Literal

import orjson
from pydantic import Field

from chaosproxy.engine.actions import Skip
from chaosproxy.faults._effects import bounded, json_changes, text_change
from chaosproxy.faults._llm import ToolCallFault, is_stream
from chaosproxy.faults.base import FaultContext, register
from chaosproxy.protocols.llm import ANTHROPIC


@register
class MalformedToolCall(ToolCallFault):
    """Break the arguments of a tool call the model made: truncated or invalid JSON, or wrong value types."""

    type: Literal["malformed_tool_call"] = "malformed_tool_call"
    kind: Literal["truncated", "invalid_json", "wrong_types"] = Field("truncated", description=(
        "truncated: the JSON cut off half-way; invalid_json: Python-style quotes and a trailing comma; "
        "wrong_types: valid JSON with each value of another type"))

    def change(self, params: dict[str, Any], arguments: dict[str, Any],
               ctx: FaultContext) -> dict[str, Any] | Skip:
        msg = ctx.message
        if self.kind == "wrong_types":
            if not arguments:
                return Skip("the tool call has no arguments to give wrong types")
            broken: Any = {key: _retyped(value) for key, value in arguments.items()}
        elif msg.api == ANTHROPIC and not is_stream(msg):
            return Skip("a whole Anthropic reply carries tool input as a JSON object: use kind wrong_types")
        else:
            text = orjson.dumps(arguments).decode()
            broken = text[: max(1, len(text) // 2)] if self.kind == "truncated" else _python_style(arguments)
        return {**params, "arguments": broken}

    def effect(self, params: dict[str, Any], changed: dict[str, Any]) -> dict[str, Any]:
        """wrong_types: each argument's type before and after; else how the JSON text was broken."""
        before, after = params.get("arguments"), changed["arguments"]
        if isinstance(after, str):
            return {"kind": self.kind, "arguments": text_change(orjson.dumps(before).decode(), after)}
        return {"kind": self.kind, "changed": bounded(json_changes(before, after, "arguments"))}


def _retyped(value: Any) -> Any:
    match value:
        case bool():
            return "true" if value else "false"
        case int() | float():
            return str(value)
        case str():
            return [value]
        case list():
            return {"items": value}
    return str(value)


def _python_style(arguments: dict[str, Any]) -> str:
    """What a model imitating Python writes: single quotes, True/None, a trailing comma."""
    inner = ", ".join(f"{key!r}: {value!r}" for key, value in arguments.items())
    return "{" + inner + (",}" if inner else "}")
