"""A scripted model API for the demo, the tests and the benchmark: no model, three formats, streamed or not.

  POST /v1/chat/completions   OpenAI Chat Completions (chunks with tool_calls deltas, [DONE])
  POST /v1/responses          OpenAI Responses (named events with sequence_number; previous_response_id)
  POST /v1/messages           Anthropic Messages (message_start ... message_stop, input_json_delta, ping)

It decides from the request, so what a proxy changed shows in what comes back. The newest user turn
is the script: each `call NAME(key=value, ...)` in it is one tool call, made in order, one per turn
(the turn is the number of assistant turns in the history). NAME is matched against the tools the
request lists as a model would: exactly, else a listed name that abbreviates, re-cases or prefixes
it, else the one sharing most words with it; a key is matched to a parameter by name or prefix
(`city` fills `city_v2`). When the directives are used up the model answers in text: `Results: ...`
(the tool results it got, newest last) or `You said: ...` (the prompt as it arrived). A request
naming the model `unexpected-shape` gets a 200 whose body is not the format's. Ids and timestamps
derive from the request, so one request always gets the same answer. `ScriptedModel.requests` keeps
every request body for tests to inspect.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from chaosproxy.demo.serving import serve

CREATED = 1_767_225_600
_DIRECTIVE = re.compile(r"\bcall\s+([A-Za-z_][\w.-]*)\s*\(([^)]*)\)")
_ARGUMENT = re.compile(r"\s*(\w+)\s*=\s*(\"[^\"]*\"|'[^']*'|[^,]*)\s*(?:,|$)")


@dataclass(slots=True)
class Conversation:
    """What the script reads from a request, whatever its format."""

    prompt: str = ""
    tools: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> input schema
    results: list[str] = field(default_factory=list)
    turn: int = 0


@dataclass(slots=True)
class Decision:
    text: str = ""
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)


def decide(conversation: Conversation) -> Decision:
    directives = _DIRECTIVE.findall(conversation.prompt)
    if conversation.turn < len(directives) and conversation.tools:
        name, raw = directives[conversation.turn]
        tool = _resolve(name, conversation.tools)
        if tool is not None:
            return Decision(calls=[(tool, _arguments(raw, conversation.tools[tool]))])
    if conversation.results:
        return Decision("Results: " + " | ".join(conversation.results))
    return Decision("You said: " + conversation.prompt)


def _squash(name: str) -> str:
    """A name as abbreviations and re-casings leave it: lower case, no separators, no inner vowels."""
    plain = re.sub(r"[^a-z0-9]", "", name.lower())
    return plain[:1] + re.sub(r"[aeiou]", "", plain[1:])


def _resolve(name: str, tools: dict[str, Any]) -> str | None:
    if name in tools:
        return name
    for candidate in tools:  # last listed wins, as clients keep the last of a duplicated name
        if _squash(candidate) == _squash(name):
            return candidate
    if prefixed := next((candidate for candidate in tools if candidate.endswith(name)), None):
        return prefixed
    overlap = {candidate: len(_words(candidate) & _words(name)) for candidate in tools}
    best = max(overlap, key=overlap.__getitem__, default=None)
    return best if best is not None and overlap[best] else None


def _words(name: str) -> set[str]:
    return {word.lower() for word in re.findall(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|\d+", name)} - {"get", "set"}


def _arguments(raw: str, schema: dict[str, Any]) -> dict[str, Any]:
    listed = schema.get("properties")
    properties: dict[str, Any] = listed if isinstance(listed, dict) else {}
    arguments: dict[str, Any] = {}
    for key, value in _ARGUMENT.findall(raw):
        value = value.strip()
        parsed: Any = value[1:-1] if value[:1] in "\"'" else int(value) if value.lstrip("-").isdigit() else value
        target = key if key in properties or not properties else next(
            (p for p in properties if p.startswith(key)), key)
        if properties.get(target, {}).get("type") == "string":
            parsed = str(parsed)
        arguments[target] = parsed
    return arguments


def _digest(body: bytes, *parts: object) -> str:
    return hashlib.sha256(body + repr(parts).encode()).hexdigest()[:20]


def _texts(content: Any, kinds: tuple[str, ...]) -> str:
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content or [] if isinstance(part, dict)
                   and part.get("type") in kinds)


def _pieces(text: str, size: int = 8) -> list[str]:
    return [text[i:i + size] for i in range(0, len(text), size)] or [""]


# --- OpenAI Chat Completions --------------------------------------------------------------------------


def chat_conversation(body: dict[str, Any]) -> Conversation:
    conversation = Conversation()
    for tool in body.get("tools") or []:
        function = tool.get("function") or {}
        conversation.tools[function.get("name", "")] = function.get("parameters") or {}
    messages = body.get("messages") or []
    conversation.turn = sum(m.get("role") == "assistant" for m in messages)
    last_assistant = max((i for i, m in enumerate(messages) if m.get("role") == "assistant"), default=-1)
    for i, message in enumerate(messages):
        if message.get("role") == "user":
            conversation.prompt = _texts(message.get("content"), ("text",))
        elif message.get("role") == "tool" and i > last_assistant:
            conversation.results.append(_texts(message.get("content"), ("text",)))
    return conversation


def chat_reply(body: bytes, model: str, decision: Decision) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": decision.text or None, "refusal": None}
    if decision.calls:
        message["tool_calls"] = [{"id": "call_" + _digest(body, i), "type": "function",
                                  "function": {"name": name, "arguments": json.dumps(arguments)}}
                                 for i, (name, arguments) in enumerate(decision.calls)]
    return {"id": "chatcmpl-" + _digest(body), "object": "chat.completion", "created": CREATED, "model": model,
            "choices": [{"index": 0, "message": message, "logprobs": None,
                         "finish_reason": "tool_calls" if decision.calls else "stop"}],
            "usage": {"prompt_tokens": len(body) // 4, "completion_tokens": 9, "total_tokens": len(body) // 4 + 9}}


def chat_events(body: bytes, model: str, decision: Decision, usage: bool) -> list[bytes]:
    head = {"id": "chatcmpl-" + _digest(body), "object": "chat.completion.chunk", "created": CREATED,
            "model": model, "system_fingerprint": "fp_scripted"}

    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        return _sse({**head, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]})

    events = [chunk({"role": "assistant", "content": "", "refusal": None})]
    if decision.text:
        events += [chunk({"content": piece}) for piece in _pieces(decision.text)]
    for i, (name, arguments) in enumerate(decision.calls):
        events.append(chunk({"tool_calls": [{"index": i, "id": "call_" + _digest(body, i), "type": "function",
                                             "function": {"name": name, "arguments": ""}}]}))
        events += [chunk({"tool_calls": [{"index": i, "function": {"arguments": piece}}]})
                   for piece in _pieces(json.dumps(arguments), 6)]
    events.append(chunk({}, "tool_calls" if decision.calls else "stop"))
    if usage:
        events.append(_sse({**head, "choices": [], "usage": chat_reply(body, model, decision)["usage"]}))
    return [*events, b"data: [DONE]\n\n"]


# --- Anthropic Messages -------------------------------------------------------------------------------


def anthropic_conversation(body: dict[str, Any]) -> Conversation:
    conversation = Conversation()
    for tool in body.get("tools") or []:
        conversation.tools[tool.get("name", "")] = tool.get("input_schema") or {}
    messages = body.get("messages") or []
    conversation.turn = sum(m.get("role") == "assistant" for m in messages)
    last_assistant = max((i for i, m in enumerate(messages) if m.get("role") == "assistant"), default=-1)
    for i, message in enumerate(messages):
        content = message.get("content")
        if message.get("role") != "user":
            continue
        if text := _texts(content, ("text",)):
            conversation.prompt = text
        if isinstance(content, list) and i > last_assistant:
            conversation.results += [_texts(block.get("content"), ("text",)) for block in content
                                     if isinstance(block, dict) and block.get("type") == "tool_result"]
    return conversation


def anthropic_reply(body: bytes, model: str, decision: Decision) -> dict[str, Any]:
    content: list[dict[str, Any]] = [{"type": "text", "text": decision.text}] if decision.text else []
    content += [{"type": "tool_use", "id": "toolu_" + _digest(body, i), "name": name, "input": arguments}
                for i, (name, arguments) in enumerate(decision.calls)]
    return {"id": "msg_" + _digest(body), "type": "message", "role": "assistant", "model": model,
            "content": content, "stop_reason": "tool_use" if decision.calls else "end_turn",
            "stop_sequence": None, "usage": {"input_tokens": len(body) // 4, "output_tokens": 9}}


def anthropic_events(body: bytes, model: str, decision: Decision) -> list[bytes]:
    whole = anthropic_reply(body, model, decision)
    start = {**whole, "content": [], "stop_reason": None, "usage": {**whole["usage"], "output_tokens": 1}}
    events = [_sse({"type": "message_start", "message": start}, "message_start")]
    for index, block in enumerate(whole["content"]):
        if block["type"] == "text":
            events.append(_sse({"type": "content_block_start", "index": index,
                                "content_block": {"type": "text", "text": ""}}, "content_block_start"))
            events.append(_sse({"type": "ping"}, "ping"))
            events += [_sse({"type": "content_block_delta", "index": index,
                             "delta": {"type": "text_delta", "text": piece}}, "content_block_delta")
                       for piece in _pieces(block["text"])]
        else:
            events.append(_sse({"type": "content_block_start", "index": index,
                                "content_block": {**block, "input": {}}}, "content_block_start"))
            events += [_sse({"type": "content_block_delta", "index": index,
                             "delta": {"type": "input_json_delta", "partial_json": piece}}, "content_block_delta")
                       for piece in _pieces(json.dumps(block["input"]), 6)]
        events.append(_sse({"type": "content_block_stop", "index": index}, "content_block_stop"))
    events.append(_sse({"type": "message_delta", "delta": {"stop_reason": whole["stop_reason"],
                                                           "stop_sequence": None},
                        "usage": {"output_tokens": 9}}, "message_delta"))
    return [*events, _sse({"type": "message_stop"}, "message_stop")]


# --- OpenAI Responses ---------------------------------------------------------------------------------


def responses_conversation(items: list[Any], tools: list[Any]) -> Conversation:
    conversation = Conversation()
    for tool in tools:
        if tool.get("type") == "function":
            conversation.tools[tool.get("name", "")] = tool.get("parameters") or {}
    last = -1
    for i, item in enumerate(items):
        kind = item.get("type", "message")
        if kind == "function_call" or kind == "message" and item.get("role") == "assistant":
            conversation.turn += not (i and items[i - 1].get("type") == "function_call")
            last = i
    for i, item in enumerate(items):
        kind = item.get("type", "message")
        if kind == "message" and item.get("role") == "user":
            conversation.prompt = _texts(item.get("content"), ("input_text",))
        elif kind == "function_call_output" and i > last:
            conversation.results.append(_texts(item.get("output"), ("input_text",)))
    return conversation


def responses_reply(body: bytes, request: dict[str, Any], decision: Decision) -> dict[str, Any]:
    rid = "resp_" + _digest(body)
    output: list[dict[str, Any]] = []
    if decision.text:
        output.append({"type": "message", "id": "msg_" + _digest(body), "status": "completed", "role": "assistant",
                       "content": [{"type": "output_text", "text": decision.text, "annotations": []}]})
    output += [{"type": "function_call", "id": "fc_" + _digest(body, i), "call_id": "call_" + _digest(body, i),
                "name": name, "arguments": json.dumps(arguments), "status": "completed"}
               for i, (name, arguments) in enumerate(decision.calls)]
    return {"id": rid, "object": "response", "created_at": CREATED, "status": "completed", "error": None,
            "incomplete_details": None, "instructions": request.get("instructions"), "metadata": {},
            "model": request.get("model"), "output": output, "parallel_tool_calls": True, "temperature": 1.0,
            "tool_choice": "auto", "tools": request.get("tools") or [], "top_p": 1.0,
            "previous_response_id": request.get("previous_response_id"),
            "usage": {"input_tokens": len(body) // 4, "output_tokens": 9, "total_tokens": len(body) // 4 + 9,
                      "input_tokens_details": {"cached_tokens": 0},
                      "output_tokens_details": {"reasoning_tokens": 0}}}


def responses_events(whole: dict[str, Any]) -> list[bytes]:
    events: list[tuple[str, dict[str, Any]]] = []
    pending = {**whole, "status": "in_progress", "output": [], "usage": None}
    events += [("response.created", {"response": pending}), ("response.in_progress", {"response": pending})]
    for index, item in enumerate(whole["output"]):
        where = {"output_index": index}
        if item["type"] == "message":
            text = item["content"][0]["text"]
            part = {"type": "output_text", "text": "", "annotations": []}
            ids = {"item_id": item["id"], **where, "content_index": 0}
            events += [("response.output_item.added", {**where, "item": {**item, "status": "in_progress",
                                                                          "content": []}}),
                       ("response.content_part.added", {**ids, "part": part})]
            events += [("response.output_text.delta", {**ids, "delta": piece}) for piece in _pieces(text)]
            events += [("response.output_text.done", {**ids, "text": text}),
                       ("response.content_part.done", {**ids, "part": {**part, "text": text}})]
        else:
            events.append(("response.output_item.added", {**where, "item": {**item, "arguments": "",
                                                                             "status": "in_progress"}}))
            events += [("response.function_call_arguments.delta", {"item_id": item["id"], **where, "delta": piece})
                       for piece in _pieces(item["arguments"], 6)]
            events.append(("response.function_call_arguments.done", {"item_id": item["id"], **where,
                                                                      "arguments": item["arguments"]}))
        events.append(("response.output_item.done", {**where, "item": item}))
    events.append(("response.completed", {"response": whole}))
    return [_sse({"type": name, **data, "sequence_number": n}, name) for n, (name, data) in enumerate(events)]


# --- the server ---------------------------------------------------------------------------------------


def _sse(data: dict[str, Any], event: str | None = None) -> bytes:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(data)}\n\n".encode()


class ScriptedModel:
    """The aiohttp application, with what it was asked (`requests`) and the Responses it stored."""

    def __init__(self, event_delay_s: float = 0.0) -> None:
        self.event_delay_s = event_delay_s
        self.requests: list[dict[str, Any]] = []
        self._stored: dict[str, list[Any]] = {}  # response id -> the items of its conversation so far
        self.app = web.Application(client_max_size=64 << 20)
        self.app.router.add_post("/v1/chat/completions", self._chat)
        self.app.router.add_post("/v1/messages", self._anthropic)
        self.app.router.add_post("/v1/responses", self._responses)

    async def _read(self, request: web.Request) -> tuple[bytes, dict[str, Any]]:
        raw = await request.read()
        body = json.loads(raw)
        self.requests.append(body)
        return raw, body

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        raw, body = await self._read(request)
        model = body.get("model", "scripted")
        decision = decide(chat_conversation(body))
        if body.get("stream"):
            usage = bool((body.get("stream_options") or {}).get("include_usage"))
            return await self._stream(request, chat_events(raw, model, decision, usage))
        return self._json(body, lambda: chat_reply(raw, model, decision))

    async def _anthropic(self, request: web.Request) -> web.StreamResponse:
        raw, body = await self._read(request)
        model = body.get("model", "scripted")
        decision = decide(anthropic_conversation(body))
        if body.get("stream"):
            return await self._stream(request, anthropic_events(raw, model, decision))
        return self._json(body, lambda: anthropic_reply(raw, model, decision))

    async def _responses(self, request: web.Request) -> web.StreamResponse:
        raw, body = await self._read(request)
        items = body.get("input")
        items = [{"type": "message", "role": "user", "content": items}] if isinstance(items, str) else items or []
        items = [*self._stored.get(body.get("previous_response_id") or "", []), *items]
        whole = responses_reply(raw, body, decide(responses_conversation(items, body.get("tools") or [])))
        self._stored[whole["id"]] = [*items, *whole["output"]]
        if body.get("stream"):
            return await self._stream(request, responses_events(whole))
        return self._json(body, lambda: whole)

    @staticmethod
    def _json(body: dict[str, Any], reply: Callable[[], dict[str, Any]]) -> web.Response:
        if body.get("model") == "unexpected-shape":
            return web.json_response({"result": "not this API's shape"})
        return web.json_response(reply(), headers={"x-request-id": "req_scripted"})

    async def _stream(self, request: web.Request, events: list[bytes]) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        try:
            for event in events:
                await response.write(event)
                if self.event_delay_s:
                    await asyncio.sleep(self.event_delay_s)
            await response.write_eof()
        except ConnectionError:
            pass  # the client (or a proxy cutting the stream) went away
        return response


async def start(host: str = "127.0.0.1", port: int = 0, *,
                event_delay_s: float = 0.0) -> tuple[web.AppRunner, int, ScriptedModel]:
    """Start the server; returns its runner (call `cleanup()` to stop), the bound port and the model."""
    model = ScriptedModel(event_delay_s)
    runner, bound = await serve(model.app, host, port)
    return runner, bound, model


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, default=9100)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--event-delay-ms", type=float, default=0.0, help="pause between streamed events")
    args = parser.parse_args()
    web.run_app(ScriptedModel(args.event_delay_ms / 1000).app, host=args.host, port=args.port, access_log=None)
