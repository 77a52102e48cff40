"""Spans of calls over HTTP: MCP over streamable HTTP and legacy SSE, and model-API calls in
LLM-gateway mode, exported to a real OTLP receiver on 127.0.0.1."""

from __future__ import annotations

import sys
from typing import Any

import openai
import pytest

from chaosproxy.telemetry.tracing import OtlpTracing
from tests.adapters.test_mitm import confdir, https_upstream, make_mitm, tls_files  # noqa: F401
from tests.helpers.llm_support import CHAT_TOOLS, PROMPT, ScriptedLlm, llm, rules  # noqa: F401
from tests.helpers.mcp_support import serve
from tests.helpers.otlp import Receiver
from tests.telemetry.test_otel import SCENARIO, check_call_spans, make_calls, otel_environment, receiver  # noqa: F401

HEADER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
HEADER_PARENT = f"00-{HEADER_TRACE}-00f067aa0ba902b7-01"  # the agent's HTTP header names another context


@pytest.mark.slow
@pytest.mark.parametrize("transport", ["http", "sse"])
async def test_http_calls_carry_spans_with_their_faults(make_proxy: Any, receiver: Receiver,  # noqa: F811
                                                        monkeypatch: pytest.MonkeyPatch, transport: str):
    """Streamable HTTP and legacy SSE: the same spans as stdio, the upstream's address, the session, the
    agent's header context as a link, and the proxy's context forwarded in the header as well."""
    from mcp.client.sse import sse_client
    from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client

    for name, value in otel_environment(receiver).items():  # the tool server's too: it inherits them
        monkeypatch.setenv(name, value)
    with serve(transport, command=[sys.executable, "-m", "tests.helpers.otlp", "server"]) as upstream:
        proxy = make_proxy(SCENARIO, to=upstream)
        tracing = proxy.engine.tracing = OtlpTracing(run_id="http", seed=7)
        server_port = int(upstream.rsplit(":", 1)[1])
        headers = {"traceparent": HEADER_PARENT}
        if transport == "http":
            target: Any = streamable_http_client(f"{proxy.url}/mcp",
                                                 http_client=create_mcp_http_client(headers=headers))
        else:
            target = sse_client(f"{proxy.url}/sse", headers=headers)
        await make_calls(target)
        spans = check_call_spans(receiver, "tcp")
        # every request the tool server got carried a proxy span's context in its header (a stream's
        # span is exported once the proxy has seen the agent hang up)
        received = receiver.wait_for(lambda spans: (headers := [s for s in spans if s.name == "http.traceparent"])
                                     and {h.parent_id for h in headers} <= {s.span_id for s in spans
                                                                           if s.service == "chaosproxy"})
        tracing.shutdown()
    for span in spans.values():
        assert (span.attributes["server.address"], span.attributes["server.port"]) == ("127.0.0.1", server_port)
        assert span.attributes["mcp.session.id"]
        assert span.links == [(HEADER_TRACE, "00f067aa0ba902b7")]
    assert spans["weather"].attributes["error.type"] == "503"
    assert spans["weather"].attributes["http.response.status_code"] == 503
    assert any(s.parent_id == spans["search"].span_id for s in received if s.name == "http.traceparent")



def test_model_api_calls_get_genai_spans_with_their_faults(make_proxy: Any, llm: ScriptedLlm,  # noqa: F811
                                                            receiver: Receiver, monkeypatch: pytest.MonkeyPatch):
    """LLM-gateway mode: `chat {model}` spans after the GenAI conventions; a provider error fails the span."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
    proxy = make_proxy(rules({"match": {"api": "openai-chat"}, "first": 1,
                              "fault": {"type": "latency", "delay_ms": 50}},
                             {"match": {"api": "openai-chat"}, "after": 1, "fault": {"type": "llm_error",
                                                                                      "kind": "overloaded"}}),
                       to=llm.url)
    tracing = proxy.engine.tracing = OtlpTracing(run_id="llm", seed=7)
    client = openai.OpenAI(base_url=proxy.url + "/v1", api_key="sk-test", max_retries=0)
    messages = [{"role": "user", "content": PROMPT}]
    client.chat.completions.create(model="gpt-test", messages=messages, tools=CHAT_TOOLS)
    with pytest.raises(openai.APIStatusError):
        client.chat.completions.create(model="gpt-test", messages=messages, tools=CHAT_TOOLS)
    tracing.shutdown()
    slow, failed = receiver.wait_for(lambda spans: len([s for s in spans if s.name == "chat gpt-test"]) == 2,
                                     timeout=10) and receiver.named("chat gpt-test")
    for span in (slow, failed):
        assert span.kind == "CLIENT"
        assert (span.attributes["gen_ai.operation.name"], span.attributes["gen_ai.provider.name"],
                span.attributes["gen_ai.request.model"]) == ("chat", "openai", "gpt-test")
        assert span.attributes["server.address"] == "127.0.0.1"
    assert slow.attributes["chaosproxy.fault.type"] == "latency" and slow.status == "UNSET"
    [delay] = [s for s in receiver.named("chaosproxy.fault latency") if s.parent_id == slow.span_id]
    assert delay.seconds == pytest.approx(0.05, abs=0.01)
    assert failed.attributes["chaosproxy.fault.type"] == "llm_error" and failed.status == "ERROR"
    assert failed.attributes["error.type"] == failed.attributes["http.response.status_code"].__str__()


async def test_intercepted_calls_get_spans_too(make_mitm: Any, receiver: Receiver,  # noqa: F811
                                               monkeypatch: pytest.MonkeyPatch):
    """chaosproxy mitm: the same MCP span for a tools/call to an HTTPS tool server, its fault on it."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
    mitm = make_mitm({"rules": [{"name": "down", "match": {"tool": "search"},
                                 "fault": {"type": "http_error", "status": 503}}]})
    tracing = mitm.engine.tracing = OtlpTracing(run_id="mitm", seed=7)
    call = {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "search", "arguments": {}}}
    status, _, _ = await mitm.fetch(mitm.intercepted + "/rpc", "POST", json=call,
                                    headers={"traceparent": HEADER_PARENT})
    assert status == 503
    await mitm.events_soon("call", 1)
    tracing.shutdown()
    receiver.wait_for(lambda spans: any(s.name == "tools/call search" for s in spans), timeout=10)
    [span] = receiver.named("tools/call search")
    assert (span.kind, span.trace_id, span.parent_id) == ("CLIENT", HEADER_TRACE, "00f067aa0ba902b7")
    upstream_port = int(mitm.intercepted.rsplit(":", 1)[1])
    assert (span.attributes["server.address"], span.attributes["server.port"]) == ("localhost", upstream_port)
    assert (span.attributes["chaosproxy.fault.type"], span.attributes["error.type"], span.status) == (
        "http_error", "503", "ERROR")


def test_plain_http_calls_get_http_client_spans(make_proxy: Any, receiver: Receiver, monkeypatch: pytest.MonkeyPatch):
    """A REST call: an HTTP client span (`GET`, url.full, status); a hang's child span lasts as long as the hang."""
    import urllib.request

    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
    proxy = make_proxy({"rules": [{"name": "stall", "match": {"path": "/api/weather"},
                                   "fault": {"type": "hang", "release_after_ms": 300}}]})
    tracing = proxy.engine.tracing = OtlpTracing(run_id="rest", seed=7)
    with urllib.request.urlopen(proxy.url + "/api/weather?city=oslo", timeout=10) as reply:
        assert reply.status == 200
    tracing.shutdown()
    receiver.wait_for(lambda spans: any(s.name == "GET" for s in spans), timeout=10)
    [span] = receiver.named("GET")
    assert span.kind == "CLIENT" and span.parent_id == ""
    assert span.attributes["http.request.method"] == "GET"
    assert span.attributes["url.full"].endswith("/api/weather?city=oslo")
    assert span.attributes["http.response.status_code"] == 200 and span.status == "UNSET"
    assert "mcp.method.name" not in span.attributes
    [stall] = receiver.named("chaosproxy.fault hang")
    assert stall.parent_id == span.span_id and stall.seconds == pytest.approx(0.3, abs=0.01)
    assert span.seconds >= 0.3
