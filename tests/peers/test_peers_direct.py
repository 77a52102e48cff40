"""The independent MCP peers work directly (no proxy), so proxy tests can trust them as references."""

from __future__ import annotations

import asyncio
import os

import pytest
from mcp import Client, StdioServerParameters
from mcp.client.sse import sse_client

from tests.peers import peers

if (reason := peers.missing()) and not os.environ.get("CI"):
    pytest.skip(reason, allow_module_level=True)

# Scenarios of the active conformance suite that server-everything passes: the suite targets its own
# conformance server (test_* tools, test:// resources), which no registry ships; the rest fail identically.
EVERYTHING_PASSES = [
    "logging-set-level", "ping", "prompts-list", "resources-list", "resources-subscribe", "resources-unsubscribe",
    "server-initialize", "server-sse-multiple-streams", "tools-call-error", "tools-call-simple-text", "tools-list",
]  # fmt: skip


async def tool_names(client: Client) -> set[str]:
    return {tool.name for tool in (await client.list_tools()).tools}


async def test_everything_over_streamable_http() -> None:
    with peers.everything_http("streamableHttp") as server:
        async with asyncio.timeout(30), Client(server.url, read_timeout_seconds=10) as client:
            assert {"echo", "get-sum", "trigger-long-running-operation"} <= await tool_names(client)
            result = await client.call_tool("echo", {"message": "hi"})
            assert result.content[0].text == "Echo: hi" and not result.is_error


async def test_everything_over_sse() -> None:
    with peers.everything_http("sse") as server:
        transport = sse_client(server.url, timeout=5, sse_read_timeout=30)
        async with asyncio.timeout(30), Client(transport, read_timeout_seconds=10) as client:
            assert "echo" in await tool_names(client)
            result = await client.call_tool("get-sum", {"a": 2, "b": 3})
            assert "5" in result.content[0].text


@pytest.mark.parametrize(
    ("command", "tool", "version"),
    [(peers.everything_stdio(), "echo", "2025-11-25"), (peers.time_stdio(), "get_current_time", "2026-07-28")],
    ids=["everything", "time"],
)
async def test_stdio_servers(command: list[str], tool: str, version: str) -> None:
    params = StdioServerParameters(command=command[0], args=command[1:])
    async with asyncio.timeout(30), Client(params, read_timeout_seconds=10) as client:
        assert client.protocol_version == version
        assert tool in await tool_names(client)


def test_inspector_cli_over_http() -> None:
    with peers.everything_http() as server:
        answer = peers.inspector(server.url, "--method", "tools/call", "--tool-name", "echo",
                                 "--tool-arg", "message=hi")
    assert answer["content"] == [{"type": "text", "text": "Echo: hi"}]


def test_conformance_direct_is_stable() -> None:
    with peers.everything_http() as server:
        first, second = peers.conformance(server.url), peers.conformance(server.url)
    assert len(first.scenarios) == 30 and first.seconds < 30
    assert first.checks == second.checks
    assert first.passed == EVERYTHING_PASSES
