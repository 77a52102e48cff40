"""What the action-space faults share: which listed tools a rule picks, where calls to the tools it
made up go, and the results that answer them.

A fault that shows the agent a tool name the server does not have (a duplicate answered by a stub,
a distractor, a new name, padding) leaves a `ToolRoute` in the session; the engine then forwards or
answers the agent's calls to that name. Not a fault itself: it registers nothing.
"""

from __future__ import annotations

import fnmatch
import random
from typing import Any

import orjson

from chaosproxy.faults.base import FaultContext
from chaosproxy.mcp import tool_error_result
from chaosproxy.session import ToolRoute

GLOB_CHARS = frozenset("*?[")


def is_plain_name(pattern: str) -> bool:
    """True when a `tool` parameter names one tool rather than globbing many."""
    return not GLOB_CHARS & set(pattern)


def name_of(tool: Any) -> str | None:
    name = tool.get("name") if isinstance(tool, dict) else None
    return name if isinstance(name, str) else None


def picked(tools: list[Any], pattern: str | None, *, first_page: bool) -> set[int]:
    """Indexes of the tools a rule acts on: those matching the glob, or (unset) the first one listed."""
    if pattern is None:
        return {0} if first_page and name_of(tools[0]) is not None else set()
    return {i for i, tool in enumerate(tools) if (name := name_of(tool)) is not None
            and fnmatch.fnmatchcase(name, pattern)}


def stable_rng(ctx: FaultContext, *key: object) -> random.Random:
    """Draws that repeat every time this rule shapes this session's tool list.

    An agent that lists its tools twice must be shown the same made-up tools both times, so choices
    come from a stream seeded once from the decision's own seeded stream and kept in the rule's state.
    A `key` (a tool name) gives that thing its own stream, independent of what else is listed.
    """
    if "seed" not in ctx.state:
        ctx.state["seed"] = ctx.rng.getrandbits(64)
    seed = ctx.state["seed"]
    return random.Random(":".join(str(part) for part in (seed, *key)) if key else seed)


def forward(ctx: FaultContext, fault: str, shown: str, real: str) -> None:
    """Calls to `shown` go upstream as calls to `real`."""
    ctx.session.routes[shown] = ToolRoute(ctx.rule, fault, real=real)


def answer(ctx: FaultContext, fault: str, shown: str, result: dict[str, Any]) -> None:
    """Calls to `shown` are answered with this tools/call result, without calling upstream."""
    ctx.session.routes[shown] = ToolRoute(ctx.rule, fault, reply={"result": result})


def crash_result(name: str) -> dict[str, Any]:
    """The tool error an MCP SDK server sends when a tool raised: all the agent learns is that it failed."""
    return tool_error_result(f"Error executing tool {name}")


def stub_result(tool: dict[str, Any], *, degraded: bool = False) -> dict[str, Any]:
    """A result that passes for the tool's own: it conforms to its outputSchema, if it has one.

    Clients validate structured results against the listed outputSchema (the Python SDK raises on a
    mismatch), so a stub without one would be caught as a protocol error rather than believed.
    `degraded` fills it with empty values instead of plausible ones.
    """
    schema = tool.get("outputSchema")
    data = sample(schema, schema, empty=degraded) if isinstance(schema, dict) else None
    if not isinstance(data, dict):
        return {"content": [{"type": "text", "text": "No results found." if degraded else "OK"}]}
    # SDK servers wrap a plain return value as {"result": value} and show the value itself as text.
    shown = data["result"] if data.keys() == {"result"} else data
    text = shown if isinstance(shown, str) else orjson.dumps(shown).decode()
    return {"content": [{"type": "text", "text": text}], "structuredContent": data}


def sample(schema: Any, root: dict[str, Any], *, empty: bool, depth: int = 0) -> Any:
    """A small instance of a JSON Schema: plausible values, or (`empty`) empty ones.

    Covers what tool servers generate (types, properties, required, items, enum, const, default,
    anyOf/oneOf/allOf, local $ref, simple bounds); anything else gets null.
    """
    if not isinstance(schema, dict) or depth > 16:
        return None
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/"):
        target: Any = root
        for part in ref[2:].split("/"):
            target = target.get(part) if isinstance(target, dict) else None
        return sample(target, root, empty=empty, depth=depth + 1)
    if "const" in schema:
        return schema["const"]
    if isinstance(enum := schema.get("enum"), list) and enum:
        return enum[0]
    if not empty and "default" in schema:
        return schema["default"]
    for key in ("anyOf", "oneOf", "allOf"):
        options = schema.get(key)
        if isinstance(options, list) and options:
            nullable = {"type": "null"} in options
            return None if empty and nullable else sample(
                next(o for o in options if o != {"type": "null"}), root, empty=empty, depth=depth + 1)
    kind = schema.get("type", "object" if "properties" in schema else None)
    if isinstance(kind, list):
        kind = "null" if empty and "null" in kind else next((k for k in kind if k != "null"), "null")
    match kind:
        case "object":
            properties = schema.get("properties") or {}
            keys = (schema.get("required") or []) if empty else list(properties)
            return {key: sample(properties.get(key), root, empty=empty, depth=depth + 1) for key in keys}
        case "array":
            items = schema.get("items")
            least = schema.get("minItems")
            size = max(least if isinstance(least, int) else 0, 0 if empty else 1)
            return [sample(items, root, empty=empty, depth=depth + 1) for _ in range(size)]
        case "string":
            least = schema.get("minLength")
            return ("" if empty else "ok").ljust(least if isinstance(least, int) else 0, "x")
        case "integer" | "number":
            value: float = 0 if empty else 1
            if (low := _number(schema.get("minimum"))) is not None:
                value = max(value, low)
            if (high := _number(schema.get("maximum"))) is not None:
                value = min(value, high)
            return int(value) if kind == "integer" else float(value)
        case "boolean":
            return not empty
    return None


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None
