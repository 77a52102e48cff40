"""Every fault that fires is attached to exactly one call in the report, whatever the transport.

A real agent (the SDK client) meets faults on requests, on responses, on tool listings and on
routed calls, through `chaosproxy run` (streamable HTTP and legacy SSE), `chaosproxy stdio` and
`chaosproxy mitm`; then `chaosproxy report --json` must count exactly the log's fault lines, all of
them joined to a call.
"""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import httpx2
import pytest
import yaml
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from chaosproxy.adapters.mitm import HostPatterns, MitmProxy, ca_directory
from chaosproxy.engine.core import Engine
from chaosproxy.engine.scenario import parse_scenario
from chaosproxy.records.logfile import read_events, read_sessions
from chaosproxy.telemetry.log import PerturbationLog
from tests.helpers.mcp_support import SERVER, client

SCENARIO: dict[str, Any] = {"rules": [
    {"name": "rename", "fault": {"type": "rename_tool", "tool": "weather", "to": "forecast"}},
    {"name": "drift", "fault": {"type": "input_schema_drift", "tool": "forecast"}},
    {"name": "typos", "match": {"tool": "search"}, "fault": {"type": "typos", "rate": 0.3}},
    {"name": "slow", "match": {"tool": "search"}, "fault": {"type": "latency", "delay_ms": 5}},
    {"name": "dup", "fault": {"type": "duplicate_tool", "tool": "add", "route": "error"}},
    {"name": "flip", "match": {"tool": "fail"}, "fault": {"type": "flip_is_error"}},
    {"name": "inject", "match": {"tool": "weather"}, "fault": {"type": "inject_text", "template": "noise"}},
]}


async def agent(session: Any) -> None:
    """A short task: list the tools, call each kind of faulted tool (twice for one)."""
    tools = {tool.name for tool in (await session.list_tools()).tools}
    assert "forecast" in tools and "weather" not in tools
    forecast = await session.call_tool("forecast", {"city_v2": "Oslo"})
    assert forecast.structured_content["city"] == "oslo"
    for _ in range(2):
        await session.call_tool("search", {"query": "chaos", "limit": 2})
    assert (await session.call_tool("add", {"a": 1, "b": 2})).is_error  # answered by the duplicate's route
    await session.call_tool("fail", {})


REST: dict[str, Any] = {"rules": [
    {"name": "down", "match": {"path": "/api/search"}, "first": 1, "fault": {"type": "http_error", "status": 503}},
    {"name": "typos", "match": {"path": "/api/search"}, "fault": {"type": "typos", "rate": 0.3}},
    {"name": "empty", "match": {"path": "/api/weather"}, "fault": {"type": "wrong_data", "mode": "empty"}},
]}


async def rest_agent(http: aiohttp.ClientSession, base: str, **kwargs: Any) -> None:
    """A REST tool user: search (retried once after a 503), then the weather in two cities."""
    for _ in range(2):
        async with http.post(base + "/api/search", json={"query": "chaos"}, **kwargs) as response:
            await response.read()
    for city in ("oslo", "lima"):
        async with http.get(base + "/api/weather", params={"city": city}, **kwargs) as response:
            assert response.status == 200
            await response.read()


def assert_every_fault_is_attached_once(log: Path, tmp_path: Path, scenario: dict[str, Any] = SCENARIO) -> None:
    lines = [event for event in read_events(log) if event.get("event") == "fault"]
    assert {line["rule"] for line in lines} == {rule["name"] for rule in scenario["rules"]}
    sessions = read_sessions(log)
    assert [fault for session in sessions for fault in session.unattached] == []
    assert sum(len(call.faults) for session in sessions for call in session.calls) == len(lines)
    out = tmp_path / "report.json"
    subprocess.run([sys.executable, "-m", "chaosproxy", "report", str(log), "--json", str(out)], check=True,
                   timeout=60, capture_output=True)
    behaviour = json.loads(out.read_text())["behaviour"]
    assert sum(behaviour["faults_by_type"].values()) == len(lines)
    assert behaviour["unattached_faults"] == 0
    assert behaviour["disrupted_calls"] >= 1  # the duplicate's error route


@pytest.mark.slow
async def test_a_rest_tool_api(make_proxy, tmp_path):
    """Faults on plain JSON response bodies are decided per message, yet each joins its call."""
    proxy = make_proxy(REST)
    async with aiohttp.ClientSession() as http:
        await rest_agent(http, proxy.url)
    assert_every_fault_is_attached_once(proxy.log_path, tmp_path, REST)


@pytest.mark.slow
async def test_a_rest_tool_api_through_mitm(server_loop, upstream, tmp_path):
    log = tmp_path / "log.jsonl"
    with running_mitm(server_loop, REST, log, tmp_path) as proxy_url:
        async with aiohttp.ClientSession() as http:
            await rest_agent(http, upstream.replace("127.0.0.1", "localhost"), proxy=proxy_url)
    assert_every_fault_is_attached_once(log, tmp_path, REST)


@pytest.mark.slow
@pytest.mark.parametrize("path,mode", [("/mcp", "auto"), ("/mcp", "legacy"), ("/sse", "legacy")])
async def test_mcp_over_http(request, make_proxy, path, mode, tmp_path):
    server = request.getfixturevalue("mcp_sse" if path == "/sse" else "mcp_http")
    proxy = make_proxy(SCENARIO, to=server)
    async with client(proxy.url + path, mode) as session:
        await agent(session)
    assert_every_fault_is_attached_once(proxy.log_path, tmp_path)


@pytest.mark.slow
async def test_mcp_over_stdio(tmp_path):
    log, scenario = tmp_path / "log.jsonl", tmp_path / "scenario.yaml"
    scenario.write_text(yaml.safe_dump(SCENARIO))
    params = StdioServerParameters(command=sys.executable, args=[
        "-m", "chaosproxy", "stdio", "--scenario", str(scenario), "--log", str(log), "--", *SERVER, "stdio"])
    async with Client(params, mode="legacy") as session:
        await agent(session)
    assert_every_fault_is_attached_once(log, tmp_path)


@contextlib.contextmanager
def running_mitm(server_loop: Any, scenario: dict[str, Any], log: Path, tmp_path: Path) -> Iterator[str]:
    """`chaosproxy mitm` for localhost with this scenario; yields its proxy URL."""
    perturbations = PerturbationLog(io.FileIO(log, "w"), run_id="test", seed=7)
    engine = Engine(parse_scenario(yaml.safe_dump(scenario)), seed=7, log=perturbations)
    mitm = MitmProxy(engine, HostPatterns.parse("localhost"), confdir=ca_directory(tmp_path))
    port = server_loop.run(mitm.start("127.0.0.1", 0))
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server_loop.run(mitm.stop())
        perturbations.close()


@pytest.mark.slow
async def test_mcp_through_mitm(server_loop, mcp_http, tmp_path):
    """The agent reaches its MCP server through `chaosproxy mitm` as its HTTP proxy."""
    log = tmp_path / "log.jsonl"
    with running_mitm(server_loop, SCENARIO, log, tmp_path) as proxy_url:
        upstream = mcp_http.replace("127.0.0.1", "localhost") + "/mcp"
        http = httpx2.AsyncClient(proxy=proxy_url, timeout=30)
        async with http, Client(streamable_http_client(upstream, http_client=http), mode="legacy") as session:
            await agent(session)
    assert {event["transport"] for event in read_events(log) if event.get("event") == "fault"} == {"mitm"}
    assert_every_fault_is_attached_once(log, tmp_path)
