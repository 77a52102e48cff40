"""The proxy's trace context replaces the agent's whole on every path (W3C Trace Context): under the
agent's valid traceparent, its tracestate goes on only when valid; when the proxy starts a trace of its own
(no traceparent, or a malformed one), the agent's tracestate is discarded, valid or not."""

from __future__ import annotations

import pytest

from tests.telemetry.test_otel import AGENT_SPAN, AGENT_TRACE, receiver  # noqa: F401  (a fixture)
from tests.telemetry.test_otel_hostile import AGENT_PARENT, PATHS, exchange, header_lines, traced_call

INVALID_STATE = b"tracestate: rojo=1,congo=\xe2\x82\xac"  # a byte beyond ASCII: no valid list member
VALID_STATE = b"tracestate: rojo=00f067aa0ba902b7"


def context_lines(head: bytes) -> dict[bytes, list[bytes]]:
    lines = header_lines(head)
    return {name: [value for key, value in lines if key == name] for name in (b"traceparent", b"tracestate")}


@pytest.mark.parametrize("path", PATHS)
def test_an_invalid_tracestate_under_a_valid_parent_stays_behind(make_proxy, scripted, receiver, path):  # noqa: F811
    status, _, head, sent, _ = exchange(make_proxy, scripted, receiver, path, traced_call(
        {}, b"traceparent: " + AGENT_PARENT.encode(), INVALID_STATE))
    assert status == 200
    context = context_lines(head)
    assert context[b"tracestate"] == [], head
    [traceparent] = context[b"traceparent"]
    assert traceparent.startswith(f"00-{AGENT_TRACE}-".encode()) and AGENT_SPAN.encode() not in traceparent
    assert "tracestate" not in sent["params"]["_meta"]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("parent", [None, b"traceparent: 00-not-a-context-01"], ids=["none", "malformed"])
@pytest.mark.parametrize("state", [VALID_STATE, INVALID_STATE], ids=["valid", "invalid"])
def test_a_trace_the_proxy_starts_takes_no_tracestate_of_the_agents(make_proxy, scripted, receiver,  # noqa: F811
                                                                     path, parent, state):
    headers = [state] if parent is None else [parent, state]
    status, _, head, sent, _ = exchange(make_proxy, scripted, receiver, path, traced_call({}, *headers))
    assert status == 200
    context = context_lines(head)
    assert context[b"tracestate"] == [], head
    [traceparent] = context[b"traceparent"]
    assert AGENT_TRACE.encode() not in traceparent  # a trace of the proxy's own
    assert sent["params"]["_meta"] == {"traceparent": traceparent.decode()}
