"""The data plane's seams (issue 23): each case on real sockets, on every path it can take. The suite's
data-plane tests run once more on the Python sources (tests/test_compiled.py), so each holds for both forms."""

from __future__ import annotations

import asyncio
import gzip
import time

import orjson
import pytest

from tests.framing_support import RawClient, read_request
from tests.support import call_lines, rule

CALL = {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "search", "arguments": {}}}
REPLY = {"jsonrpc": "2.0", "id": 7, "result": {"content": [{"type": "text", "text": "found"}]}}
LOST = rule("lost", {"type": "rpc_error", "code": -32603, "message": "reply lost", "at": "response"},
            match={"method": "tools/call"})
NEVER = {"rules": [{**LOST["rules"][0], "probability": 0.0}]}  # matches, reads the reply, never fires
MATCHES_REQUEST = rule("slow", {"type": "latency", "delay_ms": 1}, match={"method": "tools/call"})
PATHS = {"plain": "rules: []", "handed over": MATCHES_REQUEST, "inspected": NEVER}
FIRED = {"plain": [], "handed over": ["slow"], "inspected": []}  # a latency changes when, not what


def post(payload: bytes, *extra: bytes) -> bytes:
    return b"POST /mcp HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\n%bContent-Length: %d\r\n\r\n%b" % (
        b"".join(line + b"\r\n" for line in extra), len(payload), payload)


def always_gzip(body: bytes, content_type: bytes = b"application/json"):
    """An upstream that gzips its reply whatever the request's Accept-Encoding says."""
    packed = gzip.compress(body)

    async def script(reader, writer):
        while True:
            await read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: %b\r\nContent-Encoding: gzip\r\nContent-Length: %d\r\n\r\n%b"
                         % (content_type, len(packed), packed))
            await writer.drain()
    return script, packed


def test_a_gzip_reply_that_ignores_identity_still_meets_a_response_rule(make_proxy, scripted):
    script, _ = always_gzip(orjson.dumps(REPLY))
    proxy = make_proxy(LOST, to=scripted(script).url)
    with RawClient(proxy.url) as client:
        client.send(post(orjson.dumps(CALL)))
        status, headers, body = client.response()
    assert "Content-Encoding" not in headers  # what the fault wrote goes plain
    assert status == 200 and orjson.loads(body)["error"]["message"] == "reply lost"
    [call] = call_lines(proxy, 1)
    assert call["faults"] == ["lost"]


@pytest.mark.parametrize("path", PATHS)
def test_a_gzip_reply_no_fault_changes_reaches_the_agent_as_the_upstream_sent_it(make_proxy, scripted, path):
    script, packed = always_gzip(orjson.dumps(REPLY))
    proxy = make_proxy(PATHS[path], to=scripted(script).url)
    with RawClient(proxy.url) as client:
        for _ in range(2):  # and the connection stays in step
            client.send(post(orjson.dumps(CALL)))
            status, headers, body = client.response()
            assert (status, headers["Content-Encoding"], body) == (200, "gzip", packed)
    assert [call["faults"] for call in call_lines(proxy, 2)] == [FIRED[path]] * 2


@pytest.mark.parametrize("path", PATHS)
def test_a_gzip_event_stream_is_not_held_back(make_proxy, scripted, path):
    import zlib
    release = asyncio.Event()

    async def script(reader, writer):
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Encoding: gzip\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n")
        packer = zlib.compressobj(wbits=31)
        piece = packer.compress(b"event: message\ndata: " + orjson.dumps(REPLY) + b"\n\n") + \
            packer.flush(zlib.Z_SYNC_FLUSH)
        writer.write(b"%x\r\n%b\r\n" % (len(piece), piece))
        await writer.drain()
        await asyncio.wait_for(release.wait(), 10)  # the stream stays open

    upstream = scripted(script)
    proxy = make_proxy(PATHS[path], to=upstream.url)
    try:
        with RawClient(proxy.url) as client:
            client.send(b"GET /mcp HTTP/1.1\r\nHost: a\r\nAccept: text/event-stream\r\nAccept-Encoding: gzip\r\n\r\n")
            started = time.perf_counter()
            head = b""
            while not head.endswith(b"\r\n\r\n"):
                head += client.read_line()
            first = client.read_line()  # the first chunk's size line: the event's bytes are on their way
            took = time.perf_counter() - started
    finally:
        upstream.server_loop.loop.call_soon_threadsafe(release.set)
    assert head.startswith(b"HTTP/1.1 200") and first.strip()
    assert took < 1.0


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("framing", ["length", "chunked"])
@pytest.mark.parametrize("stray", [b"XYZ", b"\r\n", b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"],
                         ids=["junk", "blank line", "second response"])
def test_stray_bytes_after_a_complete_response_do_not_lose_it(make_proxy, scripted, path, framing, stray):
    reply = b"ok" if framing == "length" else b"2\r\nok\r\n0\r\n\r\n"
    frame = b"Content-Length: 2" if framing == "length" else b"Transfer-Encoding: chunked"

    async def script(reader, writer):
        while True:
            await read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n%b\r\n\r\n%b%b" % (frame, reply, stray))
            await writer.drain()

    upstream = scripted(script)
    proxy = make_proxy(PATHS[path], to=upstream.url)
    with RawClient(proxy.url) as client:
        for _ in range(2):  # the second on a new upstream connection, unless only blank lines followed
            client.send(post(orjson.dumps(CALL)))
            status, _, body = client.response()
            assert (status, body) == (200, b"ok")
    assert upstream.connections == (1 if stray == b"\r\n" else 2)  # blank lines between responses are allowed
    assert [call["status"] for call in call_lines(proxy, 2)] == [200, 200]
