"""The mitm adapter puts the proxy's trace context in place of the agent's whole, as `run` does: an agent's
tracestate goes upstream only when valid under its valid traceparent (W3C Trace Context)."""

from __future__ import annotations

import json

import pytest

from chaosproxy.telemetry.tracing import OtlpTracing
from tests.adapters.test_mitm import confdir, https_upstream, make_mitm, tls_files  # noqa: F401  (fixtures)
from tests.telemetry.test_otel import AGENT_SPAN, AGENT_TRACE, receiver  # noqa: F401  (a fixture)

AGENT_PARENT = f"00-{AGENT_TRACE}-{AGENT_SPAN}-01"


@pytest.mark.parametrize(("sent", "forwarded"), [
    ({"traceparent": AGENT_PARENT, "tracestate": "rojo=1"}, ["rojo=1"]),
    ({"traceparent": AGENT_PARENT, "tracestate": "rojo=1,Congo=2"}, []),  # an upper-case key: invalid
    ({"tracestate": "rojo=1"}, []),  # no parent: the proxy's own trace takes none of the agent's
], ids=["valid", "invalid", "no-parent"])
async def test_the_agents_tracestate_goes_upstream_only_as_w3c_allows(make_mitm, receiver, sent,  # noqa: F811
                                                                       forwarded):
    mitm = make_mitm()
    mitm.engine.tracing = tracing = OtlpTracing(run_id="mitm", seed=1, environ={
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "50"})
    try:
        status, headers, _ = await mitm.fetch(mitm.intercepted + "/echo/context", headers=sent)
    finally:
        tracing.shutdown()
    assert status == 200
    received = json.loads(headers["X-Echo-Headers"])
    assert [value for name, value in received if name.lower() == "tracestate"] == forwarded
    [traceparent] = [value for name, value in received if name.lower() == "traceparent"]
    assert (AGENT_TRACE in traceparent) == ("traceparent" in sent) and AGENT_SPAN not in traceparent
