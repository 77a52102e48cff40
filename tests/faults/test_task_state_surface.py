"""A task-state fault's log line says which surface it acted on: MCP's Tasks (a tasks/get poll's answer)
or A2A's tasks, the same faults acting on both."""

from __future__ import annotations

import pytest

from tests.faults.test_mcp_modern_faults import cached_http, modern_http, through  # noqa: F401  (fixtures)
from tests.helpers.a2a_support import JSONRPC, a2a_client, events, question, remote_agent  # noqa: F401
from tests.helpers.llm_support import rules
from tests.helpers.modern_support import TasksClient

STUCK = {"name": "never-done", "fault": {"type": "task_stuck"}}


@pytest.mark.slow
async def test_task_stuck_on_an_mcp_task_logs_level_mcp(through):
    async with through("http", STUCK, extensions=[TasksClient()]) as (client, run):
        with pytest.raises(TimeoutError):
            await client.call_tool("report", {"polls": 1})
    lines = run.faults("task_stuck")
    assert lines and {(line["level"], line["method"]) for line in lines} == {("mcp", "tasks/get")}


@pytest.mark.slow
async def test_task_stuck_on_an_a2a_task_logs_level_a2a(remote_agent, make_proxy):  # noqa: F811
    proxy = make_proxy(rules(STUCK), to=remote_agent.url)
    async with a2a_client(proxy.url, JSONRPC, streaming=False) as client:
        await events(client, question())
    lines = proxy.events("fault")
    assert lines and {line["level"] for line in lines} == {"a2a"}
