"""OpenAI Chat Completions (`POST .../chat/completions`), the shape vLLM, Ollama and LiteLLM serve too.

Tools are `{"type": "function", "function": {name, description, parameters}}`; the history holds
`role: tool` messages (results, by `tool_call_id`) and assistant `tool_calls` (arguments as JSON
text); a stream is `chat.completion.chunk`s whose `tool_calls` deltas carry each call's arguments in
pieces, ended by `data: [DONE]`.
"""

from __future__ import annotations

from typing import Any

from chaosproxy import streams
from chaosproxy.llm import stream, view
from chaosproxy.llm.view import FormatError, Reply, Request, ToolCall

API = "openai-chat"
TEXT = "text"


def parse_request(body: dict[str, Any]) -> Request:
    messages, request, last_assistant = view.messages_request(body)
    _parse_tools(body, request)
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


def _parse_tools(body: dict[str, Any], request: Request) -> None:
    tools = body.get("tools")
    if not isinstance(tools, list) or not tools:
        return
    converted = [view.function_tool(fn.get("name"), fn.get("description"), fn.get("parameters"), i)
                 if isinstance(entry, dict) and entry.get("type") == "function"
                 and isinstance(fn := entry.get("function"), dict) else None for i, entry in enumerate(tools)]
    request.tools = [tool for tool in converted if tool is not None]

    def back(tool: dict[str, Any], template: dict[str, Any] | None) -> dict[str, Any]:
        template = template or {"type": "function", "function": {}}
        function = {key: value for key, value in template["function"].items()
                    if key not in ("name", "description", "parameters")}
        function = {"name": tool["name"], **({"description": tool["description"]} if "description" in tool else {}),
                    "parameters": tool.get("inputSchema", {"type": "object"}), **function}
        return {**template, "function": function}

    request.put_tools = lambda shown: body.__setitem__("tools", view.merged_tools(tools, converted, shown, back))


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
    calls = [call for choice in choices if isinstance(choice, dict) and isinstance(choice.get("message"), dict)
             for entry in choice["message"].get("tool_calls") or [] if (call := _call(entry))]

    def empty(mode: str) -> None:
        for choice in choices:
            message = choice.get("message") if isinstance(choice, dict) else None
            if isinstance(message, dict):
                message.pop("tool_calls", None)
                message["content"] = _cut(message.get("content"), mode)
                choice["finish_reason"] = "length" if mode == "length" else "stop"

    return Reply(calls, empty)


def _cut(content: Any, mode: str) -> str:
    """Nothing (`empty`), or the first half of the text (`length`: the model ran out of tokens)."""
    text = content if isinstance(content, str) else ""
    return text[: len(text) // 2] if mode == "length" else ""


class Editor(stream.Editor):
    """Chunks pass as they come; a tool call's deltas are held until its choice finishes, then sent
    as one delta with the whole (possibly rewritten) call."""

    def __init__(self, plan: stream.StreamPlan) -> None:
        super().__init__(plan)
        self.held: dict[int, dict[int, dict[str, Any]]] = {}  # choice -> tool index -> id, name, arguments
        self.envelope: dict[str, Any] | None = None
        self.shown: dict[int, int] = {}  # choice -> characters of content sent (for a cut-off reply)

    def edit(self, event: bytes) -> list[bytes]:
        _, chunk = stream.parse(event)
        if not isinstance(chunk, dict) or not isinstance(choices := chunk.get("choices"), list):
            if streams.sse_data(event) == b"[DONE]":
                return [*self._flush_all(), event]
            return [event]
        self.envelope = self.envelope or {k: v for k, v in chunk.items() if k not in ("choices", "usage")}
        out: list[bytes] = []
        kept = []
        changed = False
        for choice in choices:
            if not isinstance(choice, dict) or not isinstance(delta := choice.get("delta"), dict):
                kept.append(choice)
                continue
            index = choice.get("index", 0)
            new_delta = self._delta(index, delta)
            changed = changed or new_delta is not delta
            finished = choice.get("finish_reason") is not None
            if finished:
                out += self._flush(index)
                if self.plan.empty is not None:
                    choice = {**choice, "finish_reason": "length" if self.plan.empty == "length" else "stop"}
                    changed = True
            if new_delta or finished or set(choice) - {"index", "delta", "finish_reason", "logprobs"}:
                kept.append({**choice, "delta": new_delta} if new_delta is not delta else choice)
            else:
                changed = True
        if not changed:
            return [*out, event]
        if kept or not choices or "usage" in chunk and chunk["usage"]:
            out.append(stream.frame({**chunk, "choices": kept}))
        return out

    def _delta(self, index: int, delta: dict[str, Any]) -> dict[str, Any]:
        """The delta with its tool-call pieces taken into `held` (and its content cut, if planned)."""
        new = delta
        if "tool_calls" in delta:
            for piece in delta["tool_calls"] or []:
                if not isinstance(piece, dict):
                    continue
                call = self.held.setdefault(index, {}).setdefault(piece.get("index", 0),
                                                                 {"id": None, "name": "", "arguments": ""})
                function = piece.get("function") or {}
                call["id"] = piece.get("id") or call["id"]
                call["name"] += function.get("name") or ""
                call["arguments"] += function.get("arguments") or ""
            new = {k: v for k, v in delta.items() if k != "tool_calls"}
        if self.plan.empty is not None and isinstance(text := new.get("content"), str) and text:
            if self.plan.empty == "length":  # let the first 40 characters through, as a short answer would
                allowed = max(0, 40 - self.shown.get(index, 0))
                self.shown[index] = self.shown.get(index, 0) + len(text)
                text = text[:allowed]
            else:
                text = ""
            new = {**new, "content": text} if text else {k: v for k, v in new.items() if k != "content"}
        return new

    def _flush(self, index: int) -> list[bytes]:
        calls = self.held.pop(index, {})
        if self.plan.empty is not None:
            return []
        out = []
        for position, call in sorted(calls.items()):
            edited = self.call(ToolCall(str(call["id"]), call["name"], call["arguments"]))
            piece = {"index": position, "id": call["id"], "type": "function",
                     "function": {"name": edited.name, "arguments": edited.arguments}}
            out.append(stream.frame({**(self.envelope or {}), "choices": [
                {"index": index, "delta": {"tool_calls": [piece]}, "finish_reason": None}]}))
        return out

    def _flush_all(self) -> list[bytes]:
        return [event for index in sorted(self.held) for event in self._flush(index)]

    def finish(self) -> list[bytes]:
        return self._flush_all()
