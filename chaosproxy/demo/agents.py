"""The scripted agents of `chaosproxy demo`, one per act: plain HTTP, no SDK (the core install has none).

Each does what a simple real agent does (retries, a timeout, reading the tool list it is shown, a tool
loop against a model) and returns how its tasks went: succeeded, recovered, or failed.
"""

from __future__ import annotations

import asyncio
import collections
import json
import time
from collections.abc import Callable
from typing import Any

import aiohttp

Outcomes = collections.Counter[str]
TIMEOUT_S = 1.0
MAX_ATTEMPTS = 3


def say(text: str) -> None:
    print(text, flush=True)


# --- Act 1: a REST tool API ---------------------------------------------------------------------------

async def rest_agent(client: aiohttp.ClientSession, base: str) -> Outcomes:
    outcomes: Outcomes = collections.Counter()
    for step, query in enumerate(["weather in paris", "retry budgets", "tokyo", "mcp spec", "lima", "oslo"], 1):
        tool = "weather" if step % 2 else "search"
        outcomes[await _rest_task(client, base, step, tool, query)] += 1
    events = 0
    async with client.get(base + "/sse", params={"n": "5", "interval_ms": "20"}) as response:
        async for line in response.content:
            events += line.startswith(b"data:")
    say(f"  feed     subscribed to /sse: {events} of 5 events arrived")
    outcomes["succeeded" if events == 5 else "failed"] += 1
    return outcomes


async def _rest_task(client: aiohttp.ClientSession, base: str, step: int, tool: str, query: str) -> str:
    for attempt in range(1, MAX_ATTEMPTS + 1):
        started = time.perf_counter()
        status: int | None = None
        try:
            request = client.post(base + "/api/search", json={"query": query}) if tool == "search" else \
                client.get(base + "/api/weather", params={"city": query.split()[-1]})
            async with request as response:
                payload = await response.read()
                status = response.status
            json.loads(payload)  # a cut body does not parse
            result = f"{status}, {len(payload)} bytes"
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            result = f"{status or 'failed'}: {type(exc).__name__}"
            status = None if status == 200 else status
        say(f"  task {step} {tool:7s} attempt {attempt}: {result} in {(time.perf_counter() - started) * 1000:.0f} ms")
        if status == 200:
            return "succeeded" if attempt == 1 else "recovered"
        await asyncio.sleep(0.1 * attempt)
    return "failed"


# --- Act 2: an MCP server -----------------------------------------------------------------------------

class _Mcp:
    def __init__(self, client: aiohttp.ClientSession, url: str) -> None:
        self.client, self.url, self.session, self.ids = client, url, "", 0

    async def rpc(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        self.ids += 1
        headers = {"Accept": "application/json, text/event-stream"} | (
            {"Mcp-Session-Id": self.session} if self.session else {})
        async with self.client.post(self.url, json={"jsonrpc": "2.0", "id": self.ids, "method": method,
                                                    "params": params or {}}, headers=headers) as response:
            self.session = response.headers.get("Mcp-Session-Id", self.session)
            return await response.json()


async def mcp_agent(client: aiohttp.ClientSession, url: str) -> Outcomes:
    outcomes: Outcomes = collections.Counter()
    mcp = _Mcp(client, url)
    await mcp.rpc("initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                 "clientInfo": {"name": "demo-agent", "version": "1"}})
    tools = (await mcp.rpc("tools/list"))["result"]["tools"]
    say("  tools/list shows: " + ", ".join(tool["name"] for tool in tools))
    # the agent picks tools by what their descriptions say, and tries the next candidate on a tool error
    weather = [t["name"] for t in tools if "weather" in t.get("description", "").lower()] or ["weather"]
    add = next(t for t in tools if t.get("description", "").startswith("Add"))
    first_param = next(iter(add["inputSchema"]["properties"]))
    tasks: list[tuple[str, list[str], dict[str, Any]]] = [
        ("search for umbrellas", ["search"], {"query": "umbrella reviews"}),
        ("weather in Oslo", weather, {"city": "Oslo"}),
        ("add 2 + 3 (schema as listed)", [add["name"]], {first_param: 2, "b": 3}),
        ("add 2 + 3 (yesterday's schema)", [add["name"]], {"a": 2, "b": 3}),
    ]
    for task, candidates, arguments in tasks:
        for attempt, name in enumerate(candidates):
            reply = await mcp.rpc("tools/call", {"name": name, "arguments": arguments})
            error = reply.get("error") or {}
            result = reply.get("result") or {}
            text = f"JSON-RPC error {error.get('message')!r}" if error else result["content"][0]["text"]
            say(f"  {task}: {name}({_args(arguments)}) -> {text[:70]}")
            if not error and not result.get("isError"):
                outcomes["recovered" if attempt else "succeeded"] += 1
                break
        else:
            outcomes["failed"] += 1
    return outcomes


def _args(arguments: dict[str, Any]) -> str:
    return ", ".join(f"{key}={value!r}" for key, value in arguments.items())


# --- Act 3: the agent's model API (Anthropic Messages, streamed) ----------------------------------------

LOCAL_TOOLS: dict[str, Callable[..., str]] = {
    "get_weather": lambda city: f"{city}: 3 C, rain from 18:00",
    "search_docs": lambda query: f"{query}: pack a light rain jacket",
}
TOOL_SPECS = [
    {"name": "get_weather", "description": "Get the current weather for a city.",
     "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}},
    {"name": "search_docs", "description": "Search the travel guide.",
     "input_schema": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}},
]
PROMPT = ("I am going out in Oslo tonight. Should I bring an umbrella? Check the weather "
          "`call get_weather(city=Oslo)` and the guide `call search_docs(query=rain gear)`.")


async def model_agent(client: aiohttp.ClientSession, base: str) -> Outcomes:
    """A tool loop over the Messages API with local function tools, as an agent framework runs one."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": PROMPT}]
    troubled = False
    for turn in range(5):
        reply = await _ask(client, base, messages)
        if reply is None:
            return collections.Counter(failed=1)
        text, calls, retried = reply
        troubled |= retried
        if not calls:
            say(f"  turn {turn}: the model answers: {text[:90]}")
            return collections.Counter(["recovered" if troubled else "succeeded"])
        results = []
        for call_id, name, raw in calls:
            try:
                output, failed = LOCAL_TOOLS[name](**json.loads(raw)), False
            except (json.JSONDecodeError, TypeError, KeyError) as exc:
                output, failed = f"cannot run {name}: {type(exc).__name__} on arguments {raw!r}", True
            troubled |= failed
            say(f"  turn {turn}: the model calls {name}({raw}) -> {output}")
            results.append({"type": "tool_result", "tool_use_id": call_id, "content": output, "is_error": failed})
        messages += [{"role": "assistant", "content": [{"type": "tool_use", "id": call_id, "name": name,
                                                         "input": _input(raw)} for call_id, name, raw in calls]},
                     {"role": "user", "content": results}]
    return collections.Counter(failed=1)


def _input(raw: str) -> Any:
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return {}


async def _ask(client: aiohttp.ClientSession, base: str,
               messages: list[dict[str, Any]]) -> tuple[str, list[tuple[str, str, str]], bool] | None:
    """One streamed model call, retried on 429/5xx/529 after retry-after: the text, the tool calls, and
    whether it took a retry."""
    body = {"model": "claude-demo", "max_tokens": 512, "stream": True, "messages": messages, "tools": TOOL_SPECS}
    for attempt in range(1, MAX_ATTEMPTS + 1):
        async with client.post(base + "/v1/messages", json=body,
                               headers={"x-api-key": "demo", "anthropic-version": "2023-06-01"}) as response:
            if response.status != 200:
                wait = float(response.headers.get("retry-after-ms", "1000")) / 1000
                kind = (await response.json()).get("error", {}).get("type")
                say(f"  model call attempt {attempt}: {response.status} {kind}, retrying in {wait:g} s")
                await asyncio.sleep(wait)
                continue
            text, calls, current = "", [], None
            async for line in response.content:
                if not line.startswith(b"data: "):
                    continue
                event = json.loads(line[6:])
                match event.get("type"), event.get("content_block") or event.get("delta") or {}:
                    case "content_block_start", {"type": "tool_use", "id": call_id, "name": name}:
                        current = [call_id, name, ""]
                        calls.append(current)
                    case "content_block_delta", {"type": "input_json_delta", "partial_json": piece}:
                        assert current is not None
                        current[2] += piece
                    case "content_block_delta", {"type": "text_delta", "text": piece}:
                        text += piece
            return text, [tuple(call) for call in calls], attempt > 1
    return None
