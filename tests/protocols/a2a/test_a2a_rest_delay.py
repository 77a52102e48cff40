"""A fault's answer given in the proxy's name keeps its wait on A2A's HTTP+JSON binding as on JSON-RPC: a
`timeout` answers after `after_ms`, not at once. Observed with the a2a-sdk client and server on loopback."""

from __future__ import annotations

import time

import pytest

from tests.helpers.a2a_support import JSONRPC, REST, a2a_client, events, question, remote_agent  # noqa: F401
from tests.helpers.llm_support import rules

AFTER_MS = 1500


@pytest.mark.slow
@pytest.mark.parametrize("binding", [REST, JSONRPC])
async def test_a_timeout_answers_after_its_wait_on_either_binding(remote_agent, make_proxy, binding):
    proxy = make_proxy(rules({"match": {"method": "SendMessage"}, "fault": {"type": "timeout", "after_ms": AFTER_MS}}),
                       to=remote_agent.url)
    async with a2a_client(proxy.url, binding, streaming=False) as client:
        started = time.monotonic()
        with pytest.raises(Exception) as answered:  # the proxy's error answer, as each binding reports it
            await events(client, question())
        waited = time.monotonic() - started
    assert "timeout" not in type(answered.value).__name__.lower()  # not the client giving up (after 10 s)
    assert AFTER_MS / 1000 * 0.8 <= waited < AFTER_MS / 1000 + 5
    [line] = proxy.events("fault")
    assert line["fault"] == "timeout"
