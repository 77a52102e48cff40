"""Anthropic Messages (`POST .../v1/messages`).

Tools are `{name, description, input_schema}` (server tools, with another `type`, pass untouched);
user turns carry `tool_result` blocks (by `tool_use_id`, with `is_error`), assistant turns `tool_use`
blocks (input as a JSON object). A stream is `message_start`, `content_block_start`/`_delta`/`_stop`
(`input_json_delta` pieces for tool input), `message_delta` (the stop reason), `message_stop`, `ping`s.
"""

from __future__ import annotations

from typing import Any

import orjson

from chaosproxy.llm import stream, view
from chaosproxy.llm.view import FormatError, Reply, Request, ToolCall, ToolResult

API = "anthropic"
TEXT = "text"
STOP = {"empty": "end_turn", "length": "max_tokens"}


def parse_request(body: dict[str, Any]) -> Request:
    messages, request, last_assistant = view.messages_request(body)
    _parse_tools(body, request)
    for i, message in enumerate(messages):
        content = message.get("content")
        blocks = [block for block in content if isinstance(block, dict)] if isinstance(content, list) else []
        if message.get("role") == "user":
            if (text := view.user_text(message, TEXT)) is not None:
                request.prompts.append(text)
            request.results += [_result(block, newest=i > last_assistant) for block in blocks
                                if block.get("type") == "tool_result" and isinstance(block.get("tool_use_id"), str)]
        elif message.get("role") == "assistant":
            request.calls += [_call(block) for block in blocks if _is_tool_use(block)]
    return request


def _parse_tools(body: dict[str, Any], request: Request) -> None:
    tools = body.get("tools")
    if not isinstance(tools, list) or not tools:
        return
    converted = [view.function_tool(entry.get("name"), entry.get("description"), entry.get("input_schema"), i)
                 if isinstance(entry, dict) and entry.get("type", "custom") == "custom" and "input_schema" in entry
                 else None for i, entry in enumerate(tools)]
    request.tools = [tool for tool in converted if tool is not None]

    def back(tool: dict[str, Any], original: dict[str, Any] | None) -> dict[str, Any]:
        template = {key: value for key, value in (original or {}).items()
                    if key not in ("name", "description", "input_schema")}
        return {"name": tool["name"], **({"description": tool["description"]} if "description" in tool else {}),
                "input_schema": tool.get("inputSchema", {"type": "object"}), **template}

    request.put_tools = lambda shown: body.__setitem__("tools", view.merged_tools(tools, converted, shown, back))


def _result(block: dict[str, Any], *, newest: bool) -> ToolResult:
    original = block.get("content")
    is_error = block.get("is_error")

    def put(result: dict[str, Any]) -> str | None:
        block["content"] = view.result_from_mcp(result, original, TEXT)
        if result.get("isError") is not None and (result["isError"] or "is_error" in block):
            block["is_error"] = result["isError"]
        return None

    flag = is_error if isinstance(is_error, bool) else None
    return ToolResult(block["tool_use_id"], lambda: view.result_to_mcp(original, flag, TEXT), put, newest)


def _is_tool_use(block: dict[str, Any]) -> bool:
    return block.get("type") == "tool_use" and isinstance(block.get("name"), str)


def _call(block: dict[str, Any]) -> ToolCall:
    def put(name: str, arguments: str) -> None:
        block["name"] = name
        block["input"] = _input(arguments)

    return ToolCall(str(block.get("id")), block["name"], view.json_text(block.get("input", {})), put)


def _input(arguments: str) -> Any:
    try:
        return orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return arguments


def parse_reply(body: dict[str, Any]) -> Reply:
    content = body.get("content")
    if body.get("type") != "message" or not isinstance(content, list):
        raise FormatError("not a message object with content blocks")
    calls = [_call(block) for block in content if isinstance(block, dict) and _is_tool_use(block)]

    def empty(mode: str) -> None:
        text = "".join(block.get("text", "") for block in content if isinstance(block, dict)
                       and block.get("type") == TEXT)
        body["content"] = [{"type": "text", "text": text[: len(text) // 2]}] if mode == "length" and text else []
        body["stop_reason"] = STOP[mode]

    return Reply(calls, empty)


class Editor(stream.Editor):
    """Events pass as they come; a tool_use block is held from its start to its stop, then sent whole
    (start, one input_json_delta with the complete input, stop)."""

    def __init__(self, plan: stream.StreamPlan) -> None:
        super().__init__(plan)
        self.held: dict[int, dict[str, Any]] = {}  # block index -> its start event's block, and its input
        self.shown = 0  # characters of text sent (for a cut-off reply)

    def edit(self, event: bytes) -> list[bytes]:
        name, data = stream.parse(event)
        if not isinstance(data, dict):
            return [event]
        index = data.get("index")
        match name:
            case "content_block_start" if isinstance(block := data.get("content_block"), dict) \
                    and block.get("type") == "tool_use":
                self.held[index] = {"block": block, "input": ""}
                return []
            case "content_block_delta" if index in self.held:
                delta = data.get("delta") or {}
                self.held[index]["input"] += delta.get("partial_json") or ""
                return []
            case "content_block_stop" if index in self.held:
                return self._flush(index, event)
            case "content_block_delta" if self.plan.empty is not None:
                return self._cut(data)
            case "message_delta" if self.plan.empty is not None:
                delta = data.get("delta") or {}
                return [stream.frame({**data, "delta": {**delta, "stop_reason": STOP[self.plan.empty]}}, name)]
        return [event]

    def _cut(self, data: dict[str, Any]) -> list[bytes]:
        delta = data.get("delta") or {}
        text = delta.get("text")
        if not isinstance(text, str):
            return []
        allowed = max(0, 40 - self.shown) if self.plan.empty == "length" else 0
        self.shown += len(text)
        return [stream.frame({**data, "delta": {**delta, "text": text[:allowed]}}, "content_block_delta")] \
            if allowed else []

    def _flush(self, index: int, stop: bytes) -> list[bytes]:
        held = self.held.pop(index)
        if self.plan.empty is not None:
            return []
        block = held["block"]
        call = self.call(ToolCall(str(block.get("id")), str(block.get("name")), held["input"]))
        return [stream.frame({"type": "content_block_start", "index": index,
                              "content_block": {**block, "name": call.name}}, "content_block_start"),
                stream.frame({"type": "content_block_delta", "index": index,
                              "delta": {"type": "input_json_delta", "partial_json": call.arguments}},
                             "content_block_delta"),
                stop]
