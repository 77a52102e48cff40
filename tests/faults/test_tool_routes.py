"""Tool routes: faults that reshape the tool list compose on one tool, routes follow the agent
across reconnects, and a made-up tool never shadows a real one on a later page.

Observed with the real Python SDK client through the proxy against SDK servers.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

import aiohttp
import pytest

from tests.helpers.mcp_support import client

# Each fault acts on the demo server's weather tool, whatever an earlier rule named it.
RESHAPERS: dict[str, dict[str, Any]] = {
    "duplicate_tool": {"type": "duplicate_tool", "tool": "*weather*", "route": "error"},
    "rename_tool": {"type": "rename_tool", "tool": "*weather*", "style": "prefix", "prefix": "acme_"},
    "input_schema_drift": {"type": "input_schema_drift", "tool": "*weather*", "parameter": "city",
                           "reject_old": True},
    "distractor_tool": {"type": "distractor_tool", "tool": "*weather", "route": "pass"},
    "remove_tool": {"type": "remove_tool", "tool": "*weather_v2"},
}


def in_order(*rules: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    """A scenario of these (name, fault) rules, which act on a tool list in this order."""
    return {"rules": [{"name": name, "fault": fault} for name, fault in rules]}


def arguments_for(schema: dict[str, Any]) -> dict[str, Any]:
    """Arguments in the shape the agent was shown: every parameter a city name (weather's only one)."""
    return {name: "Oslo" for name in (schema.get("properties") or {})}


@pytest.mark.parametrize("first,second", list(itertools.permutations(RESHAPERS, 2)),
                         ids=lambda name: name)
async def test_two_faults_on_one_tool_compose_in_either_order(make_proxy, mcp_http, first, second):
    """Every name shown is callable with the schema shown, or fails exactly as its fault says:
    duplicate_tool's route: error answers the tool's calls with a tool error."""
    proxy = make_proxy(in_order((first, RESHAPERS[first]), (second, RESHAPERS[second])), to=mcp_http)
    outcomes: dict[str, str] = {}
    async with client(proxy.url + "/mcp") as session:
        shown = [tool for tool in (await session.list_tools()).tools if "weather" in tool.name]
        for tool in shown:
            result = await session.call_tool(tool.name, arguments_for(tool.input_schema))
            if result.is_error:
                assert "duplicate_tool" in (first, second), (tool.name, result)
                assert result.content[0].text.startswith("Error executing tool "), result
                outcomes[tool.name] = "tool error"
            else:
                assert result.structured_content == {"city": "oslo", "temp_c": 3, "sky": "clear"}, tool.name
                outcomes[tool.name] = "ok"
    assert outcomes
    if "duplicate_tool" not in (first, second):
        assert set(outcomes.values()) == {"ok"}
    calls = [line for line in proxy.events("call") if line.get("method") == "tools/call"]
    assert not [c for c in calls if c.get("outcome") == "upstream_error"]


async def test_rename_then_drift_reaches_the_real_tool_with_real_arguments(make_proxy, mcp_http):
    """The case from the issue: the drift used to overwrite the rename's route (Unknown tool)."""
    proxy = make_proxy(in_order(("rename", {"type": "rename_tool", "tool": "weather", "to": "forecast"}),
                                ("drift", {"type": "input_schema_drift", "tool": "forecast"})), to=mcp_http)
    async with client(proxy.url + "/mcp") as session:
        tools = {tool.name: tool for tool in (await session.list_tools()).tools}
        assert "weather" not in tools and list(tools["forecast"].input_schema["properties"]) == ["city_v2"]
        result = await session.call_tool("forecast", {"city_v2": "Lima"})
    assert result.structured_content == {"city": "lima", "temp_c": 22, "sky": "clear"}
    routed = [line for line in proxy.events("fault") if line["method"] == "tools/call"]
    assert [line["rule"] for line in routed] == ["drift", "rename"]


async def test_duplicate_error_route_survives_a_later_drift(make_proxy, mcp_http):
    proxy = make_proxy(in_order(("dup", {"type": "duplicate_tool", "tool": "weather", "route": "error"}),
                                ("drift", {"type": "input_schema_drift", "tool": "weather"})), to=mcp_http)
    async with client(proxy.url + "/mcp") as session:
        await session.list_tools()
        result = await session.call_tool("weather", {"city_v2": "Lima"})
    assert result.is_error and result.content[0].text == "Error executing tool weather"


async def _raw_call(url: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """A fresh MCP session (handshake era) that calls a tool straight away, as an agent that kept
    its tool list across a reconnect does."""
    accept = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    async with aiohttp.ClientSession() as http:
        init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}}
        async with http.post(url, json=init, headers=accept) as response:
            session_id = response.headers["Mcp-Session-Id"]
            await response.read()
        headers = {**accept, "Mcp-Session-Id": session_id, "MCP-Protocol-Version": "2025-06-18"}
        async with http.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=headers):
            pass
        call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": name, "arguments": arguments}}
        async with http.post(url, json=call, headers=headers) as response:
            text = await response.text()
    data = next(line[5:].strip() for line in text.splitlines() if line.startswith("data:")) \
        if "data:" in text else text
    return json.loads(data)


async def test_routes_follow_the_agent_across_a_reconnect(make_proxy, mcp_http):
    proxy = make_proxy(in_order(("rename", {"type": "rename_tool", "tool": "weather", "to": "forecast"})),
                       to=mcp_http)
    async with client(proxy.url + "/mcp", "legacy") as session:
        assert "forecast" in {tool.name for tool in (await session.list_tools()).tools}
    # The agent lost its session and reconnects under a new Mcp-Session-Id, calling what it was shown.
    reply = await _raw_call(proxy.url + "/mcp", "forecast", {"city": "Tokyo"})
    assert reply["result"]["structuredContent"] == {"city": "tokyo", "temp_c": 19, "sky": "clear"}
    sessions = {line["session"] for line in proxy.events("fault")}
    assert len(sessions) == 2  # renamed in one session, routed in the other


async def test_a_made_up_tool_gives_its_name_back_to_a_real_tool_on_a_later_page(make_proxy, mcp_paged):
    """tool_flood pads page one before the proxy has seen page three, which lists search_tickets."""
    proxy = make_proxy(in_order(("flood", {"type": "tool_flood", "count": 300})), to=mcp_paged)

    async def every_page(session: Any) -> list[Any]:
        tools, cursor = [], None
        for _ in range(20):
            page = await session.list_tools(cursor=cursor)
            tools += page.tools
            cursor = page.next_cursor
            if cursor is None:
                return tools
        raise AssertionError("the listing never ended")

    async with client(proxy.url + "/mcp", "legacy") as session:
        first = [tool.name for tool in await every_page(session)]
        real = await session.call_tool("search_tickets", {"query": "vpn"})
        again = [tool.name for tool in await every_page(session)]
    assert first.count("search_tickets") == 2  # made up on page one before page three was seen
    assert real.is_error is False and real.content[0].text == "3 tickets match 'vpn'."
    assert again.count("search_tickets") == 1  # from then on the name is never made up
