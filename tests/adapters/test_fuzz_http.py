"""Fuzzing `chaosproxy run` on real sockets, from the agent's side and from a scripted hostile upstream.

Invariants (issue 11): the proxy keeps serving, never answers 500 for its own failure, gives every
request it accepts exactly one response (or ends the connection, for input HTTP does not allow), and
its memory stays bounded.
"""

from __future__ import annotations

import asyncio
import http.client
import resource
import string
import time

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers.framing_support import RawClient, ScriptedUpstream, read_request
from tests.helpers.support import rule

FUZZ = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
WATCHING = rule("lost", {"type": "rpc_error", "phase": "response", "message": "reply lost"}, match={"tool": "search"})
CALL = orjson.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "search"}})

tokens = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E, exclude_characters=":"), min_size=1,
                 max_size=20)
any_bytes = st.binary(min_size=0, max_size=60)
targets = st.one_of(st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), max_size=40).map(lambda t: "/" + t),
                    st.sampled_from(["*", "http://127.0.0.1:1/x", "//x", "/%", "/%zz", "/a?%", "example.com:443"]))
methods = st.sampled_from(["GET", "POST", "PUT", "HEAD", "OPTIONS", "CONNECT", "PATCH", "X-CUSTOM"])
header_lines = st.lists(st.one_of(
    st.tuples(tokens, tokens).map(lambda nv: f"{nv[0]}: {nv[1]}".encode()),
    st.sampled_from([b"Content-Length: -1", b"Content-Length: 99999999999999999999", b"Content-Length: 1, 2",
                     b"Transfer-Encoding: gzip, chunked", b"Transfer-Encoding: identity", b"Expect: 100-continue",
                     b"Connection: Upgrade", b"Upgrade: websocket", b"Connection: x-drop, close", b"x-drop: 1",
                     b" folded", b"No-Colon", b"Mcp-Session-Id: \x80\xff"]),
    any_bytes.filter(lambda b: b"\r\n" not in b)), max_size=6)
chunked_bodies = st.one_of(
    st.just(b"0\r\n\r\n"), st.just(b"zz\r\nab\r\n0\r\n\r\n"), st.just(b"3\r\nabcdef\r\n0\r\n\r\n"),
    st.just(b"ffffffffffffffffff\r\n"), any_bytes)


def _rss_kib() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def _answers(url: str, data: bytes, wait: float = 1.0, most: int = 2) -> list[tuple[int, dict[str, str]]]:
    """The responses (at most `most`) the proxy gives on one connection to `data`, until it closes or is
    silent: `wait` seconds for the first, a moment for any more (the client keeps its side open: a
    client that closes has gone, and its calls with it)."""
    answers: list[tuple[int, dict[str, str]]] = []
    with RawClient(url, timeout=wait) as client:
        try:
            client.send(data)
        except OSError:
            return answers
        while len(answers) < most:
            try:
                status, headers, _ = client.response()
            except (http.client.HTTPException, OSError, ValueError):
                return answers
            answers.append((status, dict(headers)))
            client.sock.settimeout(0.2)
    return answers


def _still_serves(url: str) -> None:
    with RawClient(url, timeout=5) as client:
        client.send(b"GET /health HTTP/1.1\r\nHost: a\r\n\r\n")
        assert client.response()[2] == b"ok"


@pytest.mark.parametrize("scenario", ["rules: []", WATCHING], ids=["idle", "watching"])
def test_fuzzed_requests_never_break_the_proxy(make_proxy, scenario):
    proxy = make_proxy(scenario)
    rss_before = _rss_kib()

    @FUZZ
    @given(method=methods, target=targets, headers=header_lines, chunked=st.booleans(), body=chunked_bodies)
    def one(method, target, headers, chunked, body):
        head = f"{method} {target} HTTP/1.1\r\nHost: a\r\n".encode() + b"".join(h + b"\r\n" for h in headers)
        if chunked:
            head += b"Transfer-Encoding: chunked\r\n"
        answers = _answers(proxy.url, head + b"\r\n" + body)
        for status, headers_back in answers:
            assert status != 500 or "X-Chaosproxy-Error" not in headers_back
            assert headers_back.get("X-Chaosproxy-Error") != "internal"
        _still_serves(proxy.url)

    one()
    assert _rss_kib() - rss_before < 200 * 1024  # the whole test process, bounded
    assert not [e for e in proxy.events("error")]


HOP_AND_FRAMING = {"connection", "upgrade", "expect", "transfer-encoding", "content-length", "host", "keep-alive",
                   "te", "trailer", "proxy-connection"}
field_names = st.text(st.sampled_from(string.ascii_letters + string.digits + "!#$%&'*+-.^_`|~"),
                      min_size=1, max_size=20)
well_formed = st.builds(
    lambda method, path, headers, body: (method, b"%b %b HTTP/1.1\r\nHost: a\r\n%bContent-Length: %d\r\n\r\n%b" % (
        method.encode(), path.encode(), b"".join(f"{name}: {value}\r\n".encode() for name, value in headers),
        len(body), body)),
    st.sampled_from(["GET", "POST", "PUT", "DELETE", "OPTIONS", "PATCH", "HEAD"]),
    st.sampled_from(["/health", "/api/weather", "/echo/x", "/mcp", "/nowhere"]).flatmap(
        lambda path: st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E, exclude_characters="#"),
                             max_size=12).map(lambda tail: path + tail)),
    st.lists(st.tuples(field_names.filter(lambda name: name.lower() not in HOP_AND_FRAMING), tokens), max_size=4),
    st.one_of(st.just(CALL), any_bytes))


@pytest.mark.parametrize("scenario", ["rules: []", WATCHING], ids=["idle", "watching"])
def test_pipelined_well_formed_requests_get_exactly_one_response_each_in_order(make_proxy, scenario):
    """Whatever the requests, N of them written at once get N responses, in order, on the one connection."""
    proxy = make_proxy(scenario)

    @settings(FUZZ, max_examples=40)
    @given(requests=st.lists(well_formed, min_size=1, max_size=4))
    def one(requests):
        with RawClient(proxy.url, timeout=10) as client:
            client.send(b"".join(raw for _, raw in requests))
            statuses = [client.response(method)[0] for method, _ in requests]
            assert all(100 <= status < 600 and status != 500 for status in statuses), statuses
            client.sock.settimeout(0.3)
            with pytest.raises((TimeoutError, http.client.HTTPException, OSError)):
                client.response()  # nothing more: not a second answer to any of them
        _still_serves(proxy.url)

    one()
    assert not proxy.events("error")
    assert len(proxy.events("call")) >= 1


hostile_status = st.one_of(
    st.sampled_from([b"HTTP/1.1 200 OK", b"HTTP/1.1 999 Odd", b"HTTP/1.0 200 OK", b"HTTP/1.1 204 No Content",
                     b"HTTP/1.1 101 Switching Protocols", b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK",
                     b"HTTP/2 200", b"garbage", b"", b"HTTP/1.1 200", b"HTTP/1.1 20x OK"]),
    any_bytes.filter(lambda b: b"\r\n" not in b))
hostile_headers = st.lists(st.sampled_from([
    b"Content-Type: text/event-stream", b"Content-Type: application/json", b"Content-Length: 5",
    b"Content-Length: 100000", b"Content-Length: x", b"Transfer-Encoding: chunked", b"Content-Encoding: gzip",
    b"Content-Encoding: br", b"Connection: close", b"Connection: keep-alive, x-hop", b"x-hop: 1", b"Trailer: X",
    b"Connection: keep-alive", b"Keep-Alive: timeout=5",
    b"Bad Header", b": empty-name", b"X-Long: " + b"v" * 300]), max_size=5)
hostile_bodies = st.one_of(
    st.sampled_from([b"", b"hello", b"0\r\n\r\n", b"5\r\nhello\r\n0\r\n\r\n", b"zz\r\nxx\r\n", b"5\r\nhi",
                     b"data: {\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}\n\n",
                     b"data: {\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}",  # no event end
                     b"event: endpoint\ndata: http://[::1\n\n", b": comment only\n\n",
                     b"{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":", b"{\"jsonrpc\":\"2.0\",\"id\":[1],\"error\":7}",
                     b"\x1f\x8b\x08\x00garbage", b"data: " + b"x" * 70000 + b"\n\n"]),
    any_bytes)


@pytest.mark.parametrize("scenario", ["rules: []", WATCHING], ids=["idle", "watching"])
def test_hostile_upstreams_get_a_502_or_their_bytes_as_they_are(make_proxy, scripted_once, scenario):
    plays: list[bytes] = [b""]
    upstream = scripted_once(plays)
    proxy = make_proxy(scenario, to=upstream.url, upstream_timeout=2)

    @FUZZ
    @given(status=hostile_status, headers=hostile_headers, body=hostile_bodies)
    def one(status, headers, body):
        plays[0] = status + b"\r\n" + b"".join(h + b"\r\n" for h in headers) + b"\r\n" + body
        started = time.monotonic()
        answers = _answers(proxy.url, b"POST /mcp HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\n"
                                      b"Content-Length: %d\r\n\r\n%b" % (len(CALL), CALL), wait=4, most=1)
        assert time.monotonic() - started < 8  # never hangs past --upstream-timeout and the read timeout
        for code, headers_back in answers:
            assert headers_back.get("X-Chaosproxy-Error") != "internal"
            assert code != 500 or plays[0].startswith(b"HTTP/1.1 500")
        _still_serves_via(proxy)

    one()


def _still_serves_via(proxy) -> None:
    """The proxy's listener still answers (the 404 of an unrouted target needs no upstream)."""
    with RawClient(proxy.url, timeout=5) as client:
        client.send(b"GET nowhere HTTP/1.1\r\nHost: a\r\n\r\n")
        assert client.response()[0] == 400


@pytest.fixture
def scripted_once(scripted):
    """An upstream that answers each request with `plays[0]`, whatever it is, then closes."""
    def start(plays: list[bytes]) -> ScriptedUpstream:
        async def script(reader, writer):
            await read_request(reader)
            writer.write(plays[0])
            await writer.drain()

        return scripted(script)

    return start


def test_slowloris_upstream_gets_a_504_after_the_upstream_timeout(make_proxy, scripted):
    async def drip(reader, writer):
        await read_request(reader)
        for byte in b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok":
            writer.write(bytes([byte]))
            await writer.drain()
            await asyncio.sleep(0.3)

    proxy = make_proxy(to=scripted(drip).url, upstream_timeout=1)
    started = time.monotonic()
    with RawClient(proxy.url, timeout=10) as client:
        client.send(b"GET /x HTTP/1.1\r\nHost: a\r\n\r\n")
        status, headers, _ = client.response()
    assert status == 504 and headers["X-Chaosproxy-Error"] == "upstream-timeout"
    assert time.monotonic() - started < 3
    [call] = proxy.events("call")
    assert call["outcome"] == "upstream_timeout"


def test_a_json_rpc_body_over_the_size_limit_passes_as_it_is(make_proxy, scripted_once):
    big = orjson.dumps({"jsonrpc": "2.0", "id": 1, "result": {"text": "x" * (2 << 20)}})
    upstream = scripted_once([b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%b"
                              % (len(big), big)])
    proxy = make_proxy(WATCHING, to=upstream.url, max_message_bytes=1 << 20)
    with RawClient(proxy.url, timeout=10) as client:
        client.send(b"POST /mcp HTTP/1.1\r\nHost: a\r\nContent-Length: %d\r\n\r\n%b" % (len(CALL), CALL))
        status, _, body = client.response()
    assert status == 200 and body == big  # not inspected (too large), not buffered whole, not lost
