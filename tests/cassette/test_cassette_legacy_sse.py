"""Legacy HTTP+SSE (the MCP transport of two endpoints: a GET event stream that names where to POST, and
the replies on that stream) recorded through the proxy and replayed to the real mcp SDK's sse_client."""

from __future__ import annotations

import asyncio
import time

import pytest
from mcp.shared.exceptions import MCPError

from tests.helpers.cassette_support import proxy_to, replaying
from tests.helpers.mcp_support import client, dump


async def session(base: str) -> list[object]:
    """What an agent does over legacy SSE: the handshake, the tool list, two calls."""
    async with asyncio.timeout(20), client(f"{base}/sse", "legacy", read_timeout_seconds=10) as mcp:
        tools = await mcp.list_tools()
        first = await mcp.call_tool("add", {"a": 2, "b": 3})
        second = await mcp.call_tool("add", {"a": 40, "b": 2})
    return [dump(tools), dump(first), dump(second)]


@pytest.mark.parametrize("speed", [None, 1.0], ids=["at-once", "timed"])
def test_a_legacy_sse_session_is_replayed_to_the_sdk_client(server_loop, mcp_sse, tmp_path, speed):
    """Each reply comes on the stream once its POST does, with the live id; two sessions at once each get
    their own (the endpoint names a session of the replay's)."""
    folder = tmp_path / "cassette"
    with proxy_to(server_loop, mcp_sse, tmp_path / "log.jsonl", record=folder) as proxy:
        recorded = asyncio.run(session(proxy.url))
        asyncio.run(session(proxy.url))  # a second session: the cassette holds both

    async def two_at_once(url: str) -> list[list[object]]:
        return list(await asyncio.gather(session(url), session(url)))

    with replaying(server_loop, folder, speed=speed) as server:
        replayed = asyncio.run(two_at_once(server.url))
        assert server.replay.unmatched == []
        deadline = time.monotonic() + 5
        while server.legacy and time.monotonic() < deadline:  # each session forgotten once its client left
            time.sleep(0.02)
        assert not server.legacy
    assert replayed == [recorded, recorded]


def test_a_call_the_cassette_lacks_gets_its_error_on_the_stream(server_loop, mcp_sse, tmp_path):
    """A legacy client reads every answer on its stream: the error naming the closest recorded request goes
    there too (answered on the POST, it would wait for it until it gave up)."""
    folder = tmp_path / "cassette"
    with proxy_to(server_loop, mcp_sse, tmp_path / "log.jsonl", record=folder) as proxy:
        asyncio.run(session(proxy.url))

    async def unrecorded(base: str) -> str:
        async with asyncio.timeout(20), client(f"{base}/sse", "legacy", read_timeout_seconds=10) as mcp:
            await mcp.list_tools()
            with pytest.raises(MCPError) as refused:
                await mcp.call_tool("add", {"a": 1, "b": 1})
            return str(refused.value)

    with replaying(server_loop, folder) as server:
        said = asyncio.run(unrecorded(server.url))
    assert "closest" in said and "tools/call" in said, said


def test_a_call_asked_again_is_answered_again_on_the_stream(server_loop, mcp_sse, tmp_path):
    """An agent that retries asks what it asked before: the recorded reply goes on its stream again (the
    POST accepted, no reply ever coming, it would wait until it gave up)."""
    folder = tmp_path / "cassette"
    with proxy_to(server_loop, mcp_sse, tmp_path / "log.jsonl", record=folder) as proxy:
        asyncio.run(session(proxy.url))

    async def asked_twice(base: str) -> list[object]:
        async with asyncio.timeout(20), client(f"{base}/sse", "legacy", read_timeout_seconds=5) as mcp:
            await mcp.list_tools()
            first = await mcp.call_tool("add", {"a": 2, "b": 3})
            again = await mcp.call_tool("add", {"a": 2, "b": 3})
        return [dump(first), dump(again)]

    with replaying(server_loop, folder) as server:
        first, again = asyncio.run(asked_twice(server.url))
    assert first == again and "5" in str(first)
