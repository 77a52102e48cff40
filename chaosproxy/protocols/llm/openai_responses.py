"""OpenAI Responses (`POST .../v1/responses`).

The input is a string or a list of items: messages (`input_text` parts), `function_call`s (arguments
as JSON text) and `function_call_output`s (by `call_id`). With `previous_response_id` only the new
items are sent, so calls made earlier are known from what the relay saw go by. A stream is named
events with a `sequence_number`; `response.completed` repeats the whole output.
"""

from __future__ import annotations

from typing import Any

import orjson

from chaosproxy.engine.actions import BlankCompletion
from chaosproxy.protocols.llm import OPENAI_RESPONSES, stream, view
from chaosproxy.protocols.llm.view import FormatError, Reply, Request, Text, ToolCall

API = OPENAI_RESPONSES
TEXT = "input_text"
TOOLS = view.ToolShape(lambda entry: entry.get("type") == "function", "parameters", new_entry={"type": "function"})
_FINAL = ("response.completed", "response.incomplete", "response.failed")


def parse_request(body: dict[str, Any]) -> Request:
    items = body.get("input")
    model = body.get("model")
    request = Request(model=model if isinstance(model, str) else None, stream=body.get("stream") is True, turn=0)
    TOOLS.parse(body, request)
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

    def empty(action: BlankCompletion) -> None:
        _empty_response(body, action.mode)

    return Reply(calls, bool(output), empty)


def _empty_response(response: dict[str, Any], mode: str) -> None:
    """No output items; for `length`, an incomplete response stopped at max_output_tokens."""
    response["output"] = []
    if mode == "length":
        response["status"] = "incomplete"
        response["incomplete_details"] = {"reason": "max_output_tokens"}


class Editor(stream.Editor):
    """Events pass as they come. A function_call item some rule may change is held (with what comes after
    it) from `output_item.added` to `output_item.done`; when a fault changed it, its events and the final
    `response.completed` carry the call as the agent gets it (the first arguments delta the whole of it,
    later ones emptied), so no event is added or removed and the sequence numbers stand.

    An empty or cut-off reply has no output items: every event of one is left out (reasoning summaries
    included, as in the whole reply), the sequence numbers close up, and a cut-off one ends as the API's
    does, with `response.incomplete`."""

    def __init__(self, decisions: stream.Decisions) -> None:
        super().__init__(decisions)
        self.calls: dict[str, stream.HeldCall] = {}  # item id -> its call
        self.edited: dict[str, tuple[str, str]] = {}  # item id -> the call's name and arguments, as sent
        self.snapshot: dict[str, Any] = {}  # the response as last announced (for response.failed)
        self.left_out = 0  # events of an empty reply left out so far

    def edit(self, event: stream.Event) -> list[stream.Event]:
        data, name = event.data, event.name
        if not isinstance(data, dict):
            return [event]
        if isinstance(data.get("response"), dict):
            self.snapshot = data["response"]
        if name == "response.output_item.added":
            self.output_starts()
        if self.empty is not None:
            return self._emptied(event, data)
        item = given if isinstance(given := data.get("item"), dict) else {}
        item_id = item.get("id") or data.get("item_id")
        call = self.calls.get(item_id) if isinstance(item_id, str) else None
        if call is not None and call.complete:
            call = None  # only a call still held takes more events
        match name:
            case "response.output_item.added" if item.get("type") == "function_call" and isinstance(item_id, str):
                self.calls[item_id] = self.hold(event, stream.HeldCall(str(item.get("call_id")), str(item.get("name")),
                                                                       key=item_id))
            case "response.function_call_arguments.delta" if call is not None and isinstance(data.get("delta"), str):
                call.arguments += data["delta"]
                call.events.append(event)
            case "response.function_call_arguments.done" if call is not None and isinstance(data.get("arguments"), str):
                call.arguments = data["arguments"]
                call.events.append(event)
            case "response.output_item.done" if call is not None:
                call.events.append(event)
                self.completed(call)
            case _ if name in _FINAL and self.edited and isinstance(output := self.snapshot.get("output"), list):
                for entry in output:  # the snapshot is this event's response
                    if isinstance(entry, dict) and (sent := self.edited.get(str(entry.get("id")))) is not None \
                            and (entry.get("name"), entry.get("arguments")) != sent:
                        entry["name"], entry["arguments"] = sent
                        event.dirty = True
        return [event]

    def rewrite(self, call: stream.HeldCall, edited: ToolCall) -> None:
        first_delta = True
        for event in call.events:
            data = event.data
            match event.name:
                case "response.output_item.added":
                    _put(event, data["item"], name=edited.name)
                case "response.function_call_arguments.delta":
                    _put(event, data, delta=edited.arguments if first_delta else "")
                    first_delta = False
                case "response.function_call_arguments.done":
                    _put(event, data, arguments=edited.arguments, **({"name": edited.name} if "name" in data else {}))
                case "response.output_item.done":
                    _put(event, data["item"], name=edited.name, arguments=edited.arguments)
        self.edited[call.key] = (edited.name, edited.arguments)

    def _emptied(self, event: stream.Event, data: dict[str, Any]) -> list[stream.Event]:
        assert self.empty is not None
        if "output_index" in data or "item_id" in data:  # an event of an output item
            self.left_out += 1
            return []
        if self.left_out and isinstance(number := data.get("sequence_number"), int):
            event.change()["sequence_number"] = number - self.left_out
        if event.name in _FINAL and isinstance(response := data.get("response"), dict):
            response = dict(response)
            _empty_response(response, self.empty.mode)
            name = "response.incomplete" if self.empty.mode == "length" else event.name
            event.raw, event.data, event.dirty = stream.frame({**data, "type": name, "response": response}, name), \
                None, False
        return [event]

    def error_events(self, name: str, data: bytes, replaced: stream.Event) -> list[bytes]:
        """The error event, numbered as the event it replaces, then `response.failed` with the response so far."""
        error = orjson.loads(data)
        failed = {**self.snapshot, "status": "failed",
                  "error": {"code": error.get("code"), "message": error.get("message")}}
        number = replaced.data.get("sequence_number") if isinstance(replaced.data, dict) else None
        return [stream.frame({**error, **({"sequence_number": number} if isinstance(number, int) else {})}, name),
                stream.frame({"type": "response.failed", "response": failed,
                              **({"sequence_number": number + 1} if isinstance(number, int) else {})},
                             "response.failed")]


def _put(event: stream.Event, holder: dict[str, Any], **values: Any) -> None:
    """Set `values` in a part of an event's data; the event goes re-serialised if that changed it."""
    for key, value in values.items():
        if holder.get(key) != value:
            holder[key] = value
            event.dirty = True
