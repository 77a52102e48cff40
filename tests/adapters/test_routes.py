"""One proxy in front of several tool servers, routed by path prefix."""

from __future__ import annotations

import aiohttp
import pytest

from chaosproxy.engine.scenario import ScenarioError, parse_scenario
from tests.helpers.mcp_support import client


async def get(url: str) -> tuple[int, bytes]:
    async with aiohttp.ClientSession() as http, http.get(url) as response:
        return response.status, await response.read()


@pytest.mark.slow
async def test_prefixes_pick_the_upstream_and_rules_match_on_the_route(make_proxy, upstream, mcp_http):
    proxy = make_proxy({"routes": {"/rest": upstream, "/tools": mcp_http},
                        "rules": [{"name": "rest-down", "match": {"route": "rest", "path": "/rest/api/*"},
                                   "fault": {"type": "http_error", "status": 503}}]})
    assert await get(proxy.url + "/rest/health") == (200, b"ok")
    assert (await get(proxy.url + "/rest/api/weather"))[0] == 503
    async with client(proxy.url + "/tools/mcp") as session:
        assert "weather" in {t.name for t in (await session.list_tools()).tools}
    status, body = await get(proxy.url + "/elsewhere")
    assert status == 404 and b"no route" in body  # never an open relay
    assert [f["route"] for f in proxy.events("fault")] == ["rest"]
    assert {c["route"] for c in proxy.events("call")} == {"rest", "tools", None}


@pytest.mark.slow
async def test_legacy_sse_endpoint_keeps_the_route_prefix(make_proxy, mcp_sse):
    proxy = make_proxy({"routes": {"/legacy": mcp_sse}})
    async with client(proxy.url + "/legacy/sse", "legacy") as session:
        result = await session.call_tool("add", {"a": 1, "b": 2})
    assert result.structured_content == {"result": 3.0}
    assert all(c["route"] == "legacy" for c in proxy.events("call"))


@pytest.mark.slow
async def test_two_routes_expose_the_same_tool_names(make_proxy, mcp_http):
    """An agent aggregating two servers meets real cross-server duplicate names."""
    proxy = make_proxy({"routes": {"/a": mcp_http, "/b": mcp_http}})
    names = []
    for prefix in ("/a", "/b"):
        async with client(proxy.url + prefix + "/mcp") as session:
            names += [t.name for t in (await session.list_tools()).tools]
    assert names.count("search") == 2


@pytest.mark.parametrize("text,reason", [
    ("routes: {/a: 'http://127.0.0.1:1', /a: 'http://127.0.0.1:2'}", "duplicate key '/a'"),
    ("routes: {a: 'http://127.0.0.1:1'}", "must look like /name"),
    ("routes: {/a: 'not a url'}", "expected an http:// or https:// URL"),
])
def test_bad_routes_are_rejected_before_anything_starts(text, reason):
    with pytest.raises(ScenarioError, match=reason):
        parse_scenario(text, "routes.yaml")
