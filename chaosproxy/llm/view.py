"""The engine's view of a model-API exchange, shared by the three formats.

A format module parses a request or reply into these pieces; each piece knows how to write a new
value back into the (parsed) body it came from. `relay` turns the pieces into synthetic MCP-shaped
`Message`s: the tools array is a tools/list result, a tool result in the history a tools/call result,
a tool call the model returns a tools/call request, the newest user turn an `llm/prompt` request, and
the model's reply as a whole an `llm/completion` response.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from chaosproxy.message import Message, Phase

PROMPT = "llm/prompt"
COMPLETION = "llm/completion"
ORIGINAL = "_chaosproxy_original"  # the format's own entry, kept inside an MCP-shaped tool or content item


class FormatError(ValueError):
    """A body that is not what this format's endpoint takes or returns: it passes through untouched."""


@dataclass(slots=True)
class Text:
    """A piece of text in the body (the newest user turn) and how to put a new one in its place."""

    text: str
    put: Callable[[str], None]


@dataclass(slots=True)
class ToolResult:
    """A tool result the agent sends back, as an MCP tools/call result.

    `put` writes a changed MCP result into the body; it returns a reason when the format cannot carry
    the change (Chat Completions has no error flag on tool messages), else None.
    """

    call_id: str
    result: dict[str, Any]
    put: Callable[[dict[str, Any]], str | None]
    newest: bool


@dataclass(slots=True)
class ToolCall:
    """A tool call the model made: its id, name and arguments (JSON text, as the model wrote it)."""

    call_id: str
    name: str
    arguments: str
    put: Callable[[str, str], None] = lambda name, arguments: None

    @property
    def parsed(self) -> Any:
        """The arguments as a JSON value, or the text itself when it is not valid JSON."""
        try:
            return orjson.loads(self.arguments) if self.arguments else {}
        except orjson.JSONDecodeError:
            return self.arguments


@dataclass(slots=True)
class Request:
    """A parsed model-API request."""

    model: str | None
    stream: bool
    turn: int  # assistant turns already in the history: 0 on a conversation's first request
    tools: list[dict[str, Any]] | None = None  # MCP-shaped: name, description, inputSchema
    put_tools: Callable[[list[dict[str, Any]]], None] = lambda tools: None
    prompts: list[Text] = field(default_factory=list)  # every user turn's text; the last is the prompt
    results: list[ToolResult] = field(default_factory=list)
    calls: list[ToolCall] = field(default_factory=list)  # tool calls in the history (assistant turns)


@dataclass(slots=True)
class Reply:
    """A parsed (non-streamed) model reply: its tool calls, and how to make it an empty completion."""

    calls: list[ToolCall]
    empty: Callable[[str], None]


def synthetic(base: Message, phase: Phase, rpc: dict[str, Any], *, request: Message | None = None,
              headers: dict[str, str] | None = None) -> Message:
    """An MCP-shaped message standing for part of a model-API exchange, with its api, model and turn."""
    msg = Message(base.transport, phase, session=base.session, http_method=base.http_method, path=base.path,
                  headers=headers if headers is not None else base.headers, request=request, route=base.route)
    msg.api, msg.model, msg.turn = base.api, base.model, base.turn
    msg.replace(rpc)
    return msg


def tools_list(base: Message, tools: list[dict[str, Any]]) -> Message:
    request = synthetic(base, Phase.REQUEST, {"jsonrpc": "2.0", "id": 0, "method": "tools/list"})
    return synthetic(base, Phase.RESPONSE, {"jsonrpc": "2.0", "id": 0, "result": {"tools": tools}},
                     request=request)


def tool_call(base: Message, call: ToolCall, *, headers: dict[str, str] | None = None) -> Message:
    arguments = call.parsed
    params = {"name": call.name, "arguments": arguments if isinstance(arguments, dict) else {}}
    return synthetic(base, Phase.REQUEST, {"jsonrpc": "2.0", "id": call.call_id, "method": "tools/call",
                                           "params": params}, headers=headers)


def tool_result(base: Message, call: ToolCall, result: dict[str, Any]) -> Message:
    return synthetic(base, Phase.RESPONSE, {"jsonrpc": "2.0", "id": call.call_id, "result": result},
                     request=tool_call(base, call))


def prompt(base: Message, text: str) -> Message:
    return synthetic(base, Phase.REQUEST, {"jsonrpc": "2.0", "id": 0, "method": PROMPT,
                                           "params": {"text": text}})


def completion(base: Message, headers: dict[str, str]) -> Message:
    request = synthetic(base, Phase.REQUEST, {"jsonrpc": "2.0", "id": 0, "method": COMPLETION})
    return synthetic(base, Phase.RESPONSE, {"jsonrpc": "2.0", "id": 0, "result": {}}, request=request,
                     headers=headers)


def result_to_mcp(content: Any, is_error: bool | None, text_type: str) -> dict[str, Any]:
    """A tool result's content (a string, or a list of typed parts) as an MCP tools/call result."""
    if isinstance(content, str):
        items: list[dict[str, Any]] = [{"type": "text", "text": content}]
    elif isinstance(content, list):
        items = [{"type": "text", "text": part["text"]} if _is_text(part, text_type)
                 else {"type": str(part.get("type")) if isinstance(part, dict) else "unknown", ORIGINAL: part}
                 for part in content]
    elif content is None:
        items = []
    else:
        raise FormatError(f"tool result content is {type(content).__name__}, not a string or a list")
    result: dict[str, Any] = {"content": items}
    if is_error is not None:
        result["isError"] = is_error
    return result


def result_from_mcp(result: dict[str, Any], original: Any, text_type: str) -> Any:
    """An MCP tools/call result as the format's content, shaped like `original` (string or parts)."""
    items = result.get("content") if isinstance(result.get("content"), list) else []
    if isinstance(original, str) or original is None:
        return "".join(item.get("text", "") for item in items if isinstance(item, dict) and item.get("type") == "text")
    old = original if isinstance(original, list) else []
    parts = []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            continue
        if ORIGINAL in item:
            parts.append(item[ORIGINAL])
        elif item.get("type") == "text":
            template = old[i] if i < len(old) and _is_text(old[i], text_type) else {"type": text_type}
            parts.append({**template, "text": item.get("text", "")})
    return parts


def _is_text(part: Any, text_type: str) -> bool:
    return isinstance(part, dict) and part.get("type") == text_type and isinstance(part.get("text"), str)


def function_tool(name: Any, description: Any, schema: Any, original: dict[str, Any]) -> dict[str, Any] | None:
    """An MCP-shaped tool for a format's function tool (None when it has no usable name)."""
    if not isinstance(name, str) or not name:
        return None
    tool: dict[str, Any] = {"name": name, "inputSchema": schema if isinstance(schema, dict) else {"type": "object"},
                            ORIGINAL: original}
    if isinstance(description, str):
        tool["description"] = description
    return tool


def merged_tools(original: list[Any], converted: list[dict[str, Any] | None], shown: list[dict[str, Any]],
                 back: Callable[[dict[str, Any]], dict[str, Any]]) -> list[Any]:
    """The format's tools array after a fault changed the MCP-shaped list: the function tools as the
    fault left them (`back` turns each into the format's entry), the others (built-in tools) where they were."""
    out = [back(tool) for tool in shown]
    for i, (entry, tool) in enumerate(zip(original, converted, strict=True)):
        if tool is None:
            out.insert(min(i, len(out)), entry)
    return out


def json_text(value: Any) -> str:
    """Arguments as JSON text, compact as the providers send them."""
    return value if isinstance(value, str) else orjson.dumps(value).decode()
