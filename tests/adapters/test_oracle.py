"""The differential oracle of the data plane (invariant 10, issue 23): one generator of HTTP/1.1 exchanges,
each played direct and through every path a call can take, which must all give the agent, and the
upstream, the same messages.

The paths: plain (no rules: relayed as written), handed over (a rule matches the request but can never
fire, so a Passthrough takes the reply) and inspected (a rule reads the reply but can never fire). The
suite runs this file on the compiled data plane and on its sources (tests/adapters/test_compiled.py).

What may differ, as documented: the framing of a message (Content-Length or chunked, chunk sizes and
extensions), hop-by-hop headers, the request's Host, its Expect once the proxy has answered it, and on
the inspected path the Accept-Encoding the proxy asks for (identity) and a compressed event stream it
decodes to read; request trailers never go upstream (see REQUEST_TRAILERS in adapters/http.py). Everything
else must be equal: methods, targets, statuses, reasons, end-to-end headers in order, bodies, response
trailers, informational responses.

`bench/oracle_long.py` runs the same property over many more examples.
"""

from __future__ import annotations

import asyncio
import gzip
import os
import socket
import time
from collections import deque
from dataclasses import dataclass, field
from itertools import pairwise

import h11
import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers.support import rule

HOP = {b"connection", b"keep-alive", b"te", b"trailer", b"transfer-encoding", b"upgrade", b"proxy-connection",
       b"content-length"}
REQUEST_ASIDE = HOP | {b"host", b"expect"}
NEVER_ON_REQUEST = {"rules": [{**rule("never", {"type": "http_error", "status": 503})["rules"][0],
                               "probability": 0.0}]}
NEVER_ON_REPLY = {"rules": [{**rule("never", {"type": "rpc_error", "phase": "response"})["rules"][0],
                             "probability": 0.0}]}
PATHS = {"plain": "rules: []", "handed over": NEVER_ON_REQUEST, "inspected": NEVER_ON_REPLY}
# CI's bounded run; bench/oracle_long.py sets CHAOSPROXY_ORACLE_EXAMPLES for a longer one
EXAMPLES = settings(max_examples=int(os.environ.get("CHAOSPROXY_ORACLE_EXAMPLES", "40")), deadline=None,
                    suppress_health_check=list(HealthCheck))


@dataclass
class Reply:
    status: int
    headers: list[tuple[bytes, bytes]]
    body: bytes
    framing: str  # length, chunked, close
    chunk: int  # chunk size (chunked)
    extension: bool  # a chunk extension (chunked)
    trailers: list[tuple[bytes, bytes]]  # (chunked)
    early_hints: bool  # a 103 first
    gzip: bool

    def wire(self, head_only: bool) -> bytes:
        body = gzip.compress(self.body, mtime=0) if self.gzip else self.body
        headers = list(self.headers) + ([(b"Content-Encoding", b"gzip")] if self.gzip else [])
        no_body = head_only or self.status in (204, 304)
        if self.framing == "length":
            headers.append((b"Content-Length", b"%d" % len(body)))
        elif self.framing == "chunked" and self.status not in (204, 304):
            headers.append((b"Transfer-Encoding", b"chunked"))
        elif self.framing == "close":
            headers.append((b"Connection", b"close"))
        out = b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n" if self.early_hints else b""
        out += b"HTTP/1.1 %d %b\r\n" % (self.status, REASONS[self.status]) + \
            b"".join(b"%b: %b\r\n" % pair for pair in headers) + b"\r\n"
        if no_body:
            return out
        if self.framing != "chunked":
            return out + body
        for start in range(0, len(body), self.chunk):
            piece = body[start:start + self.chunk]
            out += b"%x%b\r\n%b\r\n" % (len(piece), b";x=1" if self.extension else b"", piece)
        return out + b"0\r\n" + b"".join(b"%b: %b\r\n" % pair for pair in self.trailers) + b"\r\n"


@dataclass
class Request:
    method: bytes
    target: bytes
    headers: list[tuple[bytes, bytes]]
    body: bytes
    chunked: bool
    expect: bool
    splits: list[int]  # where the agent's writes of it end (byte offsets)

    def wire(self) -> tuple[bytes, bytes]:
        """The head, and the body as framed."""
        headers = [(b"Host", b"agent.example"), *self.headers]
        if self.expect:
            headers.append((b"Expect", b"100-continue"))
        if self.chunked:
            headers.append((b"Transfer-Encoding", b"chunked"))
            body = (b"%x;ext=1\r\n%b\r\n" % (len(self.body), self.body) if self.body else b"") + \
                b"0\r\nX-Request-Trailer: t\r\n\r\n"
        else:
            if self.body or self.method in (b"POST", b"PUT"):
                headers.append((b"Content-Length", b"%d" % len(self.body)))
            body = self.body
        head = b"%b %b HTTP/1.1\r\n" % (self.method, self.target) + \
            b"".join(b"%b: %b\r\n" % pair for pair in headers) + b"\r\n"
        return head, body


REASONS = {200: b"OK", 201: b"Created", 204: b"No Content", 304: b"Not Modified", 404: b"Not Found",
           500: b"Internal Server Error", 503: b"Service Unavailable"}
RPC = orjson.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "search"}})
REPLY = orjson.dumps({"jsonrpc": "2.0", "id": 1, "result": {"content": [{"type": "text", "text": "é ok"}]}})
LISTED = orjson.dumps({"jsonrpc": "2.0", "id": 1, "result": {"tools": [{"name": "search", "inputSchema": {}}]}})
SSE = b"event: message\ndata: " + REPLY + b"\n\n: keep-alive\n\ndata: " + REPLY + b"\r\n\r\n"

header_values = st.binary(min_size=0, max_size=12).map(
    lambda raw: bytes(b if 0x21 <= b <= 0x7e else 0x61 for b in raw))
extra_headers = st.lists(st.tuples(st.sampled_from([b"X-Trace", b"X-Mixed-Case", b"Cache-Control", b"X-Empty"]),
                                   header_values), max_size=3)


@st.composite
def replies(draw: st.DrawFn, last: bool) -> Reply:
    status = draw(st.sampled_from(sorted(REASONS)))
    kind = draw(st.sampled_from(["json", "sse", "text"]))
    body = {"json": REPLY, "sse": SSE, "text": draw(st.binary(max_size=300))}[kind]
    content_type = {"json": b"application/json", "sse": b"text/event-stream", "text": b"text/plain"}[kind]
    framings = ["length", "chunked", *(["close"] if last else [])]
    return Reply(status, [(b"Content-Type", content_type), *draw(extra_headers)], body,
                 draw(st.sampled_from(framings)), draw(st.integers(1, 64)), draw(st.booleans()),
                 draw(st.lists(st.tuples(st.sampled_from([b"X-Sum", b"X-Checksum"]), header_values), max_size=2)),
                 draw(st.booleans()), draw(st.booleans()) and kind != "text")


@st.composite
def requests(draw: st.DrawFn) -> Request:
    method = draw(st.sampled_from([b"GET", b"POST", b"PUT", b"DELETE", b"HEAD", b"OPTIONS"]))
    has_body = method in (b"POST", b"PUT")
    body = draw(st.sampled_from([RPC, b"", b"plain \x00 bytes"])) if has_body else b""
    chunked = has_body and draw(st.booleans())
    headers = [(b"Content-Type", b"application/json"), (b"Accept", b"application/json, text/event-stream"),
               *draw(extra_headers)]
    if draw(st.booleans()):
        headers.append((b"Connection", b"keep-alive"))
    if draw(st.booleans()):
        headers.append((b"Accept-Encoding", b"gzip"))
    target = draw(st.sampled_from([b"/mcp", b"/api/search?q=a%20b", b"/", b"/x/y?session=1"]))
    request = Request(method, target, headers, body, chunked, has_body and bool(body) and draw(st.booleans()), [])
    size = sum(map(len, request.wire()))
    request.splits = sorted(set(draw(st.lists(st.integers(1, max(size - 1, 1)), max_size=3))))
    return request


@dataclass
class Exchanges:
    """What one connection carries: requests one after another (pipelined or not), their replies."""
    pairs: list[tuple[Request, Reply]]
    pipelined: bool
    received: list[h11.Request | bytes] = field(default_factory=list)


@st.composite
def exchanges(draw: st.DrawFn) -> Exchanges:
    count = draw(st.integers(1, 2))
    pairs = [(draw(requests()), draw(replies(last=n == count - 1))) for n in range(count)]
    pipelined = count > 1 and not any(request.expect for request, _ in pairs) and draw(st.booleans())
    return Exchanges(pairs, pipelined)


class Upstream:
    """Answers each request it reads with the next reply of the case being played, and records what it
    read (parsed here, not by the proxy's parser). It says 100 Continue itself when asked to."""

    def __init__(self, scripted) -> None:
        self.plays: deque[Reply] = deque()
        self.plays_sent: list[bytes] = []  # the bodies of the replies played, as sent
        self.received: list[tuple] = []
        self.url = scripted(self._serve).url

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while self.plays:
            request = await _read_request(reader, writer)
            if request is None:
                return
            if b'"tools/list"' in request[3]:  # the proxy listing the tools itself (for their schemas)
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
                             b"\r\n%b" % (len(LISTED), LISTED))
                continue
            self.received.append(request)
            reply = self.plays.popleft()
            self.plays_sent.append(reply.body)
            writer.write(reply.wire(request[0] == b"HEAD"))
            await writer.drain()
            if reply.framing == "close":
                return


async def _read_request(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> tuple | None:
    """(method, target, headers with lower-case names, body, trailers), or None at the end."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None
    first, *lines = head[:-4].split(b"\r\n")
    method, target, _ = first.split(b" ")
    headers = [(name.strip().lower(), value.strip()) for name, _, value in (line.partition(b":") for line in lines)]
    fields = dict(headers)
    if fields.get(b"expect", b"").lower() == b"100-continue":
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    body, trailers = b"", []
    if b"chunked" in fields.get(b"transfer-encoding", b""):
        while size := int((await reader.readuntil(b"\r\n")).split(b";")[0], 16):
            body += await reader.readexactly(size)
            await reader.readexactly(2)
        while (line := await reader.readuntil(b"\r\n")) != b"\r\n":
            name, _, value = line[:-2].partition(b":")
            trailers.append((name.strip().lower(), value.strip()))
    elif length := int(fields.get(b"content-length", b"0")):
        body = await reader.readexactly(length)
    return method, target, headers, body, trailers


def play(url: str, case: Exchanges) -> list[tuple]:
    """Send the case's requests as an agent would (in pieces, pipelined or one after another, waiting
    for 100 Continue when it asks for it) and parse what comes back with h11 (not the proxy's parser):
    per request, its informational statuses and its response."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=5)
    client = h11.Connection(h11.CLIENT)  # told what is sent (its bytes unused), so that it reads replies right
    got: list[tuple] = []

    def next_event() -> h11.Event:
        while (event := client.next_event()) is h11.NEED_DATA:
            client.receive_data(sock.recv(65536))
        return event

    def reply(informational: list[int]) -> tuple:
        response, body = None, b""
        while not isinstance(event := next_event(), (h11.EndOfMessage, h11.ConnectionClosed)):
            if isinstance(event, h11.InformationalResponse):
                informational.append(event.status_code)
            elif isinstance(event, h11.Response):
                response = event
            elif isinstance(event, h11.Data):
                body += event.data
        assert response is not None
        trailers = list(event.headers) if isinstance(event, h11.EndOfMessage) else []
        return (informational, response.status_code, response.reason, list(response.headers), body, trailers)

    def tell(request: Request, head: bytes) -> None:
        headers = [tuple(part.strip() for part in line.split(b":", 1)) for line in head.split(b"\r\n")[1:-2]]
        client.send(h11.Request(method=request.method, target=request.target, headers=headers))

    def told_body(request: Request) -> None:
        if request.body:
            client.send(h11.Data(data=request.body))
        client.send(h11.EndOfMessage())

    try:
        if case.pipelined:  # all the requests at once, in pieces at their split points
            for request, _ in case.pairs:
                head, body = request.wire()
                whole = head + body
                cuts = [0, *[cut for cut in request.splits if cut < len(whole)], len(whole)]
                for a, b in pairwise(cuts):
                    sock.sendall(whole[a:b])
            for n, (request, _) in enumerate(case.pairs):
                if n:
                    client.start_next_cycle()
                tell(request, request.wire()[0])
                told_body(request)
                got.append(reply([]))
            return got
        for n, (request, _) in enumerate(case.pairs):
            if n:
                client.start_next_cycle()
            head, body = request.wire()
            tell(request, head)
            informational: list[int] = []
            if request.expect:  # the head, then the body once told to go on
                sock.sendall(head)
                event = next_event()
                assert isinstance(event, h11.InformationalResponse), f"no 100 Continue but {event}"
                informational.append(event.status_code)
                sock.sendall(body)
            else:
                whole = head + body
                cuts = [0, *[cut for cut in request.splits if cut < len(whole)], len(whole)]
                for a, b in pairwise(cuts):
                    sock.sendall(whole[a:b])
                    time.sleep(0.001)
            told_body(request)
            got.append(reply(informational))
            if client.their_state is not h11.DONE or client.our_state is not h11.DONE:
                break
        return got
    finally:
        sock.close()


def normal_reply(reply: tuple, path: str) -> tuple:
    informational, status, reason, headers, body, trailers = reply
    kept = [(name, value) for name, value in headers if name not in HOP]
    if path == "inspected" and (b"content-type", b"text/event-stream") in kept and \
            (b"content-encoding", b"gzip") in kept:  # an event stream read on the way is decoded for good
        kept.remove((b"content-encoding", b"gzip"))
        body = gzip.decompress(body) if body else body
    return (informational, status, reason, kept, body, trailers)


def normal_request(received: tuple, path: str) -> tuple:
    method, target, headers, body, _trailers = received  # request trailers never go upstream
    aside = REQUEST_ASIDE | ({b"accept-encoding"} if path == "inspected" else set())
    return (method, target, [(name, value) for name, value in headers if name not in aside], body)


@given(case=exchanges())
@EXAMPLES
def test_every_path_gives_the_agent_and_the_upstream_what_direct_does(make_proxy, scripted, case):
    upstream = Upstream(scripted)
    proxies = {path: make_proxy(scenario, to=upstream.url) for path, scenario in PATHS.items()}
    seen: dict[str, tuple[list, list]] = {}
    for path, url in [("direct", upstream.url), *((path, proxy.url) for path, proxy in proxies.items())]:
        upstream.plays = deque(reply for _, reply in case.pairs)
        upstream.received = []
        seen[path] = (play(url, case), upstream.received)
    direct_agent, direct_upstream = seen.pop("direct")
    for path, (agent, server) in seen.items():  # each compared with direct as that path may differ
        assert [normal_reply(r, path) for r in agent] == [normal_reply(r, path) for r in direct_agent], \
            f"{path}: the agent's replies differ"
        assert [normal_request(r, path) for r in server] == [normal_request(r, path) for r in direct_upstream], \
            f"{path}: what the upstream read differs"
    for proxy in proxies.values():
        faults = [line for line in proxy.events() if line["event"] == "fault"]
        assert faults == [], "a rule that cannot fire was logged"


FAULTS_ON_REPLIES = {
    "typos": {"type": "typos", "rate": 0.3},
    "typos that may change nothing": {"type": "typos", "rate": 0.01},
    "an error at random": {"type": "rpc_error", "phase": "response"},
}


@given(texts=st.lists(st.text(alphabet="ab1 .é", max_size=12), min_size=1, max_size=6),
       fault=st.sampled_from(sorted(FAULTS_ON_REPLIES)), sse=st.booleans())
@EXAMPLES
def test_a_call_line_lists_a_fault_exactly_when_the_agent_got_other_bytes(make_proxy, scripted, texts, fault,
                                                                          sse):
    upstream = Upstream(scripted)
    proxy = make_proxy({"rules": [{"name": "f", "match": {"method": "tools/call"}, "probability": 0.5,
                                   "fault": FAULTS_ON_REPLIES[fault]}]}, to=upstream.url)
    content_type = b"text/event-stream" if sse else b"application/json"
    sent = [orjson.dumps({"jsonrpc": "2.0", "id": 1, "result": {"content": [{"type": "text", "text": text}]}})
            for text in texts]
    upstream.plays = deque(Reply(200, [(b"Content-Type", content_type)], b"data: %b\n\n" % body if sse else body,
                                 "length", 1, False, [], False, False) for body in sent)
    request = Request(b"POST", b"/mcp", [(b"Content-Type", b"application/json"),
                                         (b"Accept", b"application/json, text/event-stream")], RPC, False, False, [])
    got = play(proxy.url, Exchanges([(request, reply) for reply in upstream.plays], pipelined=False))
    calls = [line for line in proxy.events() if line["event"] == "call"]
    assert len(got) == len(calls) == len(sent)
    for (_, _, _, _, body, _), upstream_body, call in zip(got, upstream.plays_sent, calls, strict=True):
        assert (body != upstream_body) == bool(call["faults"]), (body, upstream_body, call)
