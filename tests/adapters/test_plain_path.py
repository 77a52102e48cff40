"""The plain path (`HttpProxy.relay_plain`) on real sockets: a request no rule could act on that finds an
idle pooled connection goes upstream as written and its response comes back as written, and whatever
the exchange then meets is handed to the general path (`PlainRelay.promote`). Each test first makes a
request that leaves a pooled connection behind, so the next one takes the plain path."""

from __future__ import annotations

import asyncio
import http.client
import time

import orjson
import yaml

from chaosproxy.adapters.http import HttpProxy
from chaosproxy.engine.scenario import parse_scenario
from chaosproxy.telemetry.tracing import OtlpTracing
from tests.helpers.framing_support import RawClient, read_request
from tests.helpers.otlp import Receiver
from tests.helpers.support import call_lines
from tests.telemetry.test_otel import AGENT_SPAN, AGENT_TRACE, receiver  # noqa: F401

OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
# a head to rewrite
HOP = b"HTTP/1.1 200 OK\r\nConnection: keep-alive, X-Hop\r\nX-Hop: 1\r\nContent-Length: 2\r\n\r\nok"
CALL = {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "search", "arguments": {}}}


def get(path: str, *extra: str) -> bytes:
    return ("\r\n".join([f"GET {path} HTTP/1.1", "Host: agent", *extra]) + "\r\n\r\n").encode()


def upstream_script(holder: dict[str, str]):
    async def script(reader, writer):
        while True:
            head, _ = await read_request(reader)
            path = head.split(b" ")[1]
            if path == b"/hop":
                writer.write(b"HTTP/1.1 200 OK\r\nKeep-Alive: timeout=5\r\nConnection: keep-alive, X-Hop\r\n"
                             b"X-Hop: 1\r\nContent-Length: 2\r\nX-End: 1\r\n\r\nok")
            elif path == b"/twice":  # a second response nobody asked for, in the same piece
                writer.write(OK + b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nstray")
            elif path.startswith(b"/say-"):
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%b" % (len(path) - 5, path[5:]))
            elif path == b"/early":
                writer.write(b"HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\n" + OK)
            elif path == b"/sse":
                endpoint = f"event: endpoint\ndata: {holder['url']}/messages/?session_id=ab\n\n".encode()
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
                             b"\r\n%x\r\n%b\r\n0\r\n\r\n" % (len(endpoint), endpoint))
            elif path == b"/slow":
                await asyncio.sleep(30)
            elif path == b"/cut":  # half the body, then the connection goes
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhalf!")
                await writer.drain()
                return
            else:
                writer.write(OK)
            await writer.drain()
    return script


def start(make_proxy, scripted, **options):
    holder: dict[str, str] = {}
    upstream = scripted(upstream_script(holder))
    holder["url"] = upstream.url
    return make_proxy(to=upstream.url, **options), upstream


def warm(client: RawClient) -> None:
    client.send(get("/warm"))
    assert client.response()[:3:2] == (200, b"ok")


def read_until(client: RawClient, end: bytes, timeout: float = 5) -> bytes:
    data, deadline = b"", time.monotonic() + timeout
    while not data.endswith(end) and time.monotonic() < deadline:
        data += client.sock.recv(4096)
    return data


def test_a_response_head_that_must_change_is_rewritten(make_proxy, scripted):
    proxy, _ = start(make_proxy, scripted)
    with RawClient(proxy.url) as client:
        warm(client)
        client.send(get("/hop"))
        status, headers, body = client.response()
        assert (status, body, headers["X-End"]) == (200, b"ok", "1")
        assert not {"Keep-Alive", "Connection", "X-Hop"} & set(headers)
        warm(client)  # in step after it


def test_a_second_response_nobody_asked_for_never_reaches_the_agent(make_proxy, scripted):
    """The agent would take it for the answer to its next request. Sent in the piece that brought the
    answer (relayed as it came), it cuts that answer off with it: the call is an upstream error."""
    proxy, _ = start(make_proxy, scripted)
    with RawClient(proxy.url) as client:
        warm(client)
        client.send(get("/twice"))
        try:
            answer = client.response()
        except (ConnectionError, http.client.HTTPException):
            answer = None
        if answer is not None:  # the extra response came in a piece of its own
            assert answer[:3:2] == (200, b"ok")
            client.send(get("/say-next"))
            assert client.response()[2] == b"next"
    with RawClient(proxy.url) as client:
        client.send(get("/say-after"))
        assert client.response()[2] == b"after"
    twice = [call for call in call_lines(proxy, 3, timeout=5) if call["path"] == "/twice"]
    assert [call["outcome"] for call in twice] == ["ok" if answer else "upstream_error"]


def test_an_informational_response_is_relayed_before_the_final_one(make_proxy, scripted):
    proxy, _ = start(make_proxy, scripted)
    with RawClient(proxy.url) as client:
        warm(client)
        client.send(get("/early"))
        raw = read_until(client, b"\r\n\r\nok")
    assert raw.startswith(b"HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\nHTTP/1.1 200 OK\r\n")
    assert raw.endswith(b"\r\n\r\nok")


def test_a_legacy_endpoint_event_still_points_back_through_the_proxy(make_proxy, scripted):
    proxy, upstream = start(make_proxy, scripted)
    with RawClient(proxy.url) as client:
        warm(client)
        client.send(get("/sse", "Accept: text/event-stream"))
        _, _, body = client.response()
    assert b"data: /messages/?session_id=ab" in body and upstream.url.encode() not in body


def test_a_client_that_leaves_before_the_answer_gets_its_call_line(make_proxy, scripted):
    proxy, _ = start(make_proxy, scripted)
    client = RawClient(proxy.url)
    warm(client)
    client.send(get("/slow"))
    time.sleep(0.2)
    client.close()
    assert [call["outcome"] for call in call_lines(proxy, 2, timeout=5)] == ["ok", "client_disconnected"]


def test_call_lines_of_the_plain_path_name_session_path_and_json_rpc_fields(make_proxy, scripted):
    proxy, _ = start(make_proxy, scripted, log_batch_s=60.0)
    payload = orjson.dumps(CALL)
    with RawClient(proxy.url) as client:
        warm(client)
        client.send(b"POST /a%%20b?x=1 HTTP/1.1\r\nHost: a\r\nMcp-Session-Id: s-1\r\nContent-Length: %d\r\n\r\n%b"
                    % (len(payload), payload))
        assert client.response()[0] == 200
    proxy.log.flush()
    _, call = proxy.events("call")
    assert (call["path"], call["session"], call["http_method"], call["status"], call["bytes_out"]) == \
        ("/a b", "s-1", "POST", 200, 2)
    assert (call["method"], call["tool"], call["rpc_id"], call["route"]) == ("tools/call", "search", 7, "default")


def test_an_upstream_that_breaks_off_mid_body_cuts_the_agent_off(make_proxy, scripted):
    proxy, _ = start(make_proxy, scripted)
    with RawClient(proxy.url) as client:
        warm(client)
        client.send(get("/cut"))
        raw = read_until(client, b"half!")
        assert raw.endswith(b"\r\n\r\nhalf!") and client.sock.recv(100) == b""  # then the end, not 5 more bytes
    cut = call_lines(proxy, 2, timeout=5)[1]
    assert (cut["status"], cut["outcome"], cut["bytes_out"]) == (200, "upstream_error", 5)


def test_a_rule_that_could_act_still_gets_the_request(make_proxy, scripted):
    holder: dict[str, str] = {}
    upstream = scripted(upstream_script(holder))
    holder["url"] = upstream.url
    proxy = make_proxy({"rules": [{"name": "admin-down", "match": {"path": "/admin/*"},
                                   "fault": {"type": "http_error", "status": 503}}]}, to=upstream.url)
    with RawClient(proxy.url) as client:
        warm(client)  # no rule could act on it: plain
        client.send(get("/admin/x"))
        assert client.response()[0] == 503
        warm(client)
    assert [(call["path"], call["faults"]) for call in proxy.events("call")] == \
        [("/warm", []), ("/admin/x", ["admin-down"]), ("/warm", [])]


def test_a_traced_call_takes_the_plain_path_with_the_proxy_context_in_head_and_meta(
        make_proxy, scripted, receiver: Receiver, monkeypatch):  # noqa: F811
    """Tracing on: the span opens on the plain path, under the agent's context (its traceparent header);
    the proxy's context replaces it in the header and joins params._meta (the rest of _meta kept), and
    Content-Length follows the longer body."""
    got: list[tuple[bytes, bytes]] = []

    async def script(reader, writer):
        while True:
            got.append(await read_request(reader))
            hop = got[-1][0].startswith(b"GET /hop ")  # a response head to rewrite: promoted
            writer.write(HOP if hop else OK)
            await writer.drain()

    taken: list[bool] = []
    relay_plain = HttpProxy.relay_plain

    def spied(*args):
        taken.append(bool(found := relay_plain(*args)))
        return found

    monkeypatch.setattr(HttpProxy, "relay_plain", spied)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
    proxy = make_proxy(to=scripted(script).url)
    tracing = proxy.engine.tracing = OtlpTracing(run_id="plain", seed=3)
    agent = f"00-{AGENT_TRACE}-{AGENT_SPAN}-01"
    payload = orjson.dumps({**CALL, "params": {**CALL["params"], "_meta": {"progressToken": 5}}})
    with RawClient(proxy.url) as client:
        warm(client)
        client.send(b"POST /mcp HTTP/1.1\r\nHost: a\r\ntraceparent: %b\r\nContent-Length: %d\r\n\r\n%b"
                    % (agent.encode(), len(payload), payload))
        assert client.response()[:3:2] == (200, b"ok")
        client.send(get("/hop"))
        assert client.response()[:3:2] == (200, b"ok")
    tracing.shutdown()
    receiver.wait_for(lambda spans: len(spans) == 3, timeout=10)
    assert taken == [False, True, True]  # the first found no pooled connection: the general path took it
    warmed, hop = sorted(receiver.named("GET"), key=lambda span: span.start_ns)
    assert hop.attributes["url.full"].endswith("/hop") and hop.attributes["http.response.status_code"] == 200
    assert got[-1][0].count(hop.span_id.encode()) == 1 and warmed.span_id.encode() in got[0][0]
    [span] = receiver.named("tools/call search")
    assert (span.trace_id, span.parent_id, span.kind) == (AGENT_TRACE, AGENT_SPAN, "CLIENT")
    assert (span.attributes["gen_ai.tool.name"], span.attributes["jsonrpc.request.id"]) == ("search", "7")
    assert span.attributes["http.response.status_code"] == 200
    head, body = got[1]
    ours = f"00-{AGENT_TRACE}-{span.span_id}-01"
    assert orjson.loads(body)["params"]["_meta"] == {"progressToken": 5, "traceparent": ours}
    lines = head.lower().split(b"\r\n")
    assert [line for line in lines if line.startswith(b"traceparent:")] == [b"traceparent: " + ours.encode()]
    assert b"content-length: %d" % len(body) in lines and lines[0] == b"post /mcp http/1.1"


def test_rule_checks_kept_per_request_head_follow_the_headers_rules_read_and_a_new_scenario(
        make_proxy, scripted, server_loop):
    """relay_plain asks the engine once for requests alike: a header a rule reads makes them differ,
    and a scenario put in force (a swap, a PATCH) is asked again."""
    canary = {"rules": [{"name": "canary", "match": {"header": {"X-Canary": "1"}},
                         "fault": {"type": "http_error", "status": 503}}]}
    proxy, _ = start(make_proxy, scripted, scenario=canary)
    with RawClient(proxy.url) as client:
        warm(client)
        for _ in range(2):  # the second of each on a warm connection, its head's answer kept
            client.send(get("/warm", "x-canary: 1"))
            assert client.response()[0] == 503
            warm(client)

        async def swap() -> None:
            proxy.engine.load(parse_scenario(yaml.safe_dump({"rules": [
                {"name": "down", "match": {"path": "/warm"}, "fault": {"type": "http_error", "status": 502}}]})))

        server_loop.run(swap())
        client.send(get("/warm"))
        assert client.response()[0] == 502
    assert [call["faults"] for call in proxy.events("call")] == [[], ["canary"], [], ["canary"], [], ["down"]]


def test_a_call_the_sampler_leaves_out_goes_on_as_written_and_one_it_keeps_is_traced(
        make_proxy, scripted, receiver: Receiver, monkeypatch):  # noqa: F811
    """Sampled 1 in 2, calls that can name no parent are decided on the plain path before anything is
    made for them: those left out reach the upstream as the agent wrote them, those kept carry the
    proxy's context and have their span; a call whose header names a kept parent is always traced."""
    got: list[tuple[bytes, bytes]] = []

    async def script(reader, writer):
        while True:
            got.append(await read_request(reader))
            writer.write(OK)
            await writer.drain()

    for name, value in (("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint),
                        ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"), ("OTEL_TRACES_SAMPLER_ARG", "0.5")):
        monkeypatch.setenv(name, value)
    proxy = make_proxy(to=scripted(script).url)
    tracing = proxy.engine.tracing = OtlpTracing(run_id="sampled", seed=3)
    payload = orjson.dumps(CALL)
    post = b"POST /mcp HTTP/1.1\r\nHost: a\r\n%bContent-Length: %d\r\n\r\n%b"
    with RawClient(proxy.url) as client:
        warm(client)
        for _ in range(40):
            client.send(post % (b"", len(payload), payload))
            assert client.response()[0] == 200
        client.send(post % (b"traceparent: 00-%b-%b-01\r\n" % (AGENT_TRACE.encode(), AGENT_SPAN.encode()),
                            len(payload), payload))
        assert client.response()[0] == 200
    tracing.shutdown()
    kept = [head for head, _ in got[1:41] if b"traceparent" in head]
    assert 5 <= len(kept) <= 35  # 1 in 2 of 40 (outside this: one chance in a million)
    assert all(body == payload and b"Content-Length: %d" % len(payload) in head
               for head, body in got[1:41] if b"traceparent" not in head)
    spans = receiver.wait_for(lambda spans: sum(span.name == "tools/call search" for span in spans) == len(kept) + 1,
                              timeout=10)
    roots = {span.span_id for span in spans if span.name == "tools/call search" and span.parent_id == ""}
    assert roots == {head.split(b"traceparent: ")[1][36:52].decode() for head in kept}
    [child] = [span for span in spans if span.parent_id == AGENT_SPAN]
    assert child.trace_id == AGENT_TRACE and child.span_id.encode() in got[-1][0]


def test_under_routes_the_plain_path_sends_each_request_to_its_route_as_written(make_proxy, scripted):
    """Two routes, one with a base path: after the first request on each (which opens the pooled
    connection), requests go as written but for the request line (prefix off, base path on), Host and
    the keep-alive line; a promoted call (a head to rewrite) still reaches its route's upstream."""
    got: dict[str, list[bytes]] = {"a": [], "b": []}

    def script(name: str):
        async def serve(reader, writer):
            while True:
                head, body = await read_request(reader)
                got[name].append(head + body)
                writer.write(HOP if b" /hop" in head else OK)
                await writer.drain()
        return serve

    a, b = scripted(script("a")), scripted(script("b"))
    proxy = make_proxy({"routes": {"/a": a.url, "/b": b.url + "/base"}})
    sent = b"POST %b?q=1 HTTP/1.1\r\nx-first: 1\r\nConnection: keep-alive\r\nhost: agent\r\ncontent-length: 2\r\n\r\nhi"
    with RawClient(proxy.url) as client:
        for path in (b"/a/x", b"/b/y", b"/a/x", b"/b/y", b"/b/hop", b"/b/y"):
            client.send(sent % path)
            assert client.response()[:3:2] == (200, b"ok")
    host = {name: upstream.url.removeprefix("http://").encode() for name, upstream in (("a", a), ("b", b))}
    assert got["a"][1] == b"POST /x?q=1 HTTP/1.1\r\nx-first: 1\r\nHost: %b\r\ncontent-length: 2\r\n\r\nhi" % host["a"]
    assert got["b"][1] == got["b"][3] == \
        b"POST /base/y?q=1 HTTP/1.1\r\nx-first: 1\r\nHost: %b\r\ncontent-length: 2\r\n\r\nhi" % host["b"]
    assert got["b"][2].startswith(b"POST /base/hop?q=1 HTTP/1.1\r\n")
    calls = call_lines(proxy, 6, timeout=5)
    assert [(call["route"], call["path"], call["status"]) for call in calls] == [
        ("a", "/a/x", 200), ("b", "/b/y", 200), ("a", "/a/x", 200), ("b", "/b/y", 200), ("b", "/b/hop", 200),
        ("b", "/b/y", 200)]
