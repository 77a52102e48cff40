"""OpenAI Responses (`POST .../v1/responses`).

The input is a string or a list of items: messages (`input_text` parts), `function_call`s (arguments
as JSON text) and `function_call_output`s (by `call_id`). With `previous_response_id` only the new
items are sent, so calls made earlier are known from what the relay saw go by. A stream is named
events with a `sequence_number`; `response.completed` repeats the whole output.
"""

from __future__ import annotations

from typing import Any

from chaosproxy.llm import stream, view
from chaosproxy.llm.view import FormatError, Reply, Request, Text, ToolCall

API = "openai-responses"
TEXT = "input_text"
_FINAL = ("response.completed", "response.incomplete", "response.failed")


def parse_request(body: dict[str, Any]) -> Request:
    items = body.get("input")
    model = body.get("model")
    request = Request(model=model if isinstance(model, str) else None, stream=body.get("stream") is True, turn=0)
    _parse_tools(body, request)
    if isinstance(items, str):
        request.prompts.append(Text(items, lambda text: body.__setitem__("input", text)))
        return request
    if not isinstance(items, list) or not all(isinstance(item, dict) for item in items):
        raise FormatError("'input' is neither a string nor a list of items")
    answered = [i for i, item in enumerate(items) if _kind(item) in ("assistant", "function_call")]
    last = max(answered, default=-1)
    request.turn = sum(_kind(item) in ("assistant", "function_call") and _kind(prev) not in ("function_call",)
                       for prev, item in zip([{}, *items], items, strict=False))
    for i, item in enumerate(items):
        match _kind(item):
            case "user" if (text := view.user_text(item, TEXT)) is not None:
                request.prompts.append(text)
            case "function_call_output" if isinstance(call_id := item.get("call_id"), str):
                request.results.append(view.flagless_result(item, "output", call_id, TEXT, newest=i > last,
                                                            carrier="Responses function_call_output items"))
            case "function_call" if isinstance(item.get("name"), str):
                request.calls.append(_call(item))
    return request


def _kind(item: dict[str, Any]) -> str | None:
    kind = item.get("type", "message")
    return item.get("role") if kind == "message" else kind


def _parse_tools(body: dict[str, Any], request: Request) -> None:
    tools = body.get("tools")
    if not isinstance(tools, list) or not tools:
        return
    converted = [view.function_tool(entry.get("name"), entry.get("description"), entry.get("parameters"), i)
                 if isinstance(entry, dict) and entry.get("type") == "function" else None
                 for i, entry in enumerate(tools)]
    request.tools = [tool for tool in converted if tool is not None]

    def back(tool: dict[str, Any], original: dict[str, Any] | None) -> dict[str, Any]:
        template = {key: value for key, value in (original or {"type": "function"}).items()
                    if key not in ("name", "description", "parameters")}
        return {**template, "name": tool["name"],
                **({"description": tool["description"]} if "description" in tool else {}),
                "parameters": tool.get("inputSchema", {"type": "object"})}

    request.put_tools = lambda shown: body.__setitem__("tools", view.merged_tools(tools, converted, shown, back))


def _call(item: dict[str, Any]) -> ToolCall:
    def put(name: str, arguments: str) -> None:
        item["name"], item["arguments"] = name, arguments

    arguments = item.get("arguments")
    return ToolCall(str(item.get("call_id")), item["name"], arguments if isinstance(arguments, str) else "", put)


def parse_reply(body: dict[str, Any]) -> Reply:
    output = body.get("output")
    if body.get("object") != "response" or not isinstance(output, list):
        raise FormatError("not a response object with an output list")
    calls = [_call(item) for item in output if isinstance(item, dict) and item.get("type") == "function_call"
             and isinstance(item.get("name"), str)]

    def empty(mode: str) -> None:
        _empty_response(body, mode)

    return Reply(calls, empty)


def _empty_response(response: dict[str, Any], mode: str) -> None:
    """No output items; for `length`, an incomplete response stopped at max_output_tokens."""
    response["output"] = []
    if mode == "length":
        response["status"] = "incomplete"
        response["incomplete_details"] = {"reason": "max_output_tokens"}


class Editor(stream.Editor):
    """Events pass as they come (renumbered once one is held); a function_call item is held from
    `output_item.added` to `output_item.done`, then sent whole, and `response.completed` repeats it."""

    def __init__(self, plan: stream.StreamPlan) -> None:
        super().__init__(plan)
        self.held: dict[str, dict[str, Any]] = {}  # item id -> the item as added, and its arguments
        self.edited: dict[str, dict[str, Any]] = {}  # item id -> the item as sent
        self.sequence: int | None = None
        self.snapshot: dict[str, Any] = {}  # the response as last announced (for response.failed)

    def edit(self, event: bytes) -> list[bytes]:
        name, data = stream.parse(event)
        if not isinstance(data, dict):
            return [event]
        if self.sequence is None and isinstance(data.get("sequence_number"), int):
            self.sequence = data["sequence_number"]
        if isinstance(data.get("response"), dict):
            self.snapshot = data["response"]
        item = data.get("item") if isinstance(data.get("item"), dict) else {}
        item_id = item.get("id") or data.get("item_id")
        match name:
            case "response.output_item.added" if item.get("type") == "function_call":
                self.held[item_id] = {"item": item, "arguments": "", "output_index": data.get("output_index")}
                return []
            case "response.function_call_arguments.delta" if item_id in self.held:
                self.held[item_id]["arguments"] += data.get("delta") or ""
                return []
            case "response.function_call_arguments.done" if item_id in self.held:
                self.held[item_id]["arguments"] = data.get("arguments") or self.held[item_id]["arguments"]
                return []
            case "response.output_item.done" if item_id in self.held:
                return self._flush(item_id, item)
            case _ if self.plan.empty is not None and name is not None and name.startswith(
                    ("response.output_", "response.content_part.", "response.function_call_arguments.")):
                return []
            case _ if name in _FINAL and isinstance(data.get("response"), dict):
                return [self._send(self._final(data), name)]
        return [self._pass(event, data, name)]

    def _pass(self, event: bytes, data: dict[str, Any], name: str | None) -> bytes:
        """An event sent as it came, unless holding an earlier one means renumbering it."""
        if self.sequence is None or data.get("sequence_number") == self.sequence:
            self.sequence = self.sequence + 1 if self.sequence is not None else None
            return event
        return self._send(data, name)

    def _final(self, data: dict[str, Any]) -> dict[str, Any]:
        response = dict(data["response"])
        if self.plan.empty is not None:
            _empty_response(response, self.plan.empty)
        elif isinstance(response.get("output"), list):
            response["output"] = [self.edited.get(item.get("id"), item) if isinstance(item, dict) else item
                                  for item in response["output"]]
        return {**data, "response": response}

    def _flush(self, item_id: str, done: dict[str, Any]) -> list[bytes]:
        held = self.held.pop(item_id)
        if self.plan.empty is not None:
            return []
        item = held["item"]
        call = self.call(ToolCall(str(item.get("call_id")), str(item.get("name")), held["arguments"]))
        sent = {**done, "name": call.name, "arguments": call.arguments}
        self.edited[item_id] = sent
        where = {"output_index": held["output_index"]}
        return [self._send({"type": "response.output_item.added", **where,
                            "item": {**item, "name": call.name, "arguments": ""}}, "response.output_item.added"),
                self._send({"type": "response.function_call_arguments.delta", "item_id": item_id, **where,
                            "delta": call.arguments}, "response.function_call_arguments.delta"),
                self._send({"type": "response.function_call_arguments.done", "item_id": item_id, **where,
                            "name": call.name, "arguments": call.arguments}, "response.function_call_arguments.done"),
                self._send({"type": "response.output_item.done", **where, "item": sent}, "response.output_item.done")]

    def _send(self, data: dict[str, Any], name: str | None) -> bytes:
        """The event with the next sequence number (events held or dropped leave no gap)."""
        if self.sequence is not None:
            data = {**data, "sequence_number": self.sequence}
            self.sequence += 1
        return stream.frame(data, name)

    def error_events(self) -> list[bytes]:
        name, raw = self.plan.error or ("error", b"{}")
        error = stream.parse(b"data: " + raw + b"\n\n")[1] or {}
        failed = {**self.snapshot, "status": "failed",
                  "error": {"code": error.get("code"), "message": error.get("message")}}
        return [self._send(error, name), self._send({"type": "response.failed", "response": failed},
                                                   "response.failed")]
