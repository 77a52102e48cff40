"""What an agent names reaches spans bounded: a 1 MiB tool name, method or request id is cut (ending in
`…`) before it names a span, keys a cache or goes out over OTLP; every other string attribute is cut to
the OpenTelemetry attribute value length limit (OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT, else
OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT, else the proxy's default). The traffic itself goes as the agent sent it."""

from __future__ import annotations

import json
from typing import Any

import pytest

from chaosproxy.telemetry.otlp import DEFAULT_VALUE_LIMIT, Encoder
from chaosproxy.telemetry.tracing import MAX_HEADS_BYTES, MAX_NAME, OtlpTracing
from tests.helpers.framing_support import RawClient
from tests.helpers.otlp import Receiver, Span
from tests.telemetry.test_otel import receiver  # noqa: F401  (a fixture)
from tests.telemetry.test_otel_hostile import recording_upstream

MIB = 1 << 20
FIRES = {"rules": [{"name": "slow", "match": {"method": "*"}, "fault": {"type": "latency", "delay_ms": 1}}]}


def call(method: str, name: str, rpc_id: str) -> bytes:
    body = json.dumps({"jsonrpc": "2.0", "id": rpc_id, "method": method,
                       "params": {"name": name, "arguments": {}}}).encode()
    return b"POST /mcp HTTP/1.1\r\nHost: agent\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%b" % (
        len(body), body)


def traced(make_proxy: Any, scripted: Any, receiver: Receiver, requests: list[tuple[bytes, bytes]],  # noqa: F811
           **environ: str) -> tuple[Any, OtlpTracing]:
    """A proxy whose one rule fires on every call (so spans carry its fault's event too), exporting to `receiver`."""
    proxy = make_proxy(FIRES, to=scripted(recording_upstream(requests)).url)
    proxy.engine.tracing = tracing = OtlpTracing(run_id="bounds", seed=1, environ={
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "50", **environ})
    return proxy, tracing


def relay(proxy: Any, *requests: bytes) -> None:
    with RawClient(proxy.url, timeout=20) as client:
        for request in requests:
            client.send(request)
            assert client.response("POST")[0] == 200


def strings(span: Span) -> list[str]:
    """Every string a span carries: its name, its attributes' and its events' values."""
    values = [span.name, *span.attributes.values(), *(value for _, attributes in span.events
                                                      for value in attributes.values())]
    return [value for value in values if isinstance(value, str)]


def test_a_hostile_tool_name_is_cut_in_every_span(make_proxy, scripted, receiver):  # noqa: F811
    requests: list[tuple[bytes, bytes]] = []
    proxy, tracing = traced(make_proxy, scripted, receiver, requests)
    names = [f"{i}{'t' * MIB}" for i in range(3)]
    relay(proxy, *(call("tools/call", name, "i" * MIB) for name in names), call("m" * MIB, "x", "1"))
    cached = sum(len(head) for head in tracing._heads.values())
    tracing.shutdown()
    assert [json.loads(body)["params"]["name"] for _, body in requests[:3]] == names  # sent as they came
    spans = receiver.wait_for(lambda spans: len(spans) >= 8, timeout=20)  # 4 calls, each with its fault's span
    tools = sorted((span for span in spans if span.name.startswith("tools/call ")), key=lambda span: span.name)
    assert [span.attributes["gen_ai.tool.name"] for span in tools] == [
        name[:MAX_NAME - 1] + "…" for name in names]
    assert [span.name for span in tools] == [f"tools/call {name[:MAX_NAME - 1]}…" for name in names]
    assert all(span.attributes["jsonrpc.request.id"] == "i" * (MAX_NAME - 1) + "…" for span in tools)
    [other] = [span for span in spans if span.attributes.get("mcp.method.name", "").startswith("m")]
    assert other.name == "m" * (MAX_NAME - 1) + "…"
    for span in spans:
        assert all(len(value) <= DEFAULT_VALUE_LIMIT for value in strings(span)), span.name[:80]
        for _, attributes in span.events:  # the fault's log fields: the agent's names cut as the span's
            assert len(attributes.get("tool", "")) <= MAX_NAME and len(attributes.get("method", "")) <= MAX_NAME
    assert cached < 16 << 10, cached  # the span heads kept for reuse hold the cut names, not 3 MiB of them


@pytest.mark.parametrize("variable", ["OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT", "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT"])
def test_the_attribute_value_length_limit_is_honoured(make_proxy, scripted, receiver, variable):  # noqa: F811
    requests: list[tuple[bytes, bytes]] = []
    proxy, tracing = traced(make_proxy, scripted, receiver, requests, **{variable: "40"})
    relay(proxy, call("tools/call", "search-" + "s" * 100, "1"))
    tracing.shutdown()
    spans = receiver.wait_for(lambda spans: len(spans) >= 2, timeout=20)
    [span] = [span for span in spans if span.name.startswith("tools/call ")]
    assert span.attributes["gen_ai.tool.name"] == "search-" + "s" * 32 + "…"  # 40 characters
    assert all(len(value) <= 40 for value in strings(span) if value is not span.name)
    assert any(value.endswith("…") for _, attributes in span.events for value in attributes.values()
               if isinstance(value, str))  # the fault's effect and parameters, as JSON text, cut too


def test_the_span_heads_kept_for_reuse_stay_within_their_bytes(make_proxy, scripted, receiver):  # noqa: F811
    """Each path names a span head of its own (its URL): 420 paths of 7 KB (the request line's limit is 8 KiB),
    past what the cache may hold."""
    requests: list[tuple[bytes, bytes]] = []
    proxy, tracing = traced(make_proxy, scripted, receiver, requests)
    with RawClient(proxy.url, timeout=20) as client:
        for i in range(420):
            client.send(b"GET /%d/%b HTTP/1.1\r\nHost: agent\r\n\r\n" % (i, b"p" * 7_000))
            assert client.response("GET")[0] == 200
            held = sum(len(head) + sum(len(part) for part in key if isinstance(part, str))
                       for key, head in tracing._heads.items())
            assert held <= MAX_HEADS_BYTES + (64 << 10), (i, held)
    tracing.shutdown()


def test_the_attribute_cache_keeps_no_value_longer_than_it_sends() -> None:
    """Values that differ each time (an upstream's error code of a megabyte, say) key the exporter's cache:
    they are cut first, so what it holds is bounded by the limit, not by what the upstream sent."""
    encoder = Encoder({"service.name": "chaosproxy"}, "test", value_limit=64)
    for n in range(20):
        encoder.attributes({"rpc.response.status_code": f"{n:02d}-" + "9" * MIB})
    held = [value for _, value, _ in encoder._cache]
    assert len(held) == 20 and all(len(value) <= 64 for value in held)
