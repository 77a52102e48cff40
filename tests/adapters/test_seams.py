"""The data plane's seams (issue 23): each case on real sockets, on every path it can take. The suite's
data-plane tests run once more on the Python sources (tests/adapters/test_compiled.py), so each holds for both forms."""

from __future__ import annotations

import asyncio
import gzip
import time

import orjson
import pytest

from tests.helpers.framing_support import RawClient, read_request
from tests.helpers.support import call_lines, rule


@pytest.fixture
def ops_lines():
    """What the proxy's operational log says during the test (with tracebacks), whatever its handlers."""
    import logging
    import traceback

    from chaosproxy.telemetry.log import ops

    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage() + "".join(traceback.format_exception(*record.exc_info))
                         if record.exc_info else record.getMessage())

    handler = Keep()
    ops.addHandler(handler)
    yield lines
    ops.removeHandler(handler)


CALL = {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "search", "arguments": {}}}
REPLY = {"jsonrpc": "2.0", "id": 7, "result": {"content": [{"type": "text", "text": "found"}]}}
LOST = rule("lost", {"type": "rpc_error", "code": -32603, "message": "reply lost", "phase": "response"},
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
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: %b\r\nContent-Encoding: gzip\r\n"
                         b"Content-Length: %d\r\n\r\n%b" % (content_type, len(packed), packed))
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
    assert took < 2.0  # (held back, it came 4.5 s late)


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


def test_a_rewritten_call_mirrors_into_headers_only_what_a_header_may_hold(make_proxy, scripted):
    heads: list[bytes] = []

    async def script(reader, writer):
        head, _ = await read_request(reader)
        heads.append(head)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%b"
                     % (len(orjson.dumps(REPLY)), orjson.dumps(REPLY)))
        await writer.drain()

    proxy = make_proxy(rule("slip", {"type": "unknown_tool"}), to=scripted(script).url)
    call = {**CALL, "params": {"name": "ab\r\nX-Evil: 1", "arguments": {}}}
    with RawClient(proxy.url) as client:
        client.send(post(orjson.dumps(call), b"Mcp-Method: tools/call", b"Mcp-Name: ab"))
        assert client.response()[0] == 200
    [head] = heads
    lines = head.split(b"\r\n")
    assert not [line for line in lines if line.lower().startswith(b"x-ev")]  # (the slip may swap two letters)
    assert b"Mcp-Name: ab" in lines  # the agent's own stayed


def test_a_failure_inside_the_wire_layer_is_answered_502_and_logged(server_loop, ops_lines):
    """A bug in a callback the parser calls (here, the proxy's handler) is the proxy's failure: the
    agent gets a 502 and the log says why, instead of a 400 for its 'malformed request' or silence."""
    from chaosproxy.adapters.h1 import ClientConnection, ClientLimits

    class Broken:
        session_header = b"mcp-session-id"
        limits = ClientLimits()
        connections: set = set()

        def relay_plain(self, *_):
            raise RuntimeError("a bug in the proxy")

        handle = relay_plain

    async def start():
        return await asyncio.get_running_loop().create_server(lambda: ClientConnection(Broken()), "127.0.0.1", 0)

    server = server_loop.run(start())
    try:
        with RawClient(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}") as client:
            client.send(b"GET /health HTTP/1.1\r\nHost: a\r\n\r\n")
            status, headers, _ = client.response()
    finally:
        server_loop.loop.call_soon_threadsafe(server.close)  # on its own loop's thread
    assert (status, headers["X-Chaosproxy-Error"]) == (502, "internal")
    assert any("internal error" in line and "a bug in the proxy" in line for line in ops_lines)


@pytest.mark.slow
def test_nothing_an_agent_sends_forges_a_line_of_the_proxys_own_log(tmp_path):
    import subprocess
    import sys

    from tests.helpers.support import free_port, wait_listening
    port, dead = free_port(), free_port()  # nothing listens on `dead`: the call fails and is logged
    proc = subprocess.Popen([sys.executable, "-m", "chaosproxy", "run", "--upstream", f"http://127.0.0.1:{dead}",
                             "--listen", f"127.0.0.1:{port}", "--log", str(tmp_path / "log.jsonl")],
                            stderr=subprocess.PIPE, text=True)
    try:
        wait_listening(port, proc)
        with RawClient(f"http://127.0.0.1:{port}") as client:
            client.send(b"GET /x%0d%0achaosproxy%20INFO%20forged HTTP/1.1\r\nHost: a\r\n\r\n")
            assert client.response()[0] == 502
    finally:
        proc.terminate()
        _, stderr = proc.communicate(timeout=10)
    assert "failed for GET /x\\x0d\\x0achaosproxy INFO forged" in stderr
    assert not any(line.startswith("chaosproxy INFO forged") for line in stderr.splitlines())


def test_an_upstream_that_is_down_gets_a_line_now_and_then_not_one_per_request(make_proxy, ops_lines):
    from tests.helpers.support import free_port
    proxy = make_proxy(to=f"http://127.0.0.1:{free_port()}")  # nothing listens there
    with RawClient(proxy.url) as client:
        for _ in range(20):
            client.send(b"GET /x HTTP/1.1\r\nHost: a\r\n\r\n")
            assert client.response()[0] == 502
    said = [line for line in ops_lines if "failed for" in line]
    assert len(said) == 1, said
    assert len(call_lines(proxy, 20)) == 20  # each call is still in the log, with its outcome


@pytest.mark.parametrize("path", PATHS)
def test_a_small_body_sent_after_100_continue_is_asked_for_at_once(make_proxy, path):
    """Defect 1 of issue 23: whichever path reads the body first (the proxy, to decide, or the upstream),
    the agent is told to go on at once, not after its own wait for a 100 that never comes."""
    proxy = make_proxy(PATHS[path])
    body = orjson.dumps(CALL)  # 106 bytes, as in the report
    with RawClient(proxy.url) as client:
        client.send(b"POST /echo/rpc HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Type: application/json\r\n"
                    b"Content-Length: %d\r\n\r\n" % len(body))
        started = time.perf_counter()
        client.sock.settimeout(3)
        assert client.read_line().startswith(b"HTTP/1.1 100")
        assert time.perf_counter() - started < 0.9  # (curl gives up waiting after 1 s)
        assert client.read_line() == b"\r\n"
        client.send(body)
        status, _, echoed = client.response()
    assert (status, echoed) == (200, body)
