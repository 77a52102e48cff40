"""OpenAI Chat Completions (`POST .../chat/completions`), the shape vLLM, Ollama and LiteLLM serve too.

Tools are `{"type": "function", "function": {name, description, parameters}}`; the history holds
`role: tool` messages (results, by `tool_call_id`) and assistant `tool_calls` (arguments as JSON
text); a stream is `chat.completion.chunk`s whose `tool_calls` deltas carry each call's arguments in
pieces, ended by `data: [DONE]`.
"""

from __future__ import annotations

from typing import Any

from chaosproxy.engine.actions import BlankCompletion
from chaosproxy.protocols import streams
from chaosproxy.protocols.llm import OPENAI_CHAT, stream, view
from chaosproxy.protocols.llm.view import FormatError, Reply, Request, ToolCall

API = OPENAI_CHAT
TEXT = "text"
TOOLS = view.ToolShape(lambda entry: entry.get("type") == "function" and isinstance(entry.get("function"), dict),
                       "parameters", nested="function", new_entry={"type": "function", "function": {}})


def parse_request(body: dict[str, Any]) -> Request:
    messages, request, last_assistant = view.messages_request(body, TOOLS)
    for i, message in enumerate(messages):
        match message.get("role"):
            case "user" if (text := view.user_text(message, TEXT)) is not None:
                request.prompts.append(text)
            case "tool" if isinstance(call_id := message.get("tool_call_id"), str):
                request.results.append(view.flagless_result(message, "content", call_id, TEXT,
                                                            newest=i > last_assistant,
                                                            carrier="Chat Completions tool messages"))
            case "assistant":
                request.calls += [call for entry in message.get("tool_calls") or [] if (call := _call(entry))]
    return request


def _call(entry: Any) -> ToolCall | None:
    function = entry.get("function") if isinstance(entry, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        return None

    def put(name: str, arguments: str) -> None:
        entry["function"] = {**function, "name": name, "arguments": arguments}

    arguments = function.get("arguments")
    return ToolCall(str(entry.get("id")), function["name"], arguments if isinstance(arguments, str) else "", put)


def parse_reply(body: dict[str, Any]) -> Reply:
    choices = body.get("choices")
    if body.get("object") not in (None, "chat.completion") or not isinstance(choices, list):
        raise FormatError("not a chat.completion object with choices")
    messages = [choice["message"] for choice in choices
                if isinstance(choice, dict) and isinstance(choice.get("message"), dict)]
    calls = [call for message in messages for entry in message.get("tool_calls") or [] if (call := _call(entry))]

    def empty(action: BlankCompletion) -> None:
        for choice in choices:
            message = choice.get("message") if isinstance(choice, dict) else None
            if isinstance(message, dict):
                message.pop("tool_calls", None)
                message["content"] = _cut(message.get("content"), action.mode)
                choice["finish_reason"] = action.stop

    has_output = any(message.get("content") or message.get("tool_calls") for message in messages)
    return Reply(calls, has_output, empty)


def _cut(content: Any, mode: str) -> str:
    """Nothing (`empty`), or the first half of the text (`length`: the model ran out of tokens)."""
    text = content if isinstance(content, str) else ""
    return text[: len(text) // 2] if mode == "length" else ""


class Editor(stream.Editor):
    """Chunks pass as they come. A tool call some rule may change is held (with what comes after it)
    until its choice finishes; when a fault changed it, its first piece carries the call as the agent
    gets it, in the chunk it came in, with every other field kept, and its later pieces are emptied."""

    def __init__(self, decisions: stream.Decisions) -> None:
        super().__init__(decisions)
        self.calls: dict[tuple[Any, Any], stream.HeldCall] = {}  # (choice, tool index) -> the call
        self.shown: dict[Any, int] = {}  # choice -> characters of content sent (for a cut-off reply)

    def edit(self, event: stream.Event) -> list[stream.Event]:
        chunk = event.data
        if not isinstance(chunk, dict) or not isinstance(choices := chunk.get("choices"), list):
            if streams.sse_data(event.raw) == b"[DONE]":
                for call in self.calls.values():
                    self.completed(call)
            return [event]
        deltas = [(choice, choice["delta"]) for choice in choices
                  if isinstance(choice, dict) and isinstance(choice.get("delta"), dict)]
        if any(delta.get("content") or delta.get("tool_calls") for _, delta in deltas):
            self.output_starts()
        if self.empty is not None:
            return self._emptied(event, chunk, choices)
        for choice, delta in deltas:
            index = choice.get("index", 0)
            for position, piece in enumerate(delta.get("tool_calls") or []):
                if isinstance(piece, dict):
                    self._piece(event, (index, piece.get("index", position)), piece)
            if choice.get("finish_reason") is not None:
                for key, call in self.calls.items():
                    if key[0] == index:
                        self.completed(call)
        return [event]

    def _piece(self, event: stream.Event, key: tuple[Any, Any], piece: dict[str, Any]) -> None:
        function = given if isinstance(given := piece.get("function"), dict) else {}
        name = named if isinstance(named := function.get("name"), str) else ""
        call = self.calls.get(key)
        if call is None:
            call = self.calls[key] = self.hold(event, stream.HeldCall(str(piece.get("id")), name, key=key))
        elif call.complete:
            return
        else:
            call.name += name
            if call.events[-1] is not event:
                call.events.append(event)
        if not call.complete and isinstance(arguments := function.get("arguments"), str):
            call.arguments += arguments

    def rewrite(self, call: stream.HeldCall, edited: ToolCall) -> None:
        first = True
        for event in call.events:
            for piece in _pieces(event.data, call.key):
                function = given if isinstance(given := piece.get("function"), dict) else {}
                if first:
                    new = {**function, "name": edited.name, "arguments": edited.arguments}
                    first = False
                else:
                    new = {key: "" if key == "arguments" else value
                           for key, value in function.items() if key != "name"}
                if new != function:
                    piece["function"] = new
                    event.dirty = True

    def _emptied(self, event: stream.Event, chunk: dict[str, Any], choices: list[Any]) -> list[stream.Event]:
        """The chunk with no tool calls, its text cut (all of it, or past the first characters) and the
        planned finish reason; a chunk left with nothing to say is not sent."""
        assert self.empty is not None
        kept: list[Any] = []
        changed = False
        for choice in choices:
            if not isinstance(choice, dict) or not isinstance(delta := choice.get("delta"), dict):
                kept.append(choice)
                continue
            new = self._cut(choice.get("index", 0), {k: v for k, v in delta.items() if k != "tool_calls"})
            finished = choice.get("finish_reason") is not None
            new_choice = {**choice, "delta": new} | ({"finish_reason": self.empty.stop} if finished else {})
            changed |= new_choice != choice
            if new or finished or set(choice) - {"index", "delta", "finish_reason", "logprobs"}:
                kept.append(new_choice)
        if not changed:
            return [event]
        if not kept and not chunk.get("usage"):
            return []
        event.data, event.dirty = {**chunk, "choices": kept}, True
        return [event]

    def _cut(self, index: Any, delta: dict[str, Any]) -> dict[str, Any]:
        text = delta.get("content")
        if not isinstance(text, str) or not text:
            return delta
        assert self.empty is not None
        allowed = 0
        if self.empty.mode == "length":  # the first characters go, as a short answer's would
            allowed = max(0, stream.CUT_OFF_CHARS - self.shown.get(index, 0))
            self.shown[index] = self.shown.get(index, 0) + len(text)
        text = text[:allowed]
        return {**delta, "content": text} if text else {k: v for k, v in delta.items() if k != "content"}


def _pieces(chunk: dict[str, Any], key: tuple[Any, Any]) -> list[dict[str, Any]]:
    """The tool-call pieces of one call (by choice and tool index) in a chunk."""
    return [piece for choice in chunk.get("choices") or [] if isinstance(choice, dict)
            and choice.get("index", 0) == key[0] and isinstance(delta := choice.get("delta"), dict)
            for position, piece in enumerate(delta.get("tool_calls") or [])
            if isinstance(piece, dict) and piece.get("index", position) == key[1]]
