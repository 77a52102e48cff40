"""Independent peers through the proxy: servers and clients we did not write see no difference.

server-everything (the TypeScript reference server) over streamable HTTP, legacy SSE and stdio with the
Python SDK client and the MCP Inspector CLI, and the official conformance suite run direct and
through the idle proxy.
"""

from __future__ import annotations

import asyncio
import os
import sys

import pytest
from mcp import Client, StdioServerParameters
from mcp.shared.exceptions import MCPError

from tests.helpers.framing_support import RawClient
from tests.helpers.mcp_support import client, dump
from tests.peers import peers

if (reason := peers.missing()) and not os.environ.get("CI"):
    pytest.skip(reason, allow_module_level=True)


@pytest.fixture(scope="module", params=["streamableHttp", "sse"])
def everything(request):
    with peers.everything_http(request.param) as server:
        yield server


def through(proxy_url: str, server: peers.Server) -> str:
    return proxy_url + server.url.removeprefix(server.base)


async def transcript(url: str) -> dict:
    async with asyncio.timeout(60), client(url, "legacy", read_timeout_seconds=20) as session:
        return {
            "tools": dump(await session.list_tools()),
            "echo": dump(await session.call_tool("echo", {"message": "through the proxy"})),
            "sum": dump(await session.call_tool("get-sum", {"a": 2, "b": 40})),
            "structured": dump(await session.call_tool("get-structured-content", {"location": "New York"})),
        }


async def test_sdk_client_sees_the_same_server_direct_and_through_the_proxy(make_proxy, everything):
    proxy = make_proxy(to=everything.base)
    direct = await transcript(everything.url)
    proxied = await transcript(through(proxy.url, everything))
    assert proxied == direct
    assert direct["echo"]["content"][0]["text"] == "Echo: through the proxy"


async def test_a_fault_reaches_the_sdk_client_from_a_foreign_server(make_proxy, everything):
    proxy = make_proxy({"rules": [{"name": "sum-broken", "match": {"tool": "get-sum"},
                                   "fault": {"type": "rpc_error", "code": -32000, "message": "backend down"}}]},
                       to=everything.base)
    async with asyncio.timeout(60), client(through(proxy.url, everything), "legacy") as session:
        with pytest.raises(MCPError, match="backend down"):
            await session.call_tool("get-sum", {"a": 1, "b": 2})
        echoed = await session.call_tool("echo", {"message": "still here"})
    assert echoed.content[0].text == "Echo: still here"
    assert [f["tool"] for f in proxy.events("fault")] == ["get-sum"]


async def test_sdk_client_sees_the_same_server_over_stdio_through_the_proxy(tmp_path):
    """server-everything over stdio, wrapped by `chaosproxy stdio` as an MCP config would wrap it."""
    server = peers.everything_stdio()
    wrapped = [sys.executable, "-m", "chaosproxy", "stdio", "--log", str(tmp_path / "log.jsonl"), "--", *server]

    async def stdio_transcript(command: list[str]) -> dict:
        params = StdioServerParameters(command=command[0], args=command[1:])
        async with asyncio.timeout(60), Client(params, mode="legacy", read_timeout_seconds=20) as session:
            return {"tools": dump(await session.list_tools()),
                    "echo": dump(await session.call_tool("echo", {"message": "over stdio"})),
                    "sum": dump(await session.call_tool("get-sum", {"a": 2, "b": 40}))}

    assert await stdio_transcript(wrapped) == await stdio_transcript(server)
    calls = [line for line in (tmp_path / "log.jsonl").read_text().splitlines() if '"event":"call"' in line]
    assert len(calls) >= 3  # tools/list and both calls were relayed and logged


def test_inspector_cli_sees_the_same_tools_through_the_proxy(make_proxy, everything):
    proxy = make_proxy(to=everything.base)
    direct = peers.inspector(everything.url, "--method", "tools/list")
    proxied = peers.inspector(through(proxy.url, everything), "--method", "tools/list")
    assert proxied == direct and len(direct["tools"]) >= 10


def test_conformance_suite_gives_the_same_results_direct_and_through_the_idle_proxy(make_proxy):
    with peers.everything_http("streamableHttp") as server:
        proxy = make_proxy(to=server.base)
        direct = peers.conformance(server.url)
        proxied = peers.conformance(through(proxy.url, server))
    assert direct.passed, direct.output[-2000:]
    assert proxied.checks == direct.checks


def _raw_initialize(base: str, path: str) -> list[list[bytes]]:
    """Two initialize requests on one connection (the second takes the plain path through an idle
    proxy): each answer's status line, its header names in order, and the start of its body."""
    body = (b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18",'
            b'"capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}')
    request = (b"POST %b HTTP/1.1\r\nHost: agent\r\nContent-Type: application/json\r\n"
               b"Accept: application/json, text/event-stream\r\nContent-Length: %d\r\n\r\n%b"
               % (path.encode(), len(body), body))
    answers = []
    with RawClient(base) as raw:
        for _ in range(2):
            raw.send(request)
            status_line, lines = raw.read_line(), []
            while (line := raw.read_line()) != b"\r\n":
                lines.append(line.rstrip(b"\r\n").split(b": ", 1))
            length = int(next(value for name, value in lines if name.lower() == b"content-length"))
            answers.append([status_line, *(name for name, _ in lines), raw.file.read(length)[:13]])
    return answers


def test_the_node_reference_servers_answers_reach_the_agent_as_written_but_for_connection(make_proxy):
    """server-everything's Express says `connection: keep-alive` on every answer: the proxy takes out that
    line (it is about the upstream's connection, not the agent's) and relays the rest of each head as
    written, the names in their order and case (re-serialised, the framing would come last)."""
    with peers.everything_http("streamableHttp") as server:
        proxy = make_proxy(to=server.base)
        direct = _raw_initialize(server.base, "/mcp")
        relayed = _raw_initialize(proxy.url, "/mcp")
    assert all(b"connection" in answer for answer in direct)  # what this is about
    assert relayed == [[part for part in answer if part != b"connection"] for answer in direct]
    assert relayed[0][-1] == b"event: messag"
