"""A fault's log line says what it did this time (issue 25 item 10): the names it mapped, which
argument changed and how, how many characters changed and where; bounded in size whatever it met.

A real SDK client meets the faults through a real proxy; the effects are read back from the log."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from tests.helpers.framing_support import read_request
from tests.helpers.mcp_support import client

MODEL_API_FAULTS = {"llm_error", "llm_stream_error", "empty_completion", "malformed_tool_call", "prompt_typos",
                    "context_length", "prompt_paraphrase", "hallucinated_tool_call"}  # (another change's)
MAX_EFFECT_BYTES = 2048


def effects(proxy: Any) -> dict[str, list[dict[str, Any]]]:
    found: dict[str, list[dict[str, Any]]] = {}
    for line in proxy.events("fault"):
        found.setdefault(line["rule"], []).append(line["effect"])
    return found


async def test_tool_list_and_call_faults_say_what_they_did(make_proxy: Any, mcp_http: str) -> None:
    proxy = make_proxy({"rules": [
        {"name": "renamed", "fault": {"type": "rename_tool", "tool": "weather", "to": "forecast"}},
        {"name": "twice", "fault": {"type": "duplicate_tool", "tool": "search", "variant": "wrong_description"}},
        {"name": "drift", "fault": {"type": "input_schema_drift", "tool": "add", "parameter": "a"}},
        {"name": "slips", "match": {"tool": "search"}, "fault": {"type": "typos", "rate": 0.2}},
    ]}, to=mcp_http, seed=3)
    async with client(proxy.url + "/mcp") as session:
        await session.list_tools()
        await session.call_tool("forecast", {"city": "Oslo"})
        assert (await session.call_tool("add", {"a_v2": 2, "b": 3})).structured_content == {"result": 5}
        await session.call_tool("search", {"query": "umbrella reviews from people who walk in the rain"})
    found = effects(proxy)
    renamed, routed = found["renamed"]  # the listing, then the call routed back
    assert renamed == {"renamed": {"weather": "forecast"}}
    assert routed == {"tool": {"called": "forecast", "sent_as": "weather"}}
    [twice] = found["twice"]
    assert twice == {"added": {"search": "a copy, other description"}}
    listing, call = found["drift"]
    assert listing == {"changed": {"add.inputSchema.properties.a": "removed", "add.inputSchema.properties.a_v2":
                                   "added", "add.inputSchema.required[0]": {"chars": 3, "at": [1], "length": [1, 4]}}}
    assert call == {"arguments": {"renamed": {"a_v2": "a"}}}
    [slips] = found["slips"]
    changed = slips["changed"]["result.content[0].text"]
    assert changed["chars"] >= 1 and changed["at"] and changed["length"][0] > 0


async def test_a_rest_body_perturbed_says_how_many_characters_changed_and_where(make_proxy: Any) -> None:
    proxy = make_proxy({"rules": [{"name": "slips", "match": {"path": "/api/search"},
                                   "fault": {"type": "typos", "rate": 0.5}}]})
    async with aiohttp.ClientSession() as http, http.post(proxy.url + "/api/search",
                                                          json={"query": "chaos engineering"}) as reply:
        await reply.read()
    [line] = proxy.events("fault")
    body = line["effect"]["changed"]["body"]
    assert body["chars"] >= 1 and len(body["at"]) <= 8 and body["length"][0] > 0


async def test_an_effect_stays_small_whatever_the_fault_met(make_proxy: Any, scripted: Any) -> None:
    """A thousand tools renamed, and a megabyte of text misspelt: the effect lists a few, counts the rest."""
    tools = [{"name": f"tool_{n}", "inputSchema": {"type": "object"}} for n in range(1000)]
    text = "the printer on floor three jams on every second page " * 20_000
    results = {"tools/list": {"tools": tools}, "tools/call": {"content": [{"type": "text", "text": text}]}}

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            _, body = await read_request(reader)
            rpc = orjson.loads(body)
            reply = orjson.dumps({"jsonrpc": "2.0", "id": rpc["id"], "result": results[rpc["method"]]})
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                         % len(reply) + reply)
            await writer.drain()

    upstream = scripted(answer)
    proxy = make_proxy({"rules": [
        {"name": "prefixed", "fault": {"type": "rename_tool", "style": "prefix", "prefix": "v2_"}},
        {"name": "slips", "match": {"method": "tools/call"}, "fault": {"type": "typos", "rate": 0.05}},
    ]}, to=upstream.url)
    async with aiohttp.ClientSession() as http:
        for rpc_id, method in ((1, "tools/list"), (2, "tools/call")):
            params = {"name": "tool_1", "arguments": {}} if method == "tools/call" else {}
            async with http.post(proxy.url + "/mcp", json={"jsonrpc": "2.0", "id": rpc_id, "method": method,
                                                           "params": params}) as reply:
                await reply.read()
    prefixed, slips = (line["effect"] for line in proxy.events("fault"))
    assert len(prefixed["renamed"]) == 9 and prefixed["renamed"]["more"] == 992
    slipped = slips["changed"]["result.content[0].text"]
    assert slipped["chars"] > 1000 and slipped["upper_bound"] is True and len(slipped["at"]) == 8
    for effect in (prefixed, slips):
        assert len(json.dumps(effect)) < MAX_EFFECT_BYTES


@pytest.mark.slow
def test_every_fault_the_demo_fires_says_what_it_did(tmp_path: Path) -> None:
    """The demo meets a fault of every kind: none but the model API's own says nothing of what it did."""
    done = subprocess.run([sys.executable, "-m", "chaosproxy", "demo"], capture_output=True, text=True,
                          timeout=180, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    log = next(line.split()[2] for line in done.stdout.splitlines() if line.startswith("perturbation log:"))
    lines = [json.loads(line) for line in Path(log).read_text().splitlines() if '"event":"fault"' in line]
    silent = [(line["rule"], line["fault"]) for line in lines
              if not line["effect"] and line["fault"] not in MODEL_API_FAULTS]
    assert silent == []
    assert all(len(json.dumps(line["effect"])) < MAX_EFFECT_BYTES for line in lines)
