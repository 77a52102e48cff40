"""The exporter's side of tracing, against a real OTLP/HTTP receiver on 127.0.0.1: the standard
OTEL_* variables (sampler, headers, resource, endpoint, compression), a full queue, a stalled collector,
and calls no rule can act on (relayed by callbacks) carrying the same spans as inspected ones."""

from __future__ import annotations

import json
import time
import urllib.request
from typing import Any

import pytest

from chaosproxy.telemetry.tracing import OtlpTracing
from tests.helpers.framing_support import RawClient
from tests.helpers.otlp import Receiver
from tests.telemetry.test_otel import receiver  # noqa: F401

AGENT_TRACE = "0af7651916cd43dd8448eb211c80319c"
AGENT_SPAN = "b7ad6b7169203331"
HEADER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


def rpc_call(proxy_url: str, tool: str, *, rpc_id: int = 1, traceparent: str | None = None,
             header: str | None = None) -> tuple[dict[str, Any], dict[str, str]]:
    """POST a tools/call through the proxy to the echo endpoint: the body and headers the upstream got."""
    params: dict[str, Any] = {"name": tool, "arguments": {}}
    if traceparent is not None:
        params["_meta"] = {"traceparent": traceparent}
    body = json.dumps({"jsonrpc": "2.0", "id": rpc_id, "method": "tools/call", "params": params}).encode()
    headers = {"Content-Type": "application/json"}
    if header is not None:
        headers["traceparent"] = header
    request = urllib.request.Request(proxy_url + "/echo/mcp", body, headers, method="POST")
    with urllib.request.urlopen(request, timeout=10) as reply:
        assert reply.status == 200
        return json.loads(reply.read()), dict(json.loads(reply.headers["X-Echo-Headers"]))


def tracing_for(receiver: Receiver, **variables: str) -> OtlpTracing:  # noqa: F811
    environ = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "50", **variables}
    return OtlpTracing(run_id="export", seed=11, environ=environ)


def test_calls_no_rule_can_act_on_carry_the_same_spans(make_proxy: Any, receiver: Receiver):  # noqa: F811
    """No rules: the call is relayed by callbacks, yet its span has its MCP name and attributes, the
    agent's `_meta` context as parent, the header's as a link, and the proxy's context goes upstream
    in `_meta` and in the header."""
    proxy = make_proxy("rules: []")
    proxy.engine.tracing = tracing = tracing_for(receiver)
    got, headers = rpc_call(proxy.url, "search", rpc_id=9, traceparent=f"00-{AGENT_TRACE}-{AGENT_SPAN}-01",
                            header=f"00-{HEADER_TRACE}-00f067aa0ba902b7-01")
    tracing.shutdown()
    [span] = receiver.wait_for(lambda spans: any(s.name == "tools/call search" for s in spans), timeout=10)
    assert (span.kind, span.trace_id, span.parent_id) == ("CLIENT", AGENT_TRACE, AGENT_SPAN)
    assert span.attributes["mcp.method.name"] == "tools/call"
    assert span.attributes["gen_ai.tool.name"] == "search"
    assert span.attributes["jsonrpc.request.id"] == "9"
    assert span.attributes["http.response.status_code"] == 200 and span.status == "UNSET"
    assert span.links == [(HEADER_TRACE, "00f067aa0ba902b7")]
    proxy_context = f"00-{AGENT_TRACE}-{span.span_id}-01"
    assert got["params"]["_meta"]["traceparent"] == proxy_context
    assert got["params"]["arguments"] == {} and got["params"]["name"] == "search"
    assert [value for name, value in headers.items() if name.lower() == "traceparent"] == [proxy_context]
    assert int(headers["Content-Length"]) == len(json.dumps(got, separators=(",", ":")))


def test_sampler_variables_decide_which_calls_are_recorded(make_proxy: Any, receiver: Receiver):  # noqa: F811
    """parentbased_traceidratio at 0: a call whose agent sampled its trace is recorded, one whose agent
    did not is not (and goes upstream untouched), and a call with no context is not; always_off records nothing."""
    proxy = make_proxy("rules: []")
    proxy.engine.tracing = tracing = tracing_for(receiver, OTEL_TRACES_SAMPLER="parentbased_traceidratio",
                                                 OTEL_TRACES_SAMPLER_ARG="0")
    rpc_call(proxy.url, "sampled", traceparent=f"00-{AGENT_TRACE}-{AGENT_SPAN}-01")
    unsampled = f"00-{HEADER_TRACE}-{AGENT_SPAN}-00"
    got, headers = rpc_call(proxy.url, "unsampled", traceparent=unsampled, header=unsampled)
    assert got["params"]["_meta"] == {"traceparent": unsampled} and headers["traceparent"] == unsampled
    rpc_call(proxy.url, "root")
    tracing.shutdown()
    receiver.wait_for(lambda spans: any(s.name == "tools/call sampled" for s in spans), timeout=10)
    assert [s.name for s in receiver.spans] == ["tools/call sampled"]

    proxy.engine.tracing = tracing = tracing_for(receiver, OTEL_TRACES_SAMPLER="always_off")
    rpc_call(proxy.url, "off", traceparent=f"00-{AGENT_TRACE}-{AGENT_SPAN}-01")
    tracing.shutdown()
    assert tracing.exporter.exported == 0 and [s.name for s in receiver.spans] == ["tools/call sampled"]


def test_ratio_sampler_keeps_about_its_share(make_proxy: Any, receiver: Receiver):  # noqa: F811
    """traceidratio at 0.5 over 200 root calls: about half recorded (by trace id, bounded tolerance)."""
    proxy = make_proxy("rules: []")
    proxy.engine.tracing = tracing = tracing_for(receiver, OTEL_TRACES_SAMPLER="traceidratio",
                                                 OTEL_TRACES_SAMPLER_ARG="0.5")
    for number in range(200):
        rpc_call(proxy.url, "add", rpc_id=number)
    tracing.shutdown()
    recorded = tracing.exporter.exported
    assert 60 <= recorded <= 140, recorded
    assert len(receiver.wait_for(lambda spans: len(spans) == recorded, timeout=10)) == recorded


def test_headers_resource_endpoint_and_compression(make_proxy: Any, receiver: Receiver):  # noqa: F811
    """The traces endpoint as given, the traces headers over the general ones (percent-decoded), gzip,
    the service name over the resource attributes' one, the run's id and seed added."""
    proxy = make_proxy("rules: []")
    proxy.engine.tracing = tracing = OtlpTracing(run_id="resource", seed=11, environ={
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9",  # not used: the traces endpoint wins
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": receiver.endpoint + "/v1/traces",
        "OTEL_EXPORTER_OTLP_HEADERS": "x-general=1",
        "OTEL_EXPORTER_OTLP_TRACES_HEADERS": "Authorization=Basic%20dXNlcjpwYXNz,x-tenant=team%2Ca",
        "OTEL_EXPORTER_OTLP_COMPRESSION": "gzip",
        "OTEL_SERVICE_NAME": "agent-tools",
        "OTEL_RESOURCE_ATTRIBUTES": "service.name=ignored,deployment.environment=staging,team=a%3Db",
        "OTEL_BSP_SCHEDULE_DELAY": "50"})
    rpc_call(proxy.url, "add")
    tracing.shutdown()
    [span] = receiver.wait_for(lambda spans: len(spans) == 1, timeout=10)
    assert span.resource["service.name"] == "agent-tools"
    assert (span.resource["deployment.environment"], span.resource["team"]) == ("staging", "a=b")
    assert (span.resource["chaosproxy.run_id"], span.resource["chaosproxy.seed"]) == ("resource", 11)
    [headers] = receiver.headers
    assert headers["Authorization"] == "Basic dXNlcjpwYXNz" and headers["x-tenant"] == "team,a"
    assert "x-general" not in headers and headers["Content-Encoding"] == "gzip"


@pytest.mark.slow
def test_a_full_queue_drops_and_counts_and_the_proxy_keeps_serving(make_proxy: Any, receiver: Receiver):  # noqa: F811
    """A collector that stalls 3 s an export and a queue of 4: calls go on at their pace, the spans
    that do not fit are dropped and counted, the queued ones arrive once the collector answers."""
    receiver.stall = 3.0
    proxy = make_proxy("rules: []")
    proxy.engine.tracing = tracing = tracing_for(receiver, OTEL_BSP_MAX_QUEUE_SIZE="4",
                                                 OTEL_BSP_MAX_EXPORT_BATCH_SIZE="1", OTEL_BSP_SCHEDULE_DELAY="10")
    rpc_call(proxy.url, "first")
    deadline = time.monotonic() + 10
    while not receiver.headers:  # the first export is in, and held by the collector
        assert time.monotonic() < deadline, "no export reached the collector"
        time.sleep(0.01)
    started = time.monotonic()
    for number in range(20):
        rpc_call(proxy.url, "add", rpc_id=number)
    assert time.monotonic() - started < 2.5  # not one call waited for the stalled collector
    assert tracing.exporter.dropped == 16
    receiver.stall = 0.0
    tracing.shutdown()
    spans = receiver.wait_for(lambda spans: len(spans) == 5, timeout=15)
    assert sorted(s.name for s in spans) == ["tools/call add"] * 4 + ["tools/call first"]
    assert (tracing.exporter.exported, tracing.exporter.failed) == (5, 0)


@pytest.mark.parametrize(("variable", "value"), [("OTEL_TRACES_SAMPLER", "sometimes"),
                                                 ("OTEL_TRACES_SAMPLER_ARG", "2"),
                                                 ("OTEL_BSP_MAX_QUEUE_SIZE", "many"),
                                                 ("OTEL_RESOURCE_ATTRIBUTES", "no-equals-sign")])
def test_bad_variables_warn_and_fall_back(receiver: Receiver, caplog: pytest.LogCaptureFixture,  # noqa: F811
                                          variable: str, value: str):
    environ = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, variable: value}
    if variable == "OTEL_TRACES_SAMPLER_ARG":
        environ["OTEL_TRACES_SAMPLER"] = "traceidratio"
    with caplog.at_level("WARNING", logger="chaosproxy"):
        tracing = OtlpTracing(run_id="bad", seed=1, environ=environ)
        tracing.shutdown()
    assert any(variable in record.getMessage() for record in caplog.records), caplog.text
    assert tracing.sampler.ratio == 1.0 and tracing.settings.max_queue == 2048


def test_a_traced_upload_with_expect_gets_one_100_continue(make_proxy: Any, receiver: Receiver):  # noqa: F811
    """The proxy reads a traced call's small body itself, so it says 100 Continue and sends no Expect on:
    the agent must not get a second 100 from upstream."""
    proxy = make_proxy("rules: []")
    proxy.engine.tracing = tracing = tracing_for(receiver)
    body = json.dumps({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "search"}}).encode()
    with RawClient(proxy.url) as client:
        client.send(b"POST /echo/mcp HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Type: application/json\r\n"
                    b"Content-Length: %d\r\n\r\n" % len(body))
        assert [client.read_line(), client.read_line()] == [b"HTTP/1.1 100 Continue\r\n", b"\r\n"]
        client.send(body)
        assert client.read_line().startswith(b"HTTP/1.1 200")  # the final answer, no other 100 before it
    tracing.shutdown()
    receiver.wait_for(lambda spans: any(s.name == "tools/call search" for s in spans), timeout=10)


def test_a_context_in_meta_counts_however_its_key_is_escaped(make_proxy: Any, receiver: Receiver):  # noqa: F811
    """parentbased_traceidratio at 0: a call with no context is not recorded (its body not even parsed),
    one whose `_meta` names a sampled context is, also when the key is written with \\u escapes."""
    proxy = make_proxy("rules: []")
    proxy.engine.tracing = tracing = tracing_for(receiver, OTEL_TRACES_SAMPLER="parentbased_traceidratio",
                                                 OTEL_TRACES_SAMPLER_ARG="0")
    rpc_call(proxy.url, "root")
    body = ('{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"escaped","arguments":{},'
            '"_meta":{"trace\\u0070arent":"00-' + AGENT_TRACE + "-" + AGENT_SPAN + '-01"}}}').encode()
    request = urllib.request.Request(proxy.url + "/echo/mcp", body, {"Content-Type": "application/json"},
                                     method="POST")
    with urllib.request.urlopen(request, timeout=10) as reply:
        got = json.loads(reply.read())
    tracing.shutdown()
    [span] = receiver.wait_for(lambda spans: len(spans) == 1, timeout=10)
    assert (span.name, span.trace_id, span.parent_id) == ("tools/call escaped", AGENT_TRACE, AGENT_SPAN)
    assert got["params"]["_meta"] == {"traceparent": f"00-{AGENT_TRACE}-{span.span_id}-01"}
    assert tracing.exporter.exported == 1


def test_attributes_keep_their_types_through_the_encoders_cache():
    """True, 1 and 1.0 are equal in Python (one cache key would do for all three) but are a bool, an
    int and a double in OTLP; a string and a structure are strings. Decoded with opentelemetry-proto."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    from chaosproxy.telemetry.otlp import Encoder
    from chaosproxy.telemetry.tracing import SpanData

    encoder = Encoder({"service.name": "types"}, "1")
    spans = []
    for number in range(2):  # the second time from the cache
        span = SpanData("typed", 1, bytes(range(1, 17)), bytes(range(1, 9)), b"", "", 1, {
            "flag": True, "count": 1, "ratio": 1.0, "text": "1", f"key{number}": [1]})
        span.end_ns = 2
        spans.append(span.encoded(encoder))
    export = ExportTraceServiceRequest.FromString(encoder.request(spans))
    decoded = [{kv.key: (kv.value.WhichOneof("value"), getattr(kv.value, kv.value.WhichOneof("value")))
                for kv in span.attributes} for span in export.resource_spans[0].scope_spans[0].spans]
    for number, attributes in enumerate(decoded):
        assert attributes == {"flag": ("bool_value", True), "count": ("int_value", 1),
                              "ratio": ("double_value", 1.0), "text": ("string_value", "1"),
                              f"key{number}": ("string_value", "[1]")}
