"""The HTTP proxy's behaviour around faults: streaming, bad upstreams, impatient clients, the log."""

from __future__ import annotations

import asyncio
import socket
import time

import aiohttp
import pytest

from tests.helpers.support import rule


async def first_event_after(url: str) -> tuple[float, float]:
    """Seconds until the first SSE event arrives, and until the stream ends."""
    started = time.perf_counter()
    first = None
    async with aiohttp.ClientSession() as client:
        async with client.get(url, timeout=aiohttp.ClientTimeout(total=10)) as response:
            async for line in response.content:
                if first is None and line.startswith(b"data:"):
                    first = time.perf_counter() - started
    assert first is not None
    return first, time.perf_counter() - started


@pytest.mark.slow
async def test_sse_events_are_relayed_as_they_are_sent(make_proxy, upstream):
    proxy = make_proxy()
    url = "/sse?n=10&interval_ms=50"
    direct_first, _ = await first_event_after(upstream + url)
    proxied_first, proxied_total = await first_event_after(proxy.url + url)
    assert proxied_total >= 0.4  # the stream really took its time...
    assert proxied_first - direct_first < 0.03  # ...and the first event was not held back for it


async def test_unreachable_upstream_gives_a_clear_502(make_proxy):
    with socket.socket() as sock:  # a port with nobody listening
        sock.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}"
    proxy = make_proxy(to=dead)
    async with aiohttp.ClientSession() as client:
        async with client.get(proxy.url + "/api/weather", timeout=aiohttp.ClientTimeout(total=15)) as response:
            assert response.status == 502
            assert response.headers["X-Chaosproxy-Error"] == "upstream-unreachable"
            body = await response.json()
    assert "unreachable" in body["error"]["message"] and dead in body["error"]["message"]
    [call] = proxy.events("call")
    assert (call["status"], call["outcome"]) == (502, "upstream_error")


async def test_client_leaving_mid_stream_does_not_disturb_others(make_proxy):
    proxy = make_proxy()
    async with aiohttp.ClientSession() as client:
        async with client.get(proxy.url + "/sse?n=100&interval_ms=20") as response:
            await response.content.readline()
        # gone mid-stream; the proxy still serves
        for _ in range(3):
            async with client.get(proxy.url + "/api/weather") as again:
                assert again.status == 200
    for _ in range(50):  # the abandoned call is logged once the proxy notices
        if any(c["path"] == "/sse" for c in proxy.events("call")):
            break
        await asyncio.sleep(0.05)
    [sse_call] = [c for c in proxy.events("call") if c["path"] == "/sse"]
    assert sse_call["outcome"] == "client_disconnected"


async def test_hanging_request_is_released_when_client_leaves(make_proxy):
    proxy = make_proxy(rule("stuck", {"type": "hang"}))
    async with aiohttp.ClientSession() as client:
        try:
            async with client.get(proxy.url + "/health", timeout=aiohttp.ClientTimeout(total=0.3)):
                pass
        except TimeoutError:
            pass
    for _ in range(50):
        if proxy.events("call"):
            break
        await asyncio.sleep(0.05)
    [call] = proxy.events("call")
    assert call["outcome"] == "client_disconnected" and call["faults"] == ["stuck"]


async def test_keep_alive_connections_do_not_escape_faults(make_proxy):
    proxy = make_proxy(rule("every-other", {"type": "http_error", "status": 500}, every=2))
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as client:
        statuses = []
        for _ in range(6):
            async with client.get(proxy.url + "/health") as response:
                statuses.append(response.status)
                await response.read()
    assert statuses == [200, 500] * 3


async def test_rules_can_look_inside_json_rpc_bodies(make_proxy):
    proxy = make_proxy(rule("search-down", {"type": "http_error", "status": 503},
                            match={"method": "tools/call", "tool": "search"}))
    async with aiohttp.ClientSession() as client:
        def call(tool: str) -> dict:
            return {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": tool}}
        async with client.post(proxy.url + "/echo/rpc", json=call("search")) as response:
            assert response.status == 503
        async with client.post(proxy.url + "/echo/rpc", json=call("weather")) as response:
            assert response.status == 200 and (await response.json())["params"]["name"] == "weather"
    fault = proxy.events("fault")[0]
    assert (fault["method"], fault["tool"], fault["rpc_id"]) == ("tools/call", "search", 1)
    assert "original_digest" in fault and "perturbed_digest" in fault
    calls = proxy.events("call")
    assert [c["tool"] for c in calls] == ["search", "weather"]


async def test_one_fault_line_per_fired_fault_and_one_call_line_per_request(make_proxy):
    proxy = make_proxy({"rules": [
        {"name": "slow", "fault": {"type": "latency", "delay_ms": 1}},
        {"name": "fail-second", "after": 1, "first": 1, "fault": {"type": "http_error", "status": 500}},
    ]})
    async with aiohttp.ClientSession() as client:
        for _ in range(4):
            async with client.get(proxy.url + "/health") as response:
                await response.read()
    faults = proxy.events("fault")
    assert [f["rule"] for f in faults] == ["slow", "slow", "fail-second", "slow", "slow"]
    assert [c["status"] for c in proxy.events("call")] == [200, 500, 200, 200]
