"""What an agent puts in its trace context is hostile: a `tracestate` that would split a header line, or
that is no Latin-1, never reaches the upstream as written and never costs the agent its answer, on
every way a call goes through (relayed as written, passed through, inspected); and a failure inside
tracing lets the call go on untraced. On real sockets, spans exported to a real OTLP receiver."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any, NoReturn

import pytest

from chaosproxy.adapters.http import traced
from chaosproxy.telemetry.tracing import OtlpTracing, valid_tracestate
from tests.helpers.framing_support import RawClient, read_request
from tests.helpers.otlp import Receiver
from tests.telemetry.test_otel import AGENT_SPAN, AGENT_TRACE, receiver  # noqa: F401

AGENT_PARENT = f"00-{AGENT_TRACE}-{AGENT_SPAN}-01"
INSPECTING = {"rules": [{"name": "never", "match": {"tool": "never-called"}, "fault": {"type": "latency",
                                                                                     "delay_ms": 1}}]}
PATHS = ["passthrough", "plain", "inspected"]  # (the plain path: a second call, on a pooled connection)
ANSWER = b'{"ok":true}'


def recording_upstream(requests: list[tuple[bytes, bytes]]) -> Any:
    """An upstream keeping each request (head and body, raw), answering 200 on a kept-alive connection."""
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            requests.append(await read_request(reader))
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%b"
                         % (len(ANSWER), ANSWER))
            await writer.drain()
    return script


def traced_call(meta: dict[str, str], *headers: bytes) -> bytes:
    """A tools/call with `_meta` and `headers`, whole, X-First before Host: the plain path keeps the
    agent's order, the others put Host first."""
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                       "params": {"name": "search", "arguments": {}, "_meta": meta}}).encode()
    return (b"POST /mcp HTTP/1.1\r\nX-First: 1\r\nHost: agent\r\nContent-Type: application/json\r\n%b"
            b"Content-Length: %d\r\n\r\n%b" % (b"".join(h + b"\r\n" for h in headers), len(body), body))


def header_lines(head: bytes) -> list[tuple[bytes, bytes]]:
    return [(name.lower(), value.strip()) for name, _, value in
            (line.partition(b":") for line in head.split(b"\r\n")[1:-2])]


def exchange(make_proxy: Any, scripted: Any, receiver: Receiver, path: str,  # noqa: F811
             request: bytes) -> tuple[int, bytes, bytes, dict[str, Any], OtlpTracing]:
    """`request` through a traced proxy on `path`: the answer (status, body), and the request's head and
    body as the upstream got them."""
    requests: list[tuple[bytes, bytes]] = []
    upstream = scripted(recording_upstream(requests))
    proxy = make_proxy(INSPECTING if path == "inspected" else "rules: []", to=upstream.url)
    proxy.engine.tracing = tracing = OtlpTracing(run_id="hostile", seed=1, environ={
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "50"})
    with RawClient(proxy.url, timeout=5) as client:
        if path == "plain":  # a first call leaves a pooled connection behind: the next takes the plain path
            client.send(traced_call({"traceparent": AGENT_PARENT}))
            assert client.response("POST")[0] == 200
        client.send(request)
        status, _, body = client.response("POST")
    tracing.shutdown()
    head, sent = requests[-1]
    first = header_lines(head)[0]
    assert first == ((b"x-first", b"1") if path == "plain" else (b"host", upstream.url[7:].encode())), head
    return status, body, head, json.loads(sent), tracing


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("tracestate", ["a=b\r\nX-Injected-By-Agent: yes", "a=€", "a=b,X=upper", "a=b\x00"])
def test_a_hostile_tracestate_in_meta_is_dropped_and_the_call_answered(make_proxy: Any, scripted: Any,
                                                                       receiver: Receiver,  # noqa: F811
                                                                       path: str, tracestate: str):
    """A line break would put a header of the agent's making upstream (or smuggle a request); a character
    beyond Latin-1 could not be written at all and left the call unanswered: both are dropped, the rest goes."""
    status, body, head, sent, _ = exchange(make_proxy, scripted, receiver, path,
                                           traced_call({"traceparent": AGENT_PARENT, "tracestate": tracestate}))
    assert (status, body) == (200, ANSWER)
    names = [name for name, _ in header_lines(head)]
    assert b"x-injected-by-agent" not in names and b"tracestate" not in names, head
    assert names.count(b"traceparent") == 1
    assert "tracestate" not in sent["params"]["_meta"]
    [span] = receiver.wait_for(lambda spans: any(s.name == "tools/call search" for s in spans), timeout=10)[-1:]
    assert (span.trace_id, span.parent_id) == (AGENT_TRACE, AGENT_SPAN)
    assert sent["params"]["_meta"]["traceparent"] == f"00-{AGENT_TRACE}-{span.span_id}-01"


@pytest.mark.parametrize("path", PATHS)
def test_a_tracestate_header_is_combined_and_checked_too(make_proxy: Any, scripted: Any,
                                                         receiver: Receiver, path: str):  # noqa: F811
    """The header carrier: tracestate lines are combined (W3C), and what the proxy writes is valid by the
    grammar, its optional spaces and empty members gone. One with a byte beyond ASCII is not taken: the
    proxy writes none, in `_meta` or in a header, and the agent's own line stays behind (the proxy's context
    replaces the agent's whole)."""
    parent = b"traceparent: " + AGENT_PARENT.encode()
    status, _, head, sent, _ = exchange(make_proxy, scripted, receiver, path, traced_call(
        {}, parent, b"tracestate: rojo=00f067aa0ba902b7 , ,", b"tracestate: congo=t61"))
    assert status == 200
    combined = "rojo=00f067aa0ba902b7,congo=t61"
    assert [value for name, value in header_lines(head) if name == b"tracestate"] == [combined.encode()]
    assert sent["params"]["_meta"]["tracestate"] == combined
    status, _, head, sent, _ = exchange(make_proxy, scripted, receiver, path, traced_call(
        {}, parent, b"tracestate: rojo=1,congo=\xe2\x82\xac"))
    assert status == 200
    assert not [line for line in head.split(b"\r\n") if line.lower().startswith(b"tracestate")], head
    assert "tracestate" not in sent["params"]["_meta"]


@pytest.mark.parametrize(("tracestate", "forwarded"), [
    ("rojo=00f067aa0ba902b7,congo=t61rcWkgMzE", "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"),
    ("\t a=1 ,, b@sys= x y\t", "a=1,b@sys= x y"),  # spaces around members go; a value's inner and leading stay
    (",".join(f"k{i}=v" for i in range(32)), ",".join(f"k{i}=v" for i in range(32))),
    (",".join(f"k{i}=v" for i in range(33)), ""),  # 33 members
    ("a=" + "v" * 256, "a=" + "v" * 256), ("a=" + "v" * 257, ""),  # a value of 256 characters at most
    ("k" * 256 + "=v", "k" * 256 + "=v"), ("k" * 257 + "=v", ""),  # so is a key
    ("a=" + "v" * 253 + "," + "b=" + "w" * 253, "a=" + "v" * 253 + ",b=" + "w" * 253),  # 511 characters
    (" " * 500 + "a=" + "v" * 11, ""),  # 513, however little of it is members
    ("Upper=v", ""), ("a=b=c", ""), ("a=", ""), ("=v", ""), ("a=v ,b", ""), ("a=\x7f", ""), ("a=é", ""),
    ("", ""), (None, ""), (["a=b"], ""),
])
def test_tracestate_follows_the_w3c_grammar(tracestate: Any, forwarded: str):
    assert valid_tracestate(tracestate) == forwarded


def fail(*_: Any, **__: Any) -> NoReturn:
    raise RuntimeError("a bug")


@pytest.mark.parametrize("path", PATHS)
def test_a_failure_inside_tracing_lets_the_call_go_on_untraced(make_proxy: Any, scripted: Any,
                                                               receiver: Receiver,  # noqa: F811
                                                               monkeypatch: pytest.MonkeyPatch,
                                                               caplog: pytest.LogCaptureFixture, path: str):
    """Fail open: a span that cannot be opened is left out, the call relayed as the agent sent it (its own
    context in `_meta`, no trace header of the proxy's) and the failure logged; no 400, 502 or silence."""
    monkeypatch.setattr(OtlpTracing, "_mcp_head", fail)
    with caplog.at_level(logging.ERROR, logger="chaosproxy"):
        status, body, head, sent, tracing = exchange(make_proxy, scripted, receiver, path, traced_call(
            {"traceparent": AGENT_PARENT, "tracestate": "rojo=1"}))
    assert (status, body) == (200, ANSWER)
    assert b"traceparent" not in [name for name, _ in header_lines(head)], head
    assert sent["params"]["_meta"] == {"traceparent": AGENT_PARENT, "tracestate": "rojo=1"}
    assert "could not be opened" in caplog.text and "RuntimeError: a bug" in caplog.text
    assert tracing.exporter.exported == 0


def test_an_exception_in_the_body_callback_is_answered(make_proxy: Any, scripted: Any,
                                                       receiver: Receiver,  # noqa: F811
                                                       monkeypatch: pytest.MonkeyPatch,
                                                       caplog: pytest.LogCaptureFixture):
    """The traced pass-through opens the span once the body is in, in a callback of the HTTP parser,
    where an exception was taken for bad framing and the call never answered: it is answered 502 and logged."""
    monkeypatch.setattr(traced, "start_span", fail)
    requests: list[tuple[bytes, bytes]] = []
    proxy = make_proxy("rules: []", to=scripted(recording_upstream(requests)).url)
    proxy.engine.tracing = tracing = OtlpTracing(run_id="hostile", seed=1, environ={
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint})
    with caplog.at_level(logging.ERROR, logger="chaosproxy"), RawClient(proxy.url, timeout=5) as client:
        client.send(traced_call({"traceparent": AGENT_PARENT}))
        status, headers, _ = client.response("POST")
    tracing.shutdown()
    assert (status, headers["X-Chaosproxy-Error"]) == (502, "internal")
    assert "RuntimeError: a bug" in caplog.text and requests == []
