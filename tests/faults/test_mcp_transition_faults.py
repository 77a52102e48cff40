"""JSON-RPC and MCP transition faults, observed from the real Python SDK client."""

from __future__ import annotations

import json

import aiohttp
import pytest
from mcp.shared.exceptions import MCPError

from tests.helpers.mcp_support import client

WEATHER = {"city": "Oslo"}


def once(fault: dict, tool: str = "weather", **gates) -> dict:
    return {"rules": [{"name": f"{fault['type']}-once", "match": {"tool": tool}, "first": 1, **gates,
                       "fault": fault}]}


async def first_then_second(url: str, mode: str = "auto", **kwargs):
    """Call weather twice on one session: the fault hits the first call, the second must work."""
    async with client(url, mode, **kwargs) as session:
        try:
            first = await session.call_tool("weather", WEATHER)
        except MCPError as exc:
            first = exc
        second = await session.call_tool("weather", WEATHER)
    assert second.structured_content == {"city": "oslo", "temp_c": 3, "sky": "clear"}
    return first


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_rpc_error_on_request(make_proxy, mcp_http, mode):
    proxy = make_proxy(once({"type": "rpc_error", "code": -32000, "message": "database unavailable"}), to=mcp_http)
    error = await first_then_second(proxy.url + "/mcp", mode)
    assert isinstance(error, MCPError) and (error.error.code, error.error.message) == (-32000, "database unavailable")
    [fault] = proxy.events("fault")
    assert (fault["tool"], fault["component"], fault["level"], fault["phase"]) == \
        ("weather", "transition", "jsonrpc", "request")
    assert fault["effect"]["error"]["code"] == -32000


@pytest.mark.slow
async def test_rpc_error_replacing_the_reply(make_proxy, mcp_json):
    proxy = make_proxy(once({"type": "rpc_error", "code": -32603, "phase": "response"}), to=mcp_json)
    error = await first_then_second(proxy.url + "/mcp")
    assert isinstance(error, MCPError) and error.error.code == -32603
    [fault] = proxy.events("fault")
    assert fault["phase"] == "response" and fault["original_digest"] != fault["perturbed_digest"]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_timeout_as_rpc_error_and_as_tool_error(make_proxy, mcp_http, mode):
    proxy = make_proxy(once({"type": "timeout", "after_ms": 200}), to=mcp_http)
    error = await first_then_second(proxy.url + "/mcp", mode)
    assert isinstance(error, MCPError) and error.error.code == -32001
    proxy = make_proxy(once({"type": "timeout", "form": "tool_error"}), to=mcp_http)
    result = await first_then_second(proxy.url + "/mcp", mode)
    assert result.is_error and "timed out" in result.content[0].text


@pytest.mark.slow
async def test_hang_on_one_request_fails_it_while_the_session_still_works(make_proxy, mcp_http):
    proxy = make_proxy(once({"type": "hang"}), to=mcp_http)
    error = await first_then_second(proxy.url + "/mcp", read_timeout_seconds=1)
    assert isinstance(error, MCPError) and error.error.code == -32001  # the SDK's own timeout
    [call] = [c for c in proxy.events("call") if c["faults"]]
    assert call["outcome"] == "client_disconnected"


async def test_session_expire_gives_404_on_the_handshake_era_session(make_proxy, mcp_http):
    proxy = make_proxy({"rules": [{"name": "restart", "match": {"method": "tools/*"}, "after": 1,
                                   "fault": {"type": "session_expire"}}]}, to=mcp_http)
    async with client(proxy.url + "/mcp", "legacy") as session:
        await session.list_tools()
        with pytest.raises(MCPError, match="Session not found"):
            await session.call_tool("weather", WEATHER)
    assert [f["method"] for f in proxy.events("fault")] == ["tools/call"]


async def test_session_expire_on_the_wire(make_proxy, mcp_http):
    proxy = make_proxy({"rules": [{"name": "restart", "fault": {"type": "session_expire"}}]}, to=mcp_http)
    async with aiohttp.ClientSession() as http:
        request = {"jsonrpc": "2.0", "id": 9, "method": "tools/list"}
        async with http.post(proxy.url + "/mcp", json=request, headers={"Accept": "application/json"}) as response:
            assert response.status != 404  # no session yet: nothing to expire
        async with http.post(proxy.url + "/mcp", json=request,
                             headers={"Mcp-Session-Id": "abc", "Accept": "application/json"}) as response:
            assert response.status == 404
            assert (await response.json())["error"]["message"] == "Session not found"
    [fault] = proxy.events("fault")
    assert (fault["session"], fault["fault"]) == ("abc", "session_expire")


@pytest.mark.slow
@pytest.mark.parametrize("server", ["mcp_http", "mcp_json"])
async def test_malformed_truncated_frame_is_a_parse_error(request, make_proxy, server):
    proxy = make_proxy(once({"type": "malformed", "variant": "truncated"}), to=request.getfixturevalue(server))
    async with client(proxy.url + "/mcp", read_timeout_seconds=2) as session:
        with pytest.raises(MCPError) as caught:
            await session.call_tool("weather", WEATHER)
    assert caught.value.error.code in (-32700, -32001)  # parse error, or a hang the client times out


@pytest.mark.slow
async def test_malformed_wrong_id_leaves_the_client_waiting(make_proxy, mcp_http):
    proxy = make_proxy(once({"type": "malformed", "variant": "wrong_id"}), to=mcp_http)
    error = await first_then_second(proxy.url + "/mcp", read_timeout_seconds=1)
    assert isinstance(error, MCPError) and error.error.code == -32001


async def test_malformed_invalid_json_in_result_text(make_proxy, mcp_http):
    proxy = make_proxy(once({"type": "malformed", "variant": "invalid_json"}, tool="search"), to=mcp_http)
    async with client(proxy.url + "/mcp") as session:
        broken = await session.call_tool("search", {"query": "x"})
        fine = await session.call_tool("search", {"query": "x"})
    json.loads(fine.content[0].text)
    with pytest.raises(json.JSONDecodeError):
        json.loads(broken.content[0].text)


async def test_schema_drift_renames_keys_in_text_json(make_proxy, mcp_http):
    proxy = make_proxy(once({"type": "schema_drift", "keys": ["results"]}, tool="search"), to=mcp_http)
    async with client(proxy.url + "/mcp") as session:
        drifted = json.loads((await session.call_tool("search", {"query": "x"})).content[0].text)
    assert "results" not in drifted and "results_value" in drifted


async def test_schema_drift_violating_the_output_schema_is_caught_by_the_client(make_proxy, mcp_http):
    proxy = make_proxy(once({"type": "schema_drift", "mode": "drop", "keys": ["temp_c"]}), to=mcp_http)
    async with client(proxy.url + "/mcp") as session:
        with pytest.raises(RuntimeError, match="temp_c"):
            await session.call_tool("weather", WEATHER)


async def test_schema_drift_retype_is_reproducible(make_proxy, mcp_http):
    drift = once({"type": "schema_drift", "mode": "retype", "count": 2, "where": "text"}, tool="search")

    async def drifted(seed: int) -> str:
        proxy = make_proxy(drift, to=mcp_http, seed=seed)
        async with client(proxy.url + "/mcp") as session:
            return (await session.call_tool("search", {"query": "x"})).content[0].text

    assert await drifted(3) == await drifted(3)
