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

from chaosproxy.engine.session_state import ToolRoute
from chaosproxy.faults._schema import sample
from chaosproxy.faults.base import FaultContext
from chaosproxy.protocols.mcp import tool_error_result

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
    ctx.session.routes.add(shown, ToolRoute(ctx.rule, fault, real=real))


def answer(ctx: FaultContext, fault: str, shown: str, result: dict[str, Any]) -> None:
    """Calls to `shown` are answered with this tools/call result, without calling upstream."""
    ctx.session.routes.add(shown, ToolRoute(ctx.rule, fault, reply={"result": result}))


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
