"""Faults keep a tool's results valid for its outputSchema even when the agent never listed the tools
through the proxy (issue 25 item 13): the Python SDK client lists only after a call, to validate the
result it already has, so the proxy lists upstream's tools itself first; where it cannot (a legacy
HTTP+SSE session), it perturbs text only and logs a skip for the structured part."""

from __future__ import annotations

from typing import Any

import pytest

from tests.helpers.mcp_support import client

FAULTS = [{"type": "typos", "rate": 0.5}, {"type": "oversize", "factor": 3},
          {"type": "wrong_data", "mode": "swap", "count": 3}]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["auto", "legacy"])  # the stateless era, and the handshake era's sessions
@pytest.mark.parametrize("fault", FAULTS, ids=[fault["type"] for fault in FAULTS])
async def test_a_call_without_listing_first_gets_a_perturbed_schema_valid_result(
        make_proxy: Any, mcp_strict: str, fault: dict[str, Any], mode: str) -> None:
    direct = make_proxy({"rules": []}, to=mcp_strict)
    async with client(direct.url + "/mcp", mode) as session:
        real = (await session.call_tool("tickets", {"query": "printer", "limit": 3})).structured_content
    proxy = make_proxy({"rules": [{"name": "f", "match": {"tool": "tickets"}, "fault": fault}]}, to=mcp_strict)
    async with client(proxy.url + "/mcp", mode) as session:
        result = await session.call_tool("tickets", {"query": "printer", "limit": 3})  # validated by the SDK
        again = await session.call_tool("tickets", {"query": "printer", "limit": 3})
    assert not result.is_error and result.structured_content != real
    assert not again.is_error
    [line, _] = proxy.events("fault")
    assert any(place.startswith("result.structuredContent") for place in line["effect"]["changed"])
    assert proxy.events("skip") == []
    lists = [call for call in proxy.events("call") if call.get("method") == "tools/list"]
    assert len(lists) == 1  # the SDK's own, after the first call: the proxy's listing is not the agent's


@pytest.mark.slow
async def test_the_proxy_lists_every_page(make_proxy: Any, mcp_paged: str) -> None:
    """Upstream lists two tools a page: `summary` is on the second."""
    proxy = make_proxy({"rules": [{"name": "f", "match": {"tool": "summary"},
                                   "fault": {"type": "typos", "rate": 0.5}}]}, to=mcp_paged)
    async with client(proxy.url + "/mcp") as session:
        result = await session.call_tool("summary", {"topic": "printers"})  # validated by the SDK
    assert not result.is_error and proxy.events("skip") == []
    [line] = proxy.events("fault")
    assert "result.structuredContent.result" in line["effect"]["changed"]


@pytest.mark.slow
async def test_where_the_schema_cannot_be_had_only_text_is_perturbed_and_the_rest_skipped(
        make_proxy: Any, mcp_sse: str) -> None:
    """Legacy HTTP+SSE answers on the agent's own stream: the proxy lists nothing itself there."""
    proxy = make_proxy({"rules": [{"name": "slips", "match": {"tool": "weather"},
                                   "fault": {"type": "typos", "rate": 0.5}}]}, to=mcp_sse)
    async with client(proxy.url + "/sse", "legacy") as session:
        result = await session.call_tool("weather", {"city": "Oslo"})  # validated by the SDK
    assert result.structured_content["city"] == "oslo"
    [line] = proxy.events("fault")
    assert list(line["effect"]["changed"]) == ["result.content[0].text"]
    [skip] = proxy.events("skip")
    assert skip["rule"] == "slips" and "structuredContent left as it is" in skip["reason"]
