"""The engine's view of a model-API exchange, shared by the three formats.

A format module parses a request or reply into these pieces; each piece knows how to write a new
value back into the (parsed) body it came from. `relay` turns the pieces into synthetic MCP-shaped
`Message`s: the tools array is a tools/list result, a tool result in the history a tools/call result,
a tool call the model returns a tools/call request, the newest user turn an `llm/prompt` request, the
model's reply as a whole an `llm/completion` response, and a point in a streamed reply (so many events
relayed, the next about to go) an `llm/stream-event` response.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from chaosproxy.engine.actions import BlankCompletion
from chaosproxy.engine.message import Message, Phase
from chaosproxy.errors import ChaosproxyError

PROMPT = "llm/prompt"
COMPLETION = "llm/completion"
STREAM_EVENT = "llm/stream-event"
ORIGINAL = "_chaosproxy_original"  # inside an MCP-shaped tool: the index of the format's own entry it came
# from; inside a content item: the format's own part (an image) that has no MCP form here


class FormatError(ChaosproxyError, ValueError):
    """A body that is not what this format's endpoint takes or returns: it passes through untouched."""


@dataclass(slots=True)
class Text:
    """A piece of text in the body (the newest user turn) and how to put a new one in its place."""

    text: str
    put: Callable[[str], None]


@dataclass(slots=True)
class ToolResult:
    """A tool result the agent sends back, as an MCP tools/call result.

    `put` writes a changed MCP result into the body. Before, a relay asks `refuses` why the format cannot
    carry one (Chat Completions has no error flag on tool messages), or None, and `form` what of it the
    format carries (its content, not its structuredContent): a fault whose outcome is refused or carries
    no other form must not fire, as it would change nothing the model gets.
    """

    call_id: str
    read: Callable[[], dict[str, Any]]  # the MCP form, built when first asked for (old results rarely are)
    put: Callable[[dict[str, Any]], None]
    form: Callable[[dict[str, Any]], Any]
    newest: bool
    refuses: Callable[[dict[str, Any]], str | None] = lambda result: None
    _result: dict[str, Any] | None = None

    @property
    def result(self) -> dict[str, Any]:
        if self._result is None:
            self._result = self.read()
        return self._result


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
    """A parsed (non-streamed) model reply: its tool calls, whether it has any output (text, tool calls,
    reasoning) an empty completion would take away, and how to make it one."""

    calls: list[ToolCall]
    has_output: bool
    empty: Callable[[BlankCompletion], None]


def synthetic(base: Message, phase: Phase, rpc: dict[str, Any], *, request: Message | None = None,
              headers: Mapping[str, str] | None = None) -> Message:
    """An MCP-shaped message standing for part of a model-API exchange, with its api, model and turn."""
    msg = Message(base.transport, phase, session=base.session, http_method=base.http_method, path=base.path,
                  headers=headers if headers is not None else base.headers, request=request, route=base.route)
    msg.api, msg.model, msg.turn = base.api, base.model, base.turn
    msg.trace = base.trace  # faults on the parts of a model-API call land on its span
    msg.replace(rpc)
    return msg


def tools_list(base: Message, tools: list[dict[str, Any]]) -> Message:
    request = synthetic(base, Phase.REQUEST, {"jsonrpc": "2.0", "id": 0, "method": "tools/list"})
    return synthetic(base, Phase.RESPONSE, {"jsonrpc": "2.0", "id": 0, "result": {"tools": tools}},
                     request=request)


def tool_call(base: Message, call: ToolCall, *, headers: Mapping[str, str] | None = None) -> Message:
    arguments = call.parsed
    params = {"name": call.name, "arguments": arguments if isinstance(arguments, dict) else {}}
    return synthetic(base, Phase.REQUEST, {"jsonrpc": "2.0", "id": call.call_id, "method": "tools/call",
                                           "params": params}, headers=headers)


def tool_result(base: Message, call: ToolCall, result: dict[str, Any]) -> Message:
    return synthetic(base, Phase.RESPONSE, {"jsonrpc": "2.0", "id": call.call_id, "result": result},
                     request=tool_call(base, call))


def prompt(base: Message, text: str) -> Message:
    """The newest user turn, as a notification: faults that answer requests (rpc_error, timeout) pass it by."""
    return synthetic(base, Phase.REQUEST, {"jsonrpc": "2.0", "method": PROMPT, "params": {"text": text}})


def completion(base: Message) -> Message:
    """The model's reply as a whole (a notification, as the prompt is), decided at its first output.
    It carries the request's headers, which a rule's `header` match reads, as on every other message."""
    return synthetic(base, Phase.RESPONSE, {"jsonrpc": "2.0", "method": COMPLETION})


def stream_event(base: Message, relayed: int) -> Message:
    """A point in a streamed reply: `relayed` events have reached the agent and the next is about to go."""
    return synthetic(base, Phase.RESPONSE, {"jsonrpc": "2.0", "method": STREAM_EVENT,
                                            "params": {"relayed": relayed}})


def messages_request(body: dict[str, Any], tools: ToolShape) -> tuple[list[dict[str, Any]], Request, int]:
    """A request whose history is a `messages` list (Chat Completions, Messages): the list, the Request
    with its model, stream flag, turn and tools, and the index of the last assistant message (-1: none)."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise FormatError("no 'messages' list of objects")
    model = body.get("model")
    assistant = [i for i, m in enumerate(messages) if m.get("role") == "assistant"]
    request = Request(model=model if isinstance(model, str) else None, stream=body.get("stream") is True,
                      turn=len(assistant))
    tools.parse(body, request)
    return messages, request, assistant[-1] if assistant else -1


def user_text(holder: dict[str, Any], text_type: str) -> Text | None:
    """A user turn's text: its `content` string, or its last part of type `text_type` (a turn of tool
    results has none)."""
    content = holder.get("content")
    if isinstance(content, str):
        return Text(content, lambda text: holder.__setitem__("content", text))
    for part in reversed(content if isinstance(content, list) else []):
        if isinstance(part, dict) and part.get("type") == text_type and isinstance(part.get("text"), str):
            return Text(part["text"], functools.partial(part.__setitem__, "text"))
    return None


def flagless_result(holder: dict[str, Any], key: str, call_id: str, text_type: str, *, newest: bool,
                    carrier: str) -> ToolResult:
    """A tool result kept under `key` of a format's item that has no error flag (`carrier` names it)."""
    original = holder.get(key)

    def form(result: dict[str, Any]) -> Any:
        return result_from_mcp(result, original, text_type)

    def refuses(result: dict[str, Any]) -> str | None:
        return f"{carrier} carry no error flag" if result.get("isError") is True else None

    return ToolResult(call_id, lambda: result_to_mcp(original, None, text_type),
                      lambda result: holder.__setitem__(key, form(result)), form, newest, refuses)


def named_choice(body: dict[str, Any]) -> Text | None:
    """A `tool_choice` that forces one tool by name, in any of the three formats' shapes."""
    choice = body.get("tool_choice")
    holder = choice.get("function") if isinstance(choice, dict) and isinstance(choice.get("function"), dict) \
        else choice
    if not isinstance(holder, dict) or not isinstance(holder.get("name"), str):
        return None
    return Text(holder["name"], lambda name: holder.__setitem__("name", name))


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
    items = content if isinstance(content := result.get("content"), list) else []
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


@dataclass(frozen=True, slots=True)
class ToolShape:
    """How a format writes a function tool in a request's `tools` array: which entries are function tools
    (others, a provider's built-in tools, pass untouched), the key of the input schema, the key the fields
    sit under (Chat Completions' `function`; None: in the entry itself), and the entry a tool a fault made
    up is written into."""

    is_function: Callable[[dict[str, Any]], bool]
    schema_key: str
    nested: str | None = None
    new_entry: Mapping[str, Any] = field(default_factory=dict)

    def fields(self, entry: dict[str, Any]) -> dict[str, Any]:
        """The entry's name, description and schema holder."""
        return entry[self.nested] if self.nested else entry

    def name_of(self, entry: dict[str, Any] | None) -> str | None:
        """The name of a function tool's entry (None for none)."""
        name = self.fields(entry).get("name") if entry is not None else None
        return name if isinstance(name, str) else None

    def parse(self, body: dict[str, Any], request: Request) -> None:
        """The body's function tools, MCP-shaped, into `request.tools`, and how to put a changed list back."""
        tools = body.get("tools")
        if not isinstance(tools, list) or not tools:
            return
        converted = [function_tool((fields := self.fields(entry)).get("name"), fields.get("description"),
                                   fields.get(self.schema_key), i)
                     if isinstance(entry, dict) and self.is_function(entry) else None for i, entry in enumerate(tools)]
        request.tools = [tool for tool in converted if tool is not None]
        request.put_tools = lambda shown: body.__setitem__("tools", merged_tools(tools, converted, shown, self.entry))

    def entry(self, tool: dict[str, Any], original: dict[str, Any] | None) -> dict[str, Any]:
        """The format's entry for an MCP-shaped tool: the tool's name, description and schema, with the
        other keys of the entry it came from (of `new_entry` for a tool a fault made up)."""
        entry = dict(original if original is not None else self.new_entry)
        kept = {key: value for key, value in self.fields(entry).items()
                if key not in ("name", "description", self.schema_key)}
        fields = {"name": tool["name"], **({"description": tool["description"]} if "description" in tool else {}),
                  self.schema_key: tool.get("inputSchema", {"type": "object"}), **kept}
        return {**entry, self.nested: fields} if self.nested else fields


def function_tool(name: Any, description: Any, schema: Any, index: int) -> dict[str, Any] | None:
    """An MCP-shaped tool for the format's function tool at `index` of its tools array (None when it
    has no usable name). Copies a fault makes (a duplicate, a distractor) keep the index."""
    if not isinstance(name, str) or not name:
        return None
    tool: dict[str, Any] = {"name": name, "inputSchema": schema if isinstance(schema, dict) else {"type": "object"},
                            ORIGINAL: index}
    if isinstance(description, str):
        tool["description"] = description
    return tool


def template_of(tool: dict[str, Any], entries: list[Any]) -> dict[str, Any] | None:
    """The format's entry an MCP-shaped tool came from (None for a tool a fault made up)."""
    index = tool.get(ORIGINAL)
    entry = entries[index] if isinstance(index, int) and 0 <= index < len(entries) else None
    return entry if isinstance(entry, dict) else None


def merged_tools(original: list[Any], converted: list[dict[str, Any] | None], shown: list[dict[str, Any]],
                 back: Callable[[dict[str, Any], dict[str, Any] | None], dict[str, Any]]) -> list[Any]:
    """The format's tools array after a fault changed the MCP-shaped list: the function tools as the
    fault left them (`back` turns each into the format's entry, from the entry it came from if any),
    the others (built-in tools) where they were."""
    kept = {id(tool): i for i, tool in enumerate(converted) if tool is not None}  # tools no fault touched
    out = [original[kept[id(tool)]] if id(tool) in kept and converted[kept[id(tool)]] is tool
           else back(tool, template_of(tool, original)) for tool in shown]
    for i, (entry, tool) in enumerate(zip(original, converted, strict=True)):
        if tool is None:
            out.insert(min(i, len(out)), entry)
    return out


def json_text(value: Any) -> str:
    """Arguments as JSON text, compact as the providers send them."""
    return value if isinstance(value, str) else orjson.dumps(value).decode()
