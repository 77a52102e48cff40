"""HTTP/1.1 framing through `chaosproxy run` on real sockets: pipelining, chunked both ways, close-delimited
replies, HEAD, 100-continue, WebSocket, pooled connections the upstream closes, Content-Encoding, huge
SSE events, and requests a reverse proxy must refuse (the HTTP framing defects of issues 10 and 11)."""

from __future__ import annotations

import asyncio
import gzip
import json
import threading
import time
import zlib
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from chaosproxy.demo.serving import serve
from tests.helpers.framing_support import RawClient, read_request
from tests.helpers.support import call_lines, rule

CALL = {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "search", "arguments": {}}}
REPLY = {"jsonrpc": "2.0", "id": 7, "result": {"content": [{"type": "text", "text": "found"}]}}
LOST = rule("lost", {"type": "rpc_error", "code": -32603, "message": "reply lost", "phase": "response"})


def get(path: str, *extra: str) -> bytes:
    return ("\r\n".join([f"GET {path} HTTP/1.1", "Host: agent", *extra]) + "\r\n\r\n").encode()


def test_pipelined_requests_are_answered_in_order(make_proxy):
    proxy = make_proxy()
    with RawClient(proxy.url) as client:
        client.send(get("/echo/one") + b"POST /echo/two HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nabc"
                    + get("/echo/three"))
        answers = [client.response() for _ in range(3)]
    assert [headers["X-Echo-Path"] for _, headers, _ in answers] == ["/echo/one", "/echo/two", "/echo/three"]
    assert [body for _, _, body in answers] == [b"", b"abc", b""]


def test_chunked_request_with_extensions_and_trailers_reaches_upstream_whole(make_proxy):
    proxy = make_proxy()
    with RawClient(proxy.url) as client:
        client.send(b"POST /echo/chunked HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
                    b"5;name=value\r\nhello\r\n6\r\n world\r\n0\r\nX-Trailer: t\r\n\r\n")
        status, _, body = client.response()
        assert (status, body) == (200, b"hello world")
        client.send(get("/health"))  # the connection is still in step
        assert client.response()[2] == b"ok"


def test_chunked_json_rpc_request_is_inspected(make_proxy):
    proxy = make_proxy(rule("down", {"type": "http_error", "status": 503}, match={"tool": "search"}))
    payload = orjson.dumps(CALL)
    with RawClient(proxy.url) as client:
        client.send(b"POST /echo/rpc HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\n"
                    b"Transfer-Encoding: chunked\r\n\r\n" + b"%x\r\n%b\r\n0\r\n\r\n" % (len(payload), payload))
        assert client.response()[0] == 503
    [call] = proxy.events("call")
    assert (call["tool"], call["faults"]) == ("search", ["down"])


def test_chunked_response_with_extensions_and_trailers(make_proxy, scripted):
    async def script(reader, writer):
        while True:
            await read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: X-Sum\r\n\r\n"
                         b"3;ext=1\r\nabc\r\n2\r\nde\r\n0\r\nX-Sum: 5\r\n\r\n")
            await writer.drain()

    proxy = make_proxy(to=scripted(script).url)
    with RawClient(proxy.url) as client:
        client.send(get("/x"))
        status, headers, body = client.response()
        assert (status, body, headers["Transfer-Encoding"]) == (200, b"abcde", "chunked")
        client.send(get("/x"))
        raw = b""
        while not raw.endswith(b"\r\n\r\n") or b"0\r\n" not in raw:
            raw += client.sock.recv(4096)
    assert raw.endswith(b"0\r\nX-Sum: 5\r\n\r\n")  # the trailer reaches the agent


def test_close_delimited_response_arrives_whole_and_the_agent_keeps_its_connection(make_proxy, scripted):
    async def script(reader, writer):
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\n" + b"x" * 100_000)
        await writer.drain()

    proxy = make_proxy(to=scripted(script).url)
    with RawClient(proxy.url) as client:
        for _ in range(2):
            client.send(get("/x"))
            status, _, body = client.response()
            assert (status, len(body)) == (200, 100_000)


def test_head_keeps_content_length_and_sends_no_body(make_proxy):
    proxy = make_proxy()
    with RawClient(proxy.url) as client:
        client.send(b"HEAD /big?bytes=1000 HTTP/1.1\r\nHost: a\r\n\r\n")
        status, headers, body = client.response("HEAD")
        assert (status, headers["Content-Length"], body) == (200, "1000", b"")
        client.send(get("/health"))
        assert client.response()[2] == b"ok"


@pytest.mark.parametrize("scenario", ["rules: []", rule("look", {"type": "http_error"}, match={"tool": "x"})],
                         ids=["streamed", "inspected"])
def test_expect_100_continue_is_answered(make_proxy, scenario):
    proxy = make_proxy(scenario)
    body = b"z" * (2 << 20)
    with RawClient(proxy.url) as client:
        client.send(b"PUT /echo/upload HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\n"
                    b"Content-Length: %d\r\n\r\n" % len(body))
        started = time.perf_counter()
        assert client.read_line().startswith(b"HTTP/1.1 100")
        assert time.perf_counter() - started < 0.5
        assert client.read_line() == b"\r\n"
        client.send(body)
        status, _, echoed = client.response()
    assert status == 200 and echoed == body


async def test_websocket_echo_through_the_proxy(make_proxy, server_loop):
    async def echo(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        async for message in ws:
            await ws.send_str("echo " + message.data)
        return ws

    app = web.Application()
    app.router.add_get("/ws", echo)
    runner, port = server_loop.run(serve(app))
    try:
        proxy = make_proxy(to=f"http://127.0.0.1:{port}")
        async with aiohttp.ClientSession() as client:
            async with client.ws_connect(proxy.url + "/ws", timeout=aiohttp.ClientWSTimeout(ws_receive=5)) as ws:
                for word in ("one", "two"):
                    await ws.send_str(word)
                    assert (await ws.receive_str()) == "echo " + word
        [call] = proxy.events("call")
        assert call["status"] == 101
    finally:
        server_loop.run(runner.cleanup())


UPGRADE = (b"GET /ws HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
           b"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n")
SWITCHED = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"
FLOOD = 64 << 20  # far more than the kernel's socket buffers and the proxy's high-water mark hold


async def _push(writer: asyncio.StreamWriter, seconds: float) -> int:
    """Write as much as the peer takes within `seconds` (bounded by FLOOD): the bytes it took."""
    piece, sent = b"x" * (256 << 10), 0
    deadline = time.monotonic() + seconds
    try:
        while sent < FLOOD and time.monotonic() < deadline:
            writer.write(piece)
            await asyncio.wait_for(writer.drain(), max(0.01, deadline - time.monotonic()))
            sent += len(piece)
    except TimeoutError:
        pass
    return sent


@pytest.mark.slow
def test_a_tunnel_holds_the_upstream_back_while_the_client_does_not_read(make_proxy, scripted):
    pushed: list[int] = []

    async def script(reader, writer):
        await reader.readuntil(b"\r\n\r\n")
        writer.write(SWITCHED)
        pushed.append(await _push(writer, 2.5))
        await reader.read()  # open until the client goes

    proxy = make_proxy(to=scripted(script).url)
    with RawClient(proxy.url) as client:
        client.send(UPGRADE)
        assert client.file.readline().startswith(b"HTTP/1.1 101")
        while client.file.readline() != b"\r\n":
            pass
        deadline = time.monotonic() + 10
        while not pushed and time.monotonic() < deadline:  # the client reads nothing meanwhile
            time.sleep(0.1)
        assert pushed and pushed[0] < FLOOD // 2  # held back: the proxy stopped reading the upstream
        received = 0
        while received < pushed[0]:  # and the tunnel goes on once the client reads
            data = client.sock.recv(1 << 20)
            assert data.strip(b"x") == b""
            received += len(data)


@pytest.mark.slow
def test_a_tunnel_holds_the_client_back_while_the_upstream_does_not_read(make_proxy, scripted):
    async def script(reader, writer):
        await reader.readuntil(b"\r\n\r\n")
        writer.write(SWITCHED)
        await asyncio.sleep(5)  # reads nothing
        while await reader.read(1 << 20):
            pass

    proxy = make_proxy(to=scripted(script).url)
    with RawClient(proxy.url) as client:
        client.send(UPGRADE)
        assert client.file.readline().startswith(b"HTTP/1.1 101")
        client.sock.settimeout(2.5)
        sent, piece = 0, b"y" * (256 << 10)
        with pytest.raises(TimeoutError):
            while sent < FLOOD:
                client.sock.sendall(piece)
                sent += len(piece)
        assert sent < FLOOD // 2  # held back: the proxy stopped reading the client


def test_upstream_closing_a_kept_alive_connection_between_requests(make_proxy, scripted):
    async def script(reader, writer):  # one request per connection, without saying Connection: close
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()

    upstream = scripted(script)
    proxy = make_proxy(to=upstream.url)
    with RawClient(proxy.url) as client:
        for _ in range(5):
            client.send(get("/x"))
            assert client.response()[:3:2] == (200, b"ok")
    assert upstream.connections >= 5


def _gzip_sse_script(events: list[bytes], interval: float):
    async def script(reader, writer):
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Encoding: gzip\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n")
        packer = zlib.compressobj(wbits=31)
        for event in events:
            piece = packer.compress(event) + packer.flush(zlib.Z_SYNC_FLUSH)
            writer.write(b"%x\r\n%b\r\n" % (len(piece), piece))
            await writer.drain()
            await asyncio.sleep(interval)
        piece = packer.flush()
        writer.write(b"%x\r\n%b\r\n0\r\n\r\n" % (len(piece), piece))
        await writer.drain()
    return script


def test_gzip_event_stream_is_decoded_and_inspected_event_by_event(make_proxy, scripted):
    events = [b"event: message\ndata: " + orjson.dumps({**REPLY, "id": n}) + b"\n\n" for n in range(5)]
    proxy = make_proxy(LOST, to=scripted(_gzip_sse_script(events, 0.3)).url)
    with RawClient(proxy.url) as client:
        client.send(b"POST /mcp HTTP/1.1\r\nHost: a\r\nAccept-Encoding: gzip\r\nContent-Length: %d\r\n\r\n%b"
                    % (len(orjson.dumps(CALL)), orjson.dumps(CALL)))
        started = time.perf_counter()
        status_line = client.read_line()
        while client.read_line() != b"\r\n":
            pass
        first = b""
        while b"data:" not in first:
            first += client.read_line()
        took = time.perf_counter() - started
    assert status_line.startswith(b"HTTP/1.1 200")
    assert took < 1.0  # the stream took 1.5 s: the first event was not held for its end
    assert b"reply lost" in client_events(proxy)


def client_events(proxy) -> bytes:
    return json.dumps(proxy.events("fault")).encode()


def test_gzip_json_rpc_reply_meets_message_rules(make_proxy, scripted):
    async def script(reader, writer):
        head, _ = await read_request(reader)
        body = orjson.dumps(REPLY)
        if b"accept-encoding: identity" not in head.lower():
            body = gzip.compress(body)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\n")
        else:
            writer.write(b"HTTP/1.1 200 OK\r\n")
        writer.write(b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%b" % (len(body), body))
        await writer.drain()

    proxy = make_proxy(LOST, to=scripted(script).url)
    with RawClient(proxy.url) as client:
        payload = orjson.dumps(CALL)
        client.send(b"POST /mcp HTTP/1.1\r\nHost: a\r\nAccept-Encoding: gzip\r\nContent-Type: application/json\r\n"
                    b"Content-Length: %d\r\n\r\n%b" % (len(payload), payload))
        status, headers, body = client.response()
    if headers.get("Content-Encoding") == "gzip":
        body = gzip.decompress(body)
    assert status == 200 and orjson.loads(body)["error"]["message"] == "reply lost"
    [call] = proxy.events("call")
    assert call["faults"] == ["lost"]  # the fault is on that request's call line


def test_gzip_reply_a_rule_cannot_read_is_a_logged_skip(make_proxy, scripted):
    async def script(reader, writer):  # ignores Accept-Encoding: identity, and uses an encoding chaosproxy lacks
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Encoding: compress\r\n"
                     b"Content-Length: 4\r\n\r\n\x1f\x9d\x90\x00")
        await writer.drain()

    proxy = make_proxy(LOST, to=scripted(script).url)
    with RawClient(proxy.url) as client:
        payload = orjson.dumps(CALL)
        client.send(b"POST /mcp HTTP/1.1\r\nHost: a\r\nContent-Length: %d\r\n\r\n%b" % (len(payload), payload))
        status, _, body = client.response()
    assert (status, body) == (200, b"\x1f\x9d\x90\x00")  # passed as it was
    [skip] = proxy.events("skip")
    assert "compress" in skip["reason"]


def test_a_16_mib_event_streams_in_linear_time(make_proxy, scripted):
    big = b"data: " + b"x" * (17 << 20) + b"\n\n"
    small = b"event: message\ndata: " + orjson.dumps(REPLY) + b"\n\n"

    async def script(reader, writer):
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n\r\n"
                     % (len(big) + len(small)))
        for start in range(0, len(big), 64 << 10):
            writer.write(big[start:start + (64 << 10)])
            await writer.drain()
        writer.write(small)
        await writer.drain()

    proxy = make_proxy(LOST, to=scripted(script).url)
    started = time.perf_counter()
    with RawClient(proxy.url, timeout=30) as client:
        payload = orjson.dumps(CALL)
        client.send(b"POST /mcp HTTP/1.1\r\nHost: a\r\nContent-Length: %d\r\n\r\n%b" % (len(payload), payload))
        status, _, body = client.response()
    took = time.perf_counter() - started
    assert status == 200 and body.startswith(big)  # over the limit: passed as it was
    assert b"reply lost" in body[len(big):]  # the next event is still inspected
    assert took < 8  # a quadratic splitter took 20+ s here


def test_a_rewritten_reply_never_keeps_a_stale_content_length(make_proxy, scripted):
    event = b"event: message\ndata: " + orjson.dumps(REPLY) + b"\n\n"

    async def script(reader, writer):
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n\r\n%b"
                     % (len(event), event))
        await writer.drain()

    proxy = make_proxy(LOST, to=scripted(script).url)
    with RawClient(proxy.url, timeout=5) as client:
        payload = orjson.dumps(CALL)
        client.send(b"POST /mcp HTTP/1.1\r\nHost: a\r\nContent-Length: %d\r\n\r\n%b" % (len(payload), payload))
        status, headers, body = client.response()
    assert status == 200 and headers.get("Content-Length") in (None, str(len(body)))
    assert orjson.loads(body.split(b"data: ")[1])["error"]["message"] == "reply lost"


async def test_truncate_by_fraction_does_not_hold_an_endless_stream_s_headers(make_proxy):
    proxy = make_proxy(rule("cut", {"type": "truncate", "fraction": 0.5}, match={"path": "/sse"}))
    async with aiohttp.ClientSession() as client:
        started = time.perf_counter()
        async with client.get(proxy.url + "/sse?n=1000&interval_ms=100",
                              timeout=aiohttp.ClientTimeout(total=10)) as response:
            assert response.status == 200
            assert time.perf_counter() - started < 1.0


def test_legacy_endpoint_is_rewritten_past_leading_comments(make_proxy, scripted):
    holder: dict[str, str] = {}

    async def script(reader, writer):
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n")
        endpoint = f"event: endpoint\ndata: {holder['url']}/messages/?session_id=ab\n\n".encode()
        for frame in (b": connected\n\n", endpoint):
            writer.write(b"%x\r\n%b\r\n" % (len(frame), frame))
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    upstream = scripted(script)
    holder["url"] = upstream.url
    proxy = make_proxy(to=upstream.url)
    with RawClient(proxy.url) as client:
        client.send(get("/sse", "Accept: text/event-stream"))
        _, _, body = client.response()
    assert b": connected\n\n" in body
    assert b"data: /messages/?session_id=ab" in body and upstream.url.encode() not in body


def test_a_request_upstream_failed_is_not_matched_to_a_later_reply_on_the_legacy_stream(make_proxy, scripted):
    """A POST upstream broke gets its 502 and is forgotten: a reply with its id arriving later on the legacy
    stream is not taken for its answer (here a rule on the failed call's tool would fire on it)."""
    late = b'{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"late"}]}}'
    answered = threading.Event()  # the agent has its 502: only then does the late reply come

    async def script(reader, writer):
        head, _ = await read_request(reader)
        if head.startswith(b"POST"):
            return  # closes without an answer: the proxy's 502
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: 999\r\n\r\n"
                     b"event: endpoint\ndata: /messages/?session_id=ab\n\n")
        await writer.drain()
        await asyncio.to_thread(answered.wait, 10)
        writer.write(b"event: message\ndata: " + late + b"\n\n")
        await writer.drain()
        await asyncio.sleep(5)  # the stream stays open; the test has read what it needs by then

    proxy = make_proxy(rule("lost", {"type": "rpc_error", "phase": "response", "message": "reply lost"},
                            match={"tool": "lookup"}), to=scripted(script).url)
    call = orjson.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "lookup"}})
    with RawClient(proxy.url) as stream, RawClient(proxy.url) as poster:
        stream.send(get("/sse", "Accept: text/event-stream"))
        head = [stream.read_line()]
        while head[-1] != b"\r\n":
            head.append(stream.read_line())
        assert head[0].startswith(b"HTTP/1.1 200") and b"Transfer-Encoding: chunked\r\n" in head  # length gone

        def events_until(end: bytes) -> bytes:
            body = b""
            while not body.endswith(end):
                body += stream.file.read(int(stream.read_line(), 16))
                stream.read_line()
            return body

        assert events_until(b"\n\n") == b"event: endpoint\ndata: /messages/?session_id=ab\n\n"
        poster.send(b"POST /messages/?session_id=ab HTTP/1.1\r\nHost: agent\r\nContent-Type: application/json\r\n"
                    b"Content-Length: %d\r\n\r\n%b" % (len(call), call))
        assert poster.response()[0] == 502
        answered.set()
        assert events_until(b"\n\n") == b"event: message\ndata: " + late + b"\n\n"  # as upstream sent it
    assert proxy.events("fault") == []


@pytest.mark.parametrize("request_line", [b"GET http://127.0.0.1:9/x HTTP/1.1", b"CONNECT example.com:443 HTTP/1.1"])
def test_forward_proxy_requests_get_a_clear_400(make_proxy, request_line):
    proxy = make_proxy()
    with RawClient(proxy.url) as client:
        client.send(request_line + b"\r\nHost: example.com\r\n\r\n")
        status, headers, body = client.response()
    assert status == 400 and headers["X-Chaosproxy-Error"] == "not-a-forward-proxy"
    assert "reverse proxy" in orjson.loads(body)["error"]["message"]


def test_a_garbage_status_line_from_upstream_is_a_502(make_proxy, scripted):
    async def script(reader, writer):
        await read_request(reader)
        writer.write(b"HTPT/9 banana\r\n\r\n")
        await writer.drain()

    proxy = make_proxy(to=scripted(script).url)
    with RawClient(proxy.url) as client:
        client.send(get("/x"))
        status, headers, _ = client.response()
        assert status == 502 and headers["X-Chaosproxy-Error"] == "upstream-unreachable"


@pytest.mark.slow
async def test_two_agents_with_the_same_rpc_ids_get_their_own_replies(make_proxy):
    """Stateless era: both agents are one session (the client address) and number their calls alike;
    a reply on a POST's own response still belongs to that POST, never to the other agent's."""
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared.exceptions import MCPError

    from tests.helpers.mcp_support import serve

    with serve("http", "--stateless") as base:
        proxy = make_proxy(rule("only-a", {"type": "rpc_error", "phase": "response", "message": "lost for a"},
                                match={"tool": "count", "header": {"X-Agent": "a"}}), to=base)

        async def agent(name: str) -> list[bool]:
            async with httpx2.AsyncClient(headers={"X-Agent": name}, timeout=20) as http:
                async with Client(streamable_http_client(proxy.url + "/mcp", http_client=http)) as session:
                    failed = []
                    for _ in range(3):
                        try:
                            await session.call_tool("count", {"n": 2, "interval_ms": 50})
                            failed.append(False)
                        except MCPError as exc:
                            failed.append(exc.error.message == "lost for a")
                    return failed

        a, b = await asyncio.wait_for(asyncio.gather(agent("a"), agent("b")), 60)
    assert a == [True] * 3 and b == [False] * 3
    faulted = {(f["rpc_id"], f["rule"]) for f in proxy.events("fault")}
    assert len(proxy.events("fault")) == 3 and {rule for _, rule in faulted} == {"only-a"}


def _capture(requests: list[bytes], response: bytes):
    """A script that keeps each request's raw bytes and answers each with `response`."""
    async def script(reader, writer):
        while True:
            head, body = await read_request(reader)
            requests.append(head + body)
            writer.write(response)
            await writer.drain()
    return script


def _recv_exactly(client: RawClient, size: int) -> bytes:
    data = b""
    while len(data) < size and (piece := client.sock.recv(size - len(data))):
        data += piece
    return data


def _requests_seen(make_proxy, scripted) -> tuple[Any, list[bytes], bytes]:
    """A proxy in front of an upstream that answers `ok` and keeps each request's bytes: the proxy, those
    requests, and the upstream's host (what Host says on the way)."""
    requests: list[bytes] = []
    upstream = scripted(_capture(requests, b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"))
    proxy = make_proxy(to=upstream.url)
    return proxy, requests, upstream.url.removeprefix("http://").encode()


def test_a_plain_request_goes_upstream_as_written_but_for_host(make_proxy, scripted):
    proxy, requests, upstream_host = _requests_seen(make_proxy, scripted)
    head = (b"POST /tools/x?a=%2F&b HTTP/1.1\r\nx-lower:   spaced value \r\nhost: agent\r\nX-Dup: 1\r\n"
            b"X-Dup: 2\r\ncontent-length: 3\r\n\r\n")
    with RawClient(proxy.url) as client:
        client.send(head + b"abc")
        assert client.response()[0] == 200
        client.send(b"GET /tools/y HTTP/1.1\r\nX-A: 1\r\nHost: agent\r\n\r\n")  # Host last, no body
        assert client.response()[0] == 200
    assert requests[0] == head.replace(b"host: agent", b"Host: " + upstream_host) + b"abc"
    assert requests[1] == b"GET /tools/y HTTP/1.1\r\nX-A: 1\r\nHost: " + upstream_host + b"\r\n\r\n"


def test_a_request_whose_only_hop_by_hop_lines_say_keep_alive_goes_upstream_as_written_without_them(
        make_proxy, scripted):
    """As httpx (the OpenAI, Anthropic and MCP SDKs' client) and undici send them: the keep-alive lines
    are about the agent's connection and stay behind; the rest goes as written, order and case kept
    (re-serialised, Host would come first and the framing last), on the first request and on the
    plain path after it."""
    proxy, requests, upstream_host = _requests_seen(make_proxy, scripted)
    head = (b"POST /tools/x HTTP/1.1\r\ncontent-length: 3\r\nconnection: keep-alive\r\nx-b: 1\r\n"
            b"Keep-Alive: 300\r\nHost: agent\r\n\r\n")
    with RawClient(proxy.url) as client:
        for _ in range(3):
            client.send(head + b"abc")
            assert client.response()[2] == b"ok"
    sent = b"POST /tools/x HTTP/1.1\r\ncontent-length: 3\r\nx-b: 1\r\nHost: %b\r\n\r\nabc" % upstream_host
    assert requests[1:] == [sent] * 2
    assert requests[0].lower().count(b"connection") == requests[0].lower().count(b"keep-alive") == 0


def test_a_request_with_hop_by_hop_headers_or_under_a_prefix_is_rewritten(make_proxy, scripted):
    requests: list[bytes] = []
    upstream = scripted(_capture(requests, b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"))
    proxy = make_proxy({"rules": [], "routes": {"/tools": upstream.url + "/base"}})
    with RawClient(proxy.url) as client:
        client.send(b"GET /tools/x HTTP/1.1\r\nHost: agent\r\nConnection: keep-alive, X-Hop\r\nX-Hop: 1\r\n"
                    b"X-End: 2\r\n\r\n")
        assert client.response()[0] == 200
        client.send(b"\r\nGET /tools/y HTTP/1.1\r\nHost: agent\r\nX-End: 3\r\n\r\n")  # an empty line first
        assert client.response()[0] == 200
    first, second = (request.lower() for request in requests)
    assert first.startswith(b"get /base/x http/1.1\r\n") and b"x-end: 2" in first
    assert b"connection" not in first and b"x-hop" not in first
    assert second.startswith(b"get /base/y http/1.1\r\n") and b"x-end: 3" in second


def test_a_plain_response_reaches_the_agent_as_written(make_proxy, scripted):
    plain = b"HTTP/1.1 201 Made\r\ncontent-length: 2\r\nX-B:  1 \r\nx-a: 2\r\nX-B: 3\r\n\r\nok"
    upstream = scripted(_capture([], plain))
    proxy = make_proxy(to=upstream.url)
    with RawClient(proxy.url) as client:
        for _ in range(2):  # and the connection stays in step
            client.send(get("/x"))
            assert _recv_exactly(client, len(plain)) == plain
    assert [call["status"] for call in proxy.events("call")] == [201, 201]


def test_a_response_with_hop_by_hop_headers_is_rewritten(make_proxy, scripted):
    upstream = scripted(_capture([], b"HTTP/1.1 200 OK\r\nKeep-Alive: timeout=5\r\nConnection: keep-alive, X-Hop\r\n"
                                     b"X-Hop: 1\r\nContent-Length: 2\r\nX-End: 1\r\n\r\nok"))
    proxy = make_proxy(to=upstream.url)
    with RawClient(proxy.url) as client:
        client.send(get("/x"))
        status, headers, body = client.response()
    assert (status, body, headers["X-End"]) == (200, b"ok", "1")
    assert not {"Keep-Alive", "Connection", "X-Hop"} & set(headers)


@pytest.mark.parametrize("framing", [b"content-length: 2\r\n", b"Transfer-Encoding: chunked\r\n"])
def test_a_response_whose_only_hop_by_hop_lines_say_keep_alive_goes_as_written_without_them(
        make_proxy, scripted, framing):
    """As Node's server answers: its Connection and Keep-Alive lines go (they are about the upstream's
    connection), the rest of the head as written, order and case kept (re-serialised, the framing would
    come last), on the first request and on the plain path after it."""
    body = b"ok" if framing.startswith(b"content") else b"2\r\nok\r\n0\r\n\r\n"
    head = b"HTTP/1.1 200 OK\r\nx-powered-by: Express\r\n%bConnection: keep-alive\r\nX-B: 1\r\n" \
           b"Keep-Alive: timeout=5\r\n\r\n" % framing
    upstream = scripted(_capture([], head + body))
    proxy = make_proxy(to=upstream.url)
    relayed = b"HTTP/1.1 200 OK\r\nx-powered-by: Express\r\n%bX-B: 1\r\n\r\n%b" % (framing, body)
    with RawClient(proxy.url) as client:
        for _ in range(3):  # and the connection stays in step
            client.send(get("/x"))
            assert _recv_exactly(client, len(relayed)) == relayed
    assert [(call["status"], call["bytes_out"]) for call in call_lines(proxy, 3)] == [(200, 2)] * 3


def test_batched_call_lines_read_the_request_body_for_json_rpc(make_proxy):
    proxy = make_proxy(log_batch_s=60.0)
    payload = orjson.dumps(CALL)
    with RawClient(proxy.url) as client:
        client.send(b"POST /echo/rpc HTTP/1.1\r\nHost: a\r\nContent-Length: %d\r\n\r\n%b" % (len(payload), payload))
        assert client.response()[0] == 200
        assert proxy.events("call") == []  # kept for the batch
        proxy.log.flush()
    [call] = proxy.events("call")
    assert (call["method"], call["tool"], call["rpc_id"], call["path"]) == ("tools/call", "search", 7, "/echo/rpc")


@pytest.mark.parametrize("rules", [[], [{"name": "never", "match": {"tool": "no-such-tool"},
                                          "fault": {"type": "rpc_error"}}]],
                         ids=["relayed", "inspected"])
@pytest.mark.slow
def test_after_an_upstream_timeout_the_agent_keeps_its_connection(make_proxy, scripted, rules):
    """Relayed, and inspected (a rule that may act on any JSON-RPC message: the call is read by a coroutine)."""
    async def script(reader, writer):  # /hang is never answered
        while True:
            head, _ = await read_request(reader)
            if head.startswith(b"GET /hang "):
                await asyncio.sleep(30)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await writer.drain()

    proxy = make_proxy({"rules": rules}, to=scripted(script).url, upstream_timeout=0.5)
    with RawClient(proxy.url) as client:
        client.send(get("/x"))  # leaves a pooled connection, which the next request takes
        assert client.response()[:3:2] == (200, b"ok")
        client.send(get("/hang"))
        assert client.response()[0] == 504
        time.sleep(1.2)  # past a second timeout of the same wait, were one still pending
        client.send(get("/x"))
        assert client.response()[:3:2] == (200, b"ok")
    assert [call["outcome"] for call in proxy.events("call")] == ["ok", "upstream_timeout", "ok"]


def test_an_inspected_call_whose_reply_no_rule_can_act_on_gets_the_reply_as_written(make_proxy, scripted):
    """A rule on requests only (a delay for one tool): the request is read and decided on, then the
    pass-through takes the call, so the reply reaches the agent as the upstream wrote it (order and
    case kept; re-serialised, the framing would come last), and the call line names the fault."""
    reply = b'{"jsonrpc":"2.0","id":7,"result":{"content":[]}}'
    answer = b"HTTP/1.1 200 OK\r\nx-b: 1\r\ncontent-length: %d\r\nContent-Type: application/json\r\n\r\n%b" % (
        len(reply), reply)
    requests: list[bytes] = []
    upstream = scripted(_capture(requests, answer))
    proxy = make_proxy(rule("slow", {"type": "latency", "delay_ms": 1}, match={"tool": "search"}), to=upstream.url)
    call = b'{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"search","arguments":{}}}'
    with RawClient(proxy.url) as client:
        for _ in range(2):  # and the connection stays in step
            client.send(b"POST /mcp HTTP/1.1\r\nHost: agent\r\nContent-Type: application/json\r\n"
                        b"Content-Length: %d\r\n\r\n%b" % (len(call), call))
            assert _recv_exactly(client, len(answer)) == answer
    calls = proxy.events("call")
    assert [(c["status"], c["faults"], c["tool"], c["rpc_id"], c["bytes_out"]) for c in calls] == \
        [(200, ["slow"], "search", 7, len(reply))] * 2
    assert len(requests) == 2 and all(request.endswith(call) for request in requests)


def test_with_a_rule_on_tool_lists_a_tool_call_s_reply_goes_as_written_and_the_list_is_still_rewritten(
        make_proxy, scripted):
    """rename_tool changes tools/list replies only: a tools/call's reply goes to the agent as the
    upstream wrote it (the call itself routed back to the real name), the tool list is rewritten."""
    listing = b'{"jsonrpc":"2.0","id":1,"result":{"tools":[{"name":"add","inputSchema":{"type":"object"}}]}}'
    result = b'{"jsonrpc":"2.0","id":2,"result":{"content":[{"type":"text","text":"3"}]}}'

    def answer(body: bytes) -> bytes:
        return b"HTTP/1.1 200 OK\r\nx-b: 1\r\ncontent-length: %d\r\nContent-Type: application/json\r\n\r\n%b" % (
            len(body), body)

    requests: list[bytes] = []

    async def script(reader, writer):
        while True:
            head, body = await read_request(reader)
            requests.append(body)
            writer.write(answer(listing if b"tools/list" in body else result))
            await writer.drain()

    upstream = scripted(script)
    proxy = make_proxy(rule("rename", {"type": "rename_tool", "tool": "add", "to": "plus"}), to=upstream.url)

    def post(client: RawClient, body: bytes) -> None:
        client.send(b"POST /mcp HTTP/1.1\r\nHost: agent\r\nContent-Type: application/json\r\n"
                    b"Content-Length: %d\r\n\r\n%b" % (len(body), body))

    with RawClient(proxy.url) as client:
        post(client, b'{"jsonrpc":"2.0","id":1,"method":"tools/list"}')
        status, _, listed = client.response()
        assert status == 200 and json.loads(listed)["result"]["tools"][0]["name"] == "plus"
        post(client, b'{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"plus","arguments":{}}}')
        assert _recv_exactly(client, len(answer(result))) == answer(result)
    assert json.loads(requests[1])["params"]["name"] == "add"
    assert [(call["tool"], call["faults"]) for call in proxy.events("call")] == [(None, ["rename"]),
                                                                                  ("add", ["rename"])]
