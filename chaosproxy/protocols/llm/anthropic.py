"""Anthropic Messages (`POST .../v1/messages`).

Tools are `{name, description, input_schema}` (server tools, with another `type`, pass untouched);
user turns carry `tool_result` blocks (by `tool_use_id`, with `is_error`), assistant turns `tool_use`
blocks (input as a JSON object). A stream is `message_start`, `content_block_start`/`_delta`/`_stop`
(`input_json_delta` pieces for tool input), `message_delta` (the stop reason), `message_stop`, `ping`s.
"""

from __future__ import annotations

from typing import Any

import orjson

from chaosproxy.engine.actions import BlankCompletion
from chaosproxy.protocols.llm import ANTHROPIC, stream, view
from chaosproxy.protocols.llm.view import FormatError, Reply, Request, ToolCall, ToolResult

API = ANTHROPIC
TEXT = "text"
TOOLS = view.ToolShape(lambda entry: entry.get("type", "custom") == "custom" and "input_schema" in entry,
                       "input_schema")


def parse_request(body: dict[str, Any]) -> Request:
    messages, request, last_assistant = view.messages_request(body, TOOLS)
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


def _result(block: dict[str, Any], *, newest: bool) -> ToolResult:
    original = block.get("content")
    is_error = block.get("is_error")
    flagged = "is_error" in block

    def form(result: dict[str, Any]) -> tuple[Any, Any]:
        """The block's content and is_error for `result` (a flag set, or unset where the block had one)."""
        error = result.get("isError")
        return view.result_from_mcp(result, original, TEXT), error if error is not None and (
            error or flagged) else is_error

    def put(result: dict[str, Any]) -> None:
        block["content"], error = form(result)
        if error is not is_error:
            block["is_error"] = error

    flag = is_error if isinstance(is_error, bool) else None
    return ToolResult(block["tool_use_id"], lambda: view.result_to_mcp(original, flag, TEXT), put, form, newest)


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

    def empty(action: BlankCompletion) -> None:
        text = "".join(block.get("text", "") for block in content if isinstance(block, dict)
                       and block.get("type") == TEXT)
        cut = action.mode == "length" and text
        body["content"] = [{"type": "text", "text": text[: len(text) // 2]}] if cut else []
        body["stop_reason"] = action.stop

    return Reply(calls, bool(content), empty)


class Editor(stream.Editor):
    """Events pass as they come. A tool_use block some rule may change is held (with what comes after
    it) from its start to its stop; when a fault changed it, its start names the tool as the agent
    knows it, its first input_json_delta carries the whole input and its later ones are emptied.

    An empty or cut-off reply keeps only text blocks (none when empty), numbered from 0 again, as the
    whole reply keeps only its text: no thinking block is left without its thinking and signature."""

    def __init__(self, decisions: stream.Decisions) -> None:
        super().__init__(decisions)
        self.calls: dict[Any, stream.HeldCall] = {}  # block index -> the tool_use block's call
        self.blocks: dict[Any, int | None] = {}  # an empty reply: block index -> its new index (None: dropped)
        self.shown = 0  # characters of text sent (for a cut-off reply)

    def edit(self, event: stream.Event) -> list[stream.Event]:
        data, name = event.data, event.name
        if not isinstance(data, dict):
            return [event]
        if name == "content_block_start":
            self.output_starts()
        if self.empty is not None:
            return self._emptied(event, data)
        index = data.get("index")
        call = self.calls.get(index) if name in ("content_block_delta", "content_block_stop") else None
        match name:
            case "content_block_start" if isinstance(block := data.get("content_block"), dict) \
                    and block.get("type") == "tool_use":
                given = view.json_text(block["input"]) if block.get("input") else ""  # some gateways send it whole
                self.calls[index] = self.hold(event, stream.HeldCall(str(block.get("id")), str(block.get("name")),
                                                                     key=index, arguments=given))
            case "content_block_delta" if call is not None and not call.complete:
                delta = found if isinstance(found := data.get("delta"), dict) else {}
                call.arguments += piece if isinstance(piece := delta.get("partial_json"), str) else ""
                call.events.append(event)
            case "content_block_stop" if call is not None and not call.complete:
                call.events.append(event)
                self.completed(call)
        return [event]

    def rewrite(self, call: stream.HeldCall, edited: ToolCall) -> None:
        start, *rest = call.events
        if edited.name != call.name:
            start.change()["content_block"]["name"] = edited.name
        if edited.arguments == call.arguments:
            return
        deltas = [event for event in rest if event.name == "content_block_delta"]
        if not deltas:  # no input_json_delta (the input was empty, or came whole): one follows the start
            start.extra = stream.frame({"type": "content_block_delta", "index": call.key, "delta": {
                "type": "input_json_delta", "partial_json": edited.arguments}}, "content_block_delta")
        for n, event in enumerate(deltas):
            event.change()["delta"] = {**event.data["delta"], "partial_json": edited.arguments if n == 0 else ""}

    def _emptied(self, event: stream.Event, data: dict[str, Any]) -> list[stream.Event]:
        assert self.empty is not None
        index = data.get("index")
        match event.name:
            case "content_block_start":
                block = given if isinstance(given := data.get("content_block"), dict) else {}
                kept = self.empty.mode == "length" and block.get("type") == TEXT and self.shown < stream.CUT_OFF_CHARS
                self.blocks[index] = sum(new is not None for new in self.blocks.values()) if kept else None
            case "content_block_delta" | "content_block_stop":
                if self.blocks.get(index) is None or not self._cut(event, data):
                    return []
            case "message_delta" if isinstance(delta := data.get("delta"), dict) \
                    and delta.get("stop_reason") != self.empty.stop:
                event.change()["delta"] = {**delta, "stop_reason": self.empty.stop}
                return [event]
            case _:
                return [event]
        new = self.blocks.get(index)
        if new is None:
            return []
        if new != index:
            event.change()["index"] = new
        return [event]

    def _cut(self, event: stream.Event, data: dict[str, Any]) -> bool:
        """Whether a kept text block's event still says something once its text is cut to what may show."""
        delta = data.get("delta")
        if not isinstance(delta, dict) or not isinstance(text := delta.get("text"), str):
            return True
        allowed = max(0, stream.CUT_OFF_CHARS - self.shown)
        self.shown += len(text)
        if len(text) > allowed:
            event.change()["delta"] = {**delta, "text": text[:allowed]}
        return allowed > 0
