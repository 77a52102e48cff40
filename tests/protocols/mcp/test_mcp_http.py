"""MCP over streamable HTTP and legacy SSE through the proxy, with the real Python SDK client."""

from __future__ import annotations

import contextlib
import time

import aiohttp
import pytest
from mcp.shared.exceptions import MCPError

from tests.helpers.mcp_support import client, dump, serve

ERAS = ["auto", "legacy"]  # auto negotiates the 2026-07-28 era with this server; legacy forces the handshake
WATCH = {"rules": [{"name": "never", "match": {"tool": "no-such-tool"},
                    "fault": {"type": "latency", "delay_ms": 1, "phase": "response"}}]}


async def session_transcript(url: str, mode: str) -> dict:
    async with client(url, mode) as session:
        return {
            "tools": dump(await session.list_tools()),
            "weather": dump(await session.call_tool("weather", {"city": "Lima"})),
            "search": dump(await session.call_tool("search", {"query": "chaos", "limit": 2})),
            "fail": dump(await session.call_tool("fail", {"reason": "nope"})),
        }


# legacy HTTP+SSE speaks the handshake era only
TRANSPORTS = [("mcp_http", "auto"), ("mcp_http", "legacy"), ("mcp_json", "auto"), ("mcp_json", "legacy"),
              ("mcp_sse", "legacy")]


@pytest.mark.slow
@pytest.mark.parametrize("server,mode", TRANSPORTS)
@pytest.mark.parametrize("scenario", ["rules: []", WATCH], ids=["idle", "watching"])
async def test_results_are_identical_direct_and_through_the_proxy(request, make_proxy, server, mode, scenario):
    base = request.getfixturevalue(server)
    path = "/sse" if server == "mcp_sse" else "/mcp"
    proxy = make_proxy(scenario, to=base)
    direct = await session_transcript(base + path, mode)
    proxied = await session_transcript(proxy.url + path, mode)
    assert proxied == direct
    assert {t["name"] for t in direct["tools"]["tools"]} >= {"search", "weather", "count"}
    assert proxy.events("fault") == []


@pytest.mark.slow
@pytest.mark.parametrize("mode", ERAS)
async def test_progress_notifications_arrive_as_they_are_sent(make_proxy, mcp_http, mode):
    proxy = make_proxy(WATCH, to=mcp_http)
    arrivals: list[float] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        arrivals.append(time.perf_counter())

    async with client(proxy.url + "/mcp", mode) as session:
        started = time.perf_counter()
        result = await session.call_tool("count", {"n": 4, "interval_ms": 150}, progress_callback=on_progress)
        finished = time.perf_counter()
    assert result.content[0].text == "counted to 4"
    assert len(arrivals) == 4
    assert arrivals[0] - started < 0.45  # the first step's progress, not the end of the call
    assert finished - arrivals[0] > 0.3


@pytest.mark.slow
async def test_an_upstream_dying_mid_session_is_a_clear_error_not_a_hang(make_proxy):
    with contextlib.ExitStack() as server:
        url = server.enter_context(serve("http"))
        proxy = make_proxy(WATCH, to=url)
        async with client(proxy.url + "/mcp", "legacy", read_timeout_seconds=10) as session:
            await session.list_tools()
            server.close()  # the server process is gone mid-session
            started = time.perf_counter()
            with pytest.raises(MCPError) as caught:
                await session.call_tool("weather", {"city": "Oslo"})
    assert time.perf_counter() - started < 5
    assert caught.value.error.code == -32603  # the SDK's reading of our 502
    assert [c["outcome"] for c in proxy.events("call")][-1] == "upstream_error"


async def test_legacy_endpoint_with_an_absolute_url_is_pointed_back_through_the_proxy(make_proxy):
    """Some legacy servers announce an absolute POST URL; the agent must still POST via the proxy."""
    from aiohttp import web

    async def sse(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        origin = f"http://127.0.0.1:{request.url.port}"
        await response.write(f"event: endpoint\ndata: {origin}/messages?sessionId=s1\n\n".encode())
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_get("/sse", sse)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    try:
        proxy = make_proxy(to=f"http://127.0.0.1:{port}")
        async with aiohttp.ClientSession() as http, http.get(proxy.url + "/sse") as response:
            body = await response.read()
    finally:
        await runner.cleanup()
    assert body == b"event: endpoint\ndata: /messages?sessionId=s1\n\n"
