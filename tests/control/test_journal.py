"""The journal: the calls and faults a test asserts on, from the control API, the client and the fixture."""

from __future__ import annotations

import pytest

from chaosproxy.client import ControlError
from chaosproxy.control.journal import Journal, JournalQueryError
from chaosproxy.embedded import EmbeddedProxy
from tests.helpers.support import http_status as status

pytest_plugins = ["pytester"]

# The README's example: an agent that retries a failed search once; the test asserts on what it did.
EXAMPLE = '''
import asyncio

import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError

SEARCH_DOWN = {"rules": [{"name": "down", "match": {"tool": "search"}, "first": 1,
                          "fault": {"type": "rpc_error", "code": -32000, "message": "search is down"}}]}


async def agent(url: str) -> str:
    """Search, and try once more when the search fails."""
    async with Client(url) as session:
        for _ in range(2):
            try:
                result = await session.call_tool("search", {"query": "chaos"})
                return result.content[0].text
            except MCPError:
                continue
    raise RuntimeError("search failed twice")


@pytest.mark.chaosproxy(upstream=UPSTREAM, scenario=SEARCH_DOWN)
def test_the_agent_retries_a_failed_search(chaosproxy):
    asyncio.run(agent(chaosproxy.url + "/mcp"))
    first, second = chaosproxy.calls(tool="search")  # exactly two calls to search
    assert first["faults"] == ["down"] and second["faults"] == []
    [fault] = chaosproxy.faults(rule="down")
    assert fault["tool"] == "search" and fault["fault"] == "rpc_error"
'''


@pytest.mark.slow
def test_the_pytest_example_asserts_on_the_journal(pytester, mcp_http):
    pytester.makepyfile(EXAMPLE.replace("UPSTREAM", repr(mcp_http)))
    pytester.runpytest_subprocess("-p", "no:cacheprovider").assert_outcomes(passed=1)


@pytest.mark.slow
def test_the_example_fails_when_the_agent_does_not_retry(pytester, mcp_http):
    """The example can fail: an agent that gives up after the fault made one call, not two."""
    pytester.makepyfile(EXAMPLE.replace("UPSTREAM", repr(mcp_http)).replace("range(2)", "range(1)"))
    pytester.runpytest_subprocess("-p", "no:cacheprovider").assert_outcomes(failed=1)



def test_the_journal_filters_and_pages(upstream: str):
    down = {"rules": [{"name": "down", "every": 2, "match": {"path": "/api/weather"},
                       "fault": {"type": "http_error", "status": 503}}]}
    with EmbeddedProxy(upstream, down) as proxy:
        statuses = [status(proxy.url + path) for path in ["/api/weather"] * 4 + ["/health"]]
        assert statuses == [200, 503, 200, 503, 200]
        calls = proxy.calls()
        assert [call["status"] for call in calls] == statuses
        assert [call["faults"] for call in proxy.calls(rule="down")] == [["down"], ["down"]]
        assert [line["event"] for line in proxy.journal(rule="down")["lines"]] == ["fault", "call"] * 2
        assert len(proxy.faults(fault="http_error")) == 2 and proxy.faults(fault="latency") == []
        assert [call["path"] for call in proxy.calls(path="/health")] == ["/health"]
        page = proxy.journal(event="call", limit=2)
        assert [call["status"] for call in page["lines"]] == [503, 200]  # the newest two
        later = proxy.journal(since=page["last"])
        assert later["lines"] == [] and later["last"] == page["last"]
        assert status(proxy.url + "/health") == 200
        assert [call["path"] for call in proxy.journal(since=page["last"])["lines"]] == ["/health"]
        with pytest.raises(ControlError) as refused:
            proxy.journal(since="yesterday")
        assert refused.value.status == 400


def test_the_journal_keeps_the_newest_lines_only():
    journal = Journal(size=3)
    for n in range(5):
        journal.record({"event": "call", "n": n})
        journal.record({"event": "session", "n": n})  # neither a call nor a fault: not kept
    assert [line["n"] for line in journal.query({})["lines"]] == [2, 3, 4]
    assert journal.query({})["last"] == 5
    with pytest.raises(JournalQueryError):
        journal.query({"event": "session"})
