"""A recorded corpus of model-API replies as providers send them, and an upstream that plays them back.

Each entry is the exact bytes a provider answers one request with: OpenAI Chat Completions streams with
parallel tool calls, `usage: null` on every chunk and a usage-only last chunk, `obfuscation` padding,
keep-alive comments and CRLF framing; Azure OpenAI's empty first chunk with `prompt_filter_results` and
per-choice `content_filter_results`; Gemini's OpenAI-compatible chunks (a whole tool call in one piece,
`extra_content.google.thought_signature`, which Gemini needs back on the next turn); DeepSeek's
`reasoning_content`; refusals; Anthropic streams with `ping`, thinking and its signature, and parallel
`tool_use` blocks (and a gateway's, with each input whole in its block's start); Responses streams with
reasoning summaries, parallel function calls and refusals;
non-streamed bodies pretty-printed as OpenAI's are, or compact as others'. Unknown fields are kept
everywhere: the proxy must relay what it does not know.

The upstream (`corpus_upstream`) picks the entry named by the request's `x-corpus` header, and writes a
stream event by event (or in `x-corpus-split`-byte pieces), so a test can compare what the agent got
with `Entry.body`, byte for byte. Every request it gets is kept in `CorpusUpstream.requests`.
"""

from __future__ import annotations

import asyncio
import gzip
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web

from chaosproxy.demo.serving import serve
from tests.helpers.llm_support import ANTHROPIC_TOOLS, CHAT_TOOLS, RESPONSES_TOOLS
from tests.helpers.support import ServerLoop

CREATED = 1_767_225_600
WEATHER_ARGS = '{"city":"Paris","unit":"celsius"}'
SEARCH_ARGS = '{"query":"museum opening hours","limit":3}'
PROMPT = "What's the weather in Paris, and when do the museums open?"
SIGNATURE = "CiQB0e2Kb3Zx9mQ1yT0cXo4v3m2Gp6lZ5k8uJ7wHn1sRt2E="  # an opaque thought signature


@dataclass(frozen=True)
class Entry:
    """One recorded reply: which API and path it answers, whether it streams, and its exact bytes."""

    name: str
    api: str
    stream: bool
    events: tuple[bytes, ...]  # a stream's events as written (one write each), or the one body
    headers: tuple[tuple[str, str], ...] = ()
    tools: tuple[str, ...] = ()  # the tool calls it makes, in order
    has_reasoning: bool = False

    @property
    def body(self) -> bytes:
        return b"".join(self.events)

    @property
    def path(self) -> str:
        return {"openai-chat": "/v1/chat/completions", "anthropic": "/v1/messages",
                "openai-responses": "/v1/responses"}[self.api]


def _json(data: Any) -> str:
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False)


def sse(data: Any, event: str | None = None, newline: str = "\n") -> bytes:
    head = f"event: {event}{newline}" if event else ""
    text = data if isinstance(data, str) else _json(data)
    return f"{head}data: {text}{newline}{newline}".encode()


def pieces(text: str, size: int) -> list[str]:
    return [text[i:i + size] for i in range(0, len(text), size)]


# --- OpenAI Chat Completions ----------------------------------------------------------------------------

def _chat_chunks(envelope: dict[str, Any], deltas: list[tuple[dict[str, Any], str | None]], *,
                 usage: dict[str, Any] | None, choice_extra: dict[str, Any] | None = None,
                 chunk_extra: dict[str, Any] | None = None, newline: str = "\n",
                 comments: dict[int, bytes] | None = None) -> tuple[bytes, ...]:
    out: list[bytes] = []
    for i, (delta, finish) in enumerate(deltas):
        if comments and i in comments:
            out.append(comments[i])
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish, **(choice_extra or {})}
        out.append(sse({**envelope, "choices": [choice], **({"usage": None} if usage else {}),
                        **(chunk_extra or {})}, newline=newline))
    if usage:
        out.append(sse({**envelope, "choices": [], "usage": usage, **(chunk_extra or {})}, newline=newline))
    out.append(f"data: [DONE]{newline}{newline}".encode())
    return tuple(out)


def _call_deltas(calls: list[tuple[str, str, str]], size: int = 7) -> list[tuple[dict[str, Any], str | None]]:
    """OpenAI's way: a call's id, type and name first (arguments ""), then its arguments in pieces."""
    out: list[tuple[dict[str, Any], str | None]] = []
    for index, (call_id, name, arguments) in enumerate(calls):
        out.append(({"tool_calls": [{"index": index, "id": call_id, "type": "function",
                                     "function": {"name": name, "arguments": ""}}]}, None))
        out += [({"tool_calls": [{"index": index, "function": {"arguments": piece}}]}, None)
                for piece in pieces(arguments, size)]
    return out


OPENAI_USAGE = {"prompt_tokens": 182, "completion_tokens": 46, "total_tokens": 228,
                "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
                "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0,
                                              "accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0}}
OPENAI_ENVELOPE = {"id": "chatcmpl-CkX1parallel", "object": "chat.completion.chunk", "created": CREATED,
                   "model": "gpt-4o-2024-08-06", "service_tier": "default", "system_fingerprint": "fp_07871e2ad8"}
PARALLEL = [("call_Wx1aB", "get_weather", WEATHER_ARGS), ("call_Qz2cD", "search_docs", SEARCH_ARGS)]


def chat_parallel_tools() -> Entry:
    deltas = [({"role": "assistant", "content": None, "refusal": None}, None), *_call_deltas(PARALLEL),
              ({}, "tool_calls")]
    events = _chat_chunks(OPENAI_ENVELOPE, deltas, usage=OPENAI_USAGE, chunk_extra={"obfuscation": "q3Xz"})
    return Entry("chat_parallel_tools", "openai-chat", True, events, tools=("get_weather", "search_docs"))


def chat_text_keepalive_crlf() -> Entry:
    """A text answer framed with CRLF, with the keep-alive comments some gateways interleave."""
    text = "It is 14 degrees and sunny in Paris right now, with a light westerly wind."
    deltas = [({"role": "assistant", "content": ""}, None), *[({"content": piece}, None) for piece in pieces(text, 9)],
              ({}, "stop")]
    comments = {0: b": OPENROUTER PROCESSING\r\n\r\n", 3: b": keep-alive\r\n\r\n"}
    events = _chat_chunks({**OPENAI_ENVELOPE, "id": "chatcmpl-CkX2text"}, deltas, usage=None, newline="\r\n",
                          comments=comments)
    return Entry("chat_text_keepalive_crlf", "openai-chat", True, events)


def chat_refusal() -> Entry:
    refusal = "I'm sorry, but I can't help with that request."
    deltas: list[tuple[dict[str, Any], str | None]] = [({"role": "assistant", "content": None, "refusal": ""}, None),
              *[({"refusal": piece}, None) for piece in pieces(refusal, 12)], ({}, "stop")]
    events = _chat_chunks({**OPENAI_ENVELOPE, "id": "chatcmpl-CkX3refusal"}, deltas, usage=OPENAI_USAGE)
    return Entry("chat_refusal", "openai-chat", True, events)


def chat_azure() -> Entry:
    """Azure OpenAI: an empty first chunk carrying the prompt's filter results, filter results per choice."""
    filters = {"hate": {"filtered": False, "severity": "safe"}, "self_harm": {"filtered": False, "severity": "safe"},
               "sexual": {"filtered": False, "severity": "safe"}, "violence": {"filtered": False, "severity": "safe"}}
    first = sse({"choices": [], "created": 0, "id": "", "model": "", "object": "",
                 "prompt_filter_results": [{"prompt_index": 0, "content_filter_results": filters}]})
    envelope = {"created": CREATED, "id": "chatcmpl-AzR4azure", "model": "gpt-4o-2024-11-20",
                "object": "chat.completion.chunk", "system_fingerprint": "fp_ee1d74bde0"}
    deltas = [({"role": "assistant", "content": None, "refusal": None}, None),
              *_call_deltas([PARALLEL[0]], 11), ({}, "tool_calls")]
    rest = _chat_chunks(envelope, deltas, usage=None, choice_extra={"content_filter_results": {}})
    return Entry("chat_azure", "openai-chat", True, (first, *rest), tools=("get_weather",))


def chat_gemini() -> Entry:
    """Gemini's OpenAI-compatible stream: the whole call in one piece, with its thought signature."""
    envelope = {"id": "x7YvadCdKZ6X1dkP0f3-gQ4", "object": "chat.completion.chunk", "created": CREATED,
                "model": "gemini-2.5-flash"}
    call = {"extra_content": {"google": {"thought_signature": SIGNATURE}},
            "function": {"arguments": WEATHER_ARGS, "name": "get_weather"}, "id": "function-call-5317", "index": 0,
            "type": "function"}
    usage = {"completion_tokens": 18, "prompt_tokens": 97, "total_tokens": 190,
             "completion_tokens_details": {"reasoning_tokens": 75}}
    events = (sse({**envelope, "choices": [{"delta": {"role": "assistant", "tool_calls": [call]},
                                            "finish_reason": "tool_calls", "index": 0}], "usage": usage}),
              b"data: [DONE]\n\n")
    return Entry("chat_gemini", "openai-chat", True, events, tools=("get_weather",), has_reasoning=True)


def chat_deepseek_reasoning() -> Entry:
    envelope = {"id": "9b1e7d41-ds", "object": "chat.completion.chunk", "created": CREATED,
                "model": "deepseek-reasoner", "system_fingerprint": "fp_5417b77867_prod0820_fp8_kvcache"}
    thought = "The user asks for the weather; I should call the tool with the city."
    deltas = [({"role": "assistant", "content": None, "reasoning_content": ""}, None),
              *[({"content": None, "reasoning_content": piece}, None) for piece in pieces(thought, 16)],
              *_call_deltas([("call_00_ds1", "get_weather", WEATHER_ARGS)], 10), ({"content": None}, "tool_calls")]
    events = _chat_chunks(envelope, deltas, usage={"prompt_tokens": 120, "completion_tokens": 61,
                                                   "total_tokens": 181, "prompt_cache_hit_tokens": 0,
                                                   "prompt_cache_miss_tokens": 120})
    return Entry("chat_deepseek_reasoning", "openai-chat", True, events, tools=("get_weather",), has_reasoning=True)


def chat_whole_parallel() -> Entry:
    body = {"id": "chatcmpl-CkX9whole", "object": "chat.completion", "created": CREATED,
            "model": "gpt-4o-2024-08-06",
            "choices": [{"index": 0, "message": {
                "role": "assistant", "content": None, "refusal": None, "annotations": [],
                "tool_calls": [{"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
                               for call_id, name, arguments in PARALLEL]},
                "logprobs": None, "finish_reason": "tool_calls"}],
            "usage": OPENAI_USAGE, "service_tier": "default", "system_fingerprint": "fp_07871e2ad8"}
    text = json.dumps(body, indent=2, ensure_ascii=False) + "\n"  # OpenAI pretty-prints whole replies
    return Entry("chat_whole_parallel", "openai-chat", False, (text.encode(),),
                 tools=("get_weather", "search_docs"))


def chat_whole_gemini() -> Entry:
    body = {"choices": [{"finish_reason": "tool_calls", "index": 0, "message": {
        "role": "assistant", "tool_calls": [{"extra_content": {"google": {"thought_signature": SIGNATURE}},
                                             "function": {"arguments": WEATHER_ARGS, "name": "get_weather"},
                                             "id": "function-call-5318", "type": "function"}]}}],
        "created": CREATED, "id": "y8ZwbeDeLa7Y2ekQ1g4-hR5", "model": "gemini-2.5-flash",
        "object": "chat.completion", "usage": {"completion_tokens": 18, "prompt_tokens": 97, "total_tokens": 190}}
    return Entry("chat_whole_gemini", "openai-chat", False, (_json(body).encode(),), tools=("get_weather",))


# --- Anthropic Messages ---------------------------------------------------------------------------------

ANTHROPIC_USAGE = {"input_tokens": 472, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0,
                   "cache_creation": {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": 0},
                   "output_tokens": 2, "service_tier": "standard"}
THINKING = "The user wants the weather in Paris and museum hours. I will call both tools."
ANTHROPIC_SIGNATURE = "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds7pM"


def _anthropic_stream(message_id: str, blocks: list[dict[str, Any]], stop: str, *,
                      whole_input: bool = False) -> tuple[bytes, ...]:
    start: dict[str, Any] = {"id": message_id, "type": "message", "role": "assistant",
                             "model": "claude-sonnet-4-5-20250929",
             "content": [], "stop_reason": None, "stop_sequence": None, "usage": ANTHROPIC_USAGE}
    out = [sse({"type": "message_start", "message": start}, "message_start")]
    for index, block in enumerate(blocks):
        if block["type"] == "thinking":
            opened: dict[str, Any] = {"type": "thinking", "thinking": "", "signature": ""}
            deltas = [{"type": "thinking_delta", "thinking": piece} for piece in pieces(block["thinking"], 20)]
            deltas.append({"type": "signature_delta", "signature": block["signature"]})
        elif block["type"] == "text":
            opened = {"type": "text", "text": ""}
            deltas = [{"type": "text_delta", "text": piece} for piece in pieces(block["text"], 10)]
        elif whole_input:
            opened, deltas = block, []
        else:
            opened = {**block, "input": {}}
            deltas = [{"type": "input_json_delta", "partial_json": piece}
                      for piece in ["", *pieces(json.dumps(block["input"]), 8)]]
        out.append(sse({"type": "content_block_start", "index": index, "content_block": opened},
                       "content_block_start"))
        if index == 0:
            out.append(sse('{"type": "ping"}', "ping"))  # as Anthropic writes it, with a space
        out += [sse({"type": "content_block_delta", "index": index, "delta": delta}, "content_block_delta")
                for delta in deltas]
        out.append(sse({"type": "content_block_stop", "index": index}, "content_block_stop"))
    out.append(sse({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None},
                    "usage": {"output_tokens": 89}}, "message_delta"))
    out.append(sse({"type": "message_stop"}, "message_stop"))
    return tuple(out)


ANTHROPIC_BLOCKS: list[dict[str, Any]] = [
    {"type": "thinking", "thinking": THINKING, "signature": ANTHROPIC_SIGNATURE},
    {"type": "text", "text": "Let me check both for you."},
    {"type": "tool_use", "id": "toolu_01A09q90qw90lq917835lq9", "name": "get_weather",
     "input": {"city": "Paris", "unit": "celsius"}},
    {"type": "tool_use", "id": "toolu_01B18r81rx81mr828946mr8", "name": "search_docs",
     "input": {"query": "museum opening hours", "limit": 3}},
]


def anthropic_thinking_tools() -> Entry:
    events = _anthropic_stream("msg_01XFDUDYJgAACzvnptvVoYEL", ANTHROPIC_BLOCKS, "tool_use")
    return Entry("anthropic_thinking_tools", "anthropic", True, events, tools=("get_weather", "search_docs"),
                 has_reasoning=True)


def anthropic_text() -> Entry:
    blocks = [{"type": "text", "text": "Paris is 14 degrees and sunny; the Louvre opens at 9:00."}]
    events = _anthropic_stream("msg_01Yr2tEXTonly8BfkLmA", blocks, "end_turn")
    return Entry("anthropic_text", "anthropic", True, events)


def anthropic_input_whole() -> Entry:
    """A gateway in front of a Messages-compatible model that sends each tool's input whole in its
    content_block_start, with no input_json_delta."""
    events = _anthropic_stream("msg_01Gw4yWHOLEinput9xQ", ANTHROPIC_BLOCKS[2:], "tool_use", whole_input=True)
    return Entry("anthropic_input_whole", "anthropic", True, events, tools=("get_weather", "search_docs"))


def anthropic_whole_thinking_tools() -> Entry:
    body = {"id": "msg_01XFDUDYJgAACzvnptvVoYEM", "type": "message", "role": "assistant",
            "model": "claude-sonnet-4-5-20250929", "content": ANTHROPIC_BLOCKS, "stop_reason": "tool_use",
            "stop_sequence": None, "usage": {**ANTHROPIC_USAGE, "output_tokens": 89}}
    return Entry("anthropic_whole_thinking_tools", "anthropic", False, (_json(body).encode(),),
                 tools=("get_weather", "search_docs"), has_reasoning=True)


# --- OpenAI Responses -----------------------------------------------------------------------------------

RESPONSES_USAGE = {"input_tokens": 321, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 148,
                   "output_tokens_details": {"reasoning_tokens": 64}, "total_tokens": 469}


def _response(response_id: str, status: str, output: list[dict[str, Any]],
              usage: dict[str, Any] | None) -> dict[str, Any]:
    return {"id": response_id, "object": "response", "created_at": CREATED, "status": status,
            "background": False, "error": None, "incomplete_details": None, "instructions": None,
            "max_output_tokens": None, "model": "o4-mini-2025-04-16", "output": output,
            "parallel_tool_calls": True, "previous_response_id": None,
            "reasoning": {"effort": "medium", "summary": "detailed"}, "store": True, "temperature": 1.0,
            "text": {"format": {"type": "text"}, "verbosity": "medium"}, "tool_choice": "auto", "tools": [],
            "top_p": 1.0, "truncation": "disabled", "usage": usage, "user": None, "metadata": {}}


def _responses_stream(response_id: str, output: list[dict[str, Any]]) -> tuple[bytes, ...]:
    events: list[tuple[str, dict[str, Any]]] = []
    pending = _response(response_id, "in_progress", [], None)
    events += [("response.created", {"response": pending}), ("response.in_progress", {"response": pending})]
    for index, item in enumerate(output):
        where = {"output_index": index}
        ids = {"item_id": item["id"], **where}
        if item["type"] == "reasoning":
            events.append(("response.output_item.added", {**where, "item": {"id": item["id"], "type": "reasoning",
                                                                            "summary": []}}))
            for n, part in enumerate(item["summary"]):
                at = {**ids, "summary_index": n}
                events.append(("response.reasoning_summary_part.added",
                               {**at, "part": {"type": "summary_text", "text": ""}}))
                events += [("response.reasoning_summary_text.delta", {**at, "delta": piece, "obfuscation": "kq"})
                           for piece in pieces(part["text"], 14)]
                events += [("response.reasoning_summary_text.done", {**at, "text": part["text"]}),
                           ("response.reasoning_summary_part.done", {**at, "part": part})]
        elif item["type"] == "function_call":
            events.append(("response.output_item.added", {**where, "item": {**item, "status": "in_progress",
                                                                            "arguments": ""}}))
            events += [("response.function_call_arguments.delta", {**ids, "delta": piece, "obfuscation": "Zp"})
                       for piece in pieces(item["arguments"], 9)]
            events.append(("response.function_call_arguments.done", {**ids, "arguments": item["arguments"]}))
        else:
            events.append(("response.output_item.added", {**where, "item": {**item, "status": "in_progress",
                                                                            "content": []}}))
            for n, part in enumerate(item["content"]):
                at = {**ids, "content_index": n}
                kind = part["type"]
                key = "refusal" if kind == "refusal" else "text"
                empty = {**part, key: ""} if kind == "refusal" else {**part, "text": "", "annotations": []}
                events.append(("response.content_part.added", {**at, "part": empty}))
                name = "response.refusal" if kind == "refusal" else "response.output_text"
                extra: dict[str, Any] = {} if kind == "refusal" else {"logprobs": []}
                events += [(f"{name}.delta", {**at, "delta": piece, **extra}) for piece in pieces(part[key], 11)]
                events += [(f"{name}.done", {**at, key: part[key], **extra}),
                           ("response.content_part.done", {**at, "part": part})]
        events.append(("response.output_item.done", {**where, "item": item}))
    events.append(("response.completed", {"response": _response(response_id, "completed", output,
                                                                RESPONSES_USAGE)}))
    return tuple(sse({"type": name, "sequence_number": n, **data}, name) for n, (name, data) in enumerate(events))


REASONING = {"id": "rs_68af3b7e2c0481a3", "type": "reasoning", "encrypted_content": "gAAAAABor7xQ-opaque==",
             "summary": [{"type": "summary_text", "text": "**Checking the weather**\n\nI will ask both tools."}]}
RESPONSES_CALLS = [{"id": "fc_68af3b81a1c481a3", "type": "function_call", "status": "completed",
                    "arguments": WEATHER_ARGS, "call_id": "call_Wx1aB9Kq", "name": "get_weather"},
                   {"id": "fc_68af3b81a2d481a3", "type": "function_call", "status": "completed",
                    "arguments": SEARCH_ARGS, "call_id": "call_Qz2cD7Lm", "name": "search_docs"}]


def responses_reasoning_tools() -> Entry:
    events = _responses_stream("resp_68af3b7d9f7c81a3", [REASONING, *RESPONSES_CALLS])
    return Entry("responses_reasoning_tools", "openai-responses", True, events,
                 tools=("get_weather", "search_docs"), has_reasoning=True)


def responses_refusal() -> Entry:
    message = {"id": "msg_68af3c0102a481a3", "type": "message", "status": "completed", "role": "assistant",
               "content": [{"type": "refusal", "refusal": "I'm sorry, but I can't help with that."}]}
    return Entry("responses_refusal", "openai-responses", True, _responses_stream("resp_68af3c00ff0c81a3", [message]))


def responses_text() -> Entry:
    message = {"id": "msg_68af3d0102a481a3", "type": "message", "status": "completed", "role": "assistant",
               "content": [{"type": "output_text", "annotations": [], "logprobs": [],
                            "text": "Paris: 14 degrees and sunny. The Louvre opens at 9:00 today."}]}
    events = _responses_stream("resp_68af3d00ff0c81a3", [REASONING, message])
    return Entry("responses_text", "openai-responses", True, events, has_reasoning=True)


def responses_whole_reasoning_tools() -> Entry:
    body = _response("resp_68af3e00ff0c81a3", "completed", [REASONING, *RESPONSES_CALLS], RESPONSES_USAGE)
    text = json.dumps(body, indent=2, ensure_ascii=False)
    return Entry("responses_whole_reasoning_tools", "openai-responses", False, (text.encode(),),
                 tools=("get_weather", "search_docs"), has_reasoning=True)


CORPUS: dict[str, Entry] = {entry.name: entry for entry in (
    chat_parallel_tools(), chat_text_keepalive_crlf(), chat_refusal(), chat_azure(), chat_gemini(),
    chat_deepseek_reasoning(), chat_whole_parallel(), chat_whole_gemini(),
    anthropic_thinking_tools(), anthropic_text(), anthropic_input_whole(), anthropic_whole_thinking_tools(),
    responses_reasoning_tools(), responses_refusal(), responses_text(), responses_whole_reasoning_tools())}


# --- the upstream ---------------------------------------------------------------------------------------

def request_for(entry: Entry, *, model: str | None = None) -> dict[str, Any]:
    """A request the entry could be the answer to: the user's question and the two tools, in its API's shape."""
    stream = {"stream": True} if entry.stream else {}
    match entry.api:
        case "openai-chat":
            return {"model": model or "gpt-4o", "messages": [{"role": "user", "content": PROMPT}],
                    "tools": CHAT_TOOLS, **stream, **({"stream_options": {"include_usage": True}} if stream else {})}
        case "anthropic":
            return {"model": model or "claude-sonnet-4-5", "max_tokens": 1024,
                    "messages": [{"role": "user", "content": PROMPT}], "tools": ANTHROPIC_TOOLS, **stream}
    return {"model": model or "o4-mini", "input": PROMPT, "tools": RESPONSES_TOOLS, **stream}


@dataclass
class CorpusUpstream:
    url: str
    requests: list[dict[str, Any]] = field(default_factory=list)


def _app(seen: list[dict[str, Any]]) -> web.Application:
    async def answer(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        seen.append(body)
        entry = CORPUS[request.headers["x-corpus"]]
        if not entry.stream:
            if request.headers.get("x-corpus-gzip"):  # gzipped and chunked, whatever Accept-Encoding said
                response = web.StreamResponse(headers={"Content-Type": "application/json",
                                                       "Content-Encoding": "gzip", **dict(entry.headers)})
                await response.prepare(request)
                packed = gzip.compress(entry.body)
                for piece in (packed[:len(packed) // 2], packed[len(packed) // 2:]):
                    await response.write(piece)
                await response.write_eof()
                return response
            return web.Response(body=entry.body, headers={"Content-Type": "application/json", **dict(entry.headers)})
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8",
                                               "Cache-Control": "no-cache", **dict(entry.headers)})
        await response.prepare(request)
        split = int(request.headers.get("x-corpus-split", "0"))
        writes = list(entry.events) if not split else [entry.body[i:i + split]
                                                        for i in range(0, len(entry.body), split)]
        delay = float(request.headers.get("x-corpus-delay-s", "0"))
        for piece in writes:
            await response.write(piece)
            if delay:
                await asyncio.sleep(delay)
        await response.write_eof()
        return response

    app = web.Application()
    for path in ("/v1/chat/completions", "/v1/messages", "/v1/responses"):
        app.router.add_post(path, answer)
    return app


@pytest.fixture(scope="session")
def corpus_upstream(server_loop: ServerLoop) -> Iterator[CorpusUpstream]:
    seen: list[dict[str, Any]] = []
    runner, port = server_loop.run(serve(_app(seen)))
    yield CorpusUpstream(f"http://127.0.0.1:{port}", seen)
    server_loop.run(runner.cleanup())
