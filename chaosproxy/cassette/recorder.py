"""Recording: what the upstream received and sent, as a cassette (chaosproxy.cassette.format).

HTTP: an `HttpRecorder` is the data plane's byte tap (h1.ByteTap). Every path a call can take (relayed
as written, passed through, inspected; the proxy's own tools/list too) writes to and reads from the
upstream through one UpstreamConnection, so the recorder sees exactly the bytes that crossed, and parses
them on the side with httptools, as the data plane does: requests one after another on a connection,
each answered in turn. The data plane does no more work for it than handing over each piece; with no
recorder it does none at all. A response's event stream is cut into its events, each timed.

stdio: a `StdioRecorder` is handed the lines the server received (after the proxy's faults, if any) and
the lines it sent (before them), each timed.

Secrets are redacted before anything is written (chaosproxy.cassette.redact). What is held stays bounded:
a body is kept up to MAX_BODY bytes, the rest left out and the response's end `cut` there.
"""

from __future__ import annotations

import time
from collections import deque
from typing import TYPE_CHECKING

import httptools

from chaosproxy.cassette.format import CassetteWriter, Event, Exchange, Frame, Request, Response, header
from chaosproxy.cassette.redact import Redactor
from chaosproxy.protocols.streams import SseSplitter
from chaosproxy.telemetry.log import ops

if TYPE_CHECKING:
    from chaosproxy.adapters.h1 import UpstreamConnection

MAX_BODY = 64 << 20  # bytes of one body (request or response) kept; a longer one is cut there


class _Pending:
    """One exchange on a connection: its request as it is sent, then its response as it comes."""

    __slots__ = ("seq", "started", "method", "target", "headers", "body", "status", "reason", "response_headers",
                 "t_head", "pieces", "events", "splitter", "kept", "over")

    def __init__(self, seq: int, started: float) -> None:
        self.seq = seq
        self.started = started  # perf_counter at the request's first byte
        self.method = ""
        self.target = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.body: list[bytes] = []
        self.status: int | None = None
        self.reason = b""
        self.response_headers: list[tuple[bytes, bytes]] = []
        self.t_head = 0.0
        self.pieces: list[bytes] = []
        self.events: list[Event] | None = None
        self.splitter: SseSplitter | None = None
        self.kept = 0  # body bytes held, request and response each up to MAX_BODY
        self.over = False  # a body went past MAX_BODY: what was left out makes the end `cut`

    def keep(self, data: bytes) -> bytes:
        """What of `data` fits under MAX_BODY."""
        room = MAX_BODY - self.kept
        if len(data) > room:
            self.over, data = True, data[:max(room, 0)]
        self.kept += len(data)
        return data


class _Sent:
    """httptools callbacks for what goes to the upstream."""

    def __init__(self, conn: _Connection) -> None:
        self.conn = conn
        self.pending: _Pending | None = None

    def on_message_begin(self) -> None:
        recorder = self.conn.recorder
        self.pending = _Pending(recorder.next_seq(), time.perf_counter())

    def on_url(self, url: bytes) -> None:
        assert self.pending is not None
        self.pending.target += url

    def on_header(self, name: bytes, value: bytes) -> None:
        assert self.pending is not None
        self.pending.headers.append((name, value))

    def on_headers_complete(self) -> None:
        assert self.pending is not None
        self.pending.method = self.conn.requests.get_method().decode("latin-1")
        self.pending.kept = 0
        self.conn.waiting.append(self.pending)  # an upstream may answer before the body is all there

    def on_body(self, body: bytes) -> None:
        assert self.pending is not None
        self.pending.body.append(self.pending.keep(body))


class _Received:
    """httptools callbacks for what comes back."""

    def __init__(self, conn: _Connection) -> None:
        self.conn = conn
        self.informational = False

    def _answering(self) -> _Pending:
        if not self.conn.waiting:
            raise ValueError("a response to no request")
        return self.conn.waiting[0]

    def on_message_begin(self) -> None:
        pending = self._answering()
        pending.reason, pending.response_headers = b"", []

    def on_status(self, reason: bytes) -> None:
        self._answering().reason += reason

    def on_header(self, name: bytes, value: bytes) -> None:
        self._answering().response_headers.append((name, value))

    def on_headers_complete(self) -> None:
        pending, conn = self._answering(), self.conn
        status = conn.responses.get_status_code()
        if 100 <= status < 200 and status != 101:
            self.informational = True
            pending.response_headers = []
            return
        pending.status = status
        pending.kept = 0
        pending.t_head = time.perf_counter() - pending.started
        headers = {name.lower(): value for name, value in pending.response_headers}
        if b"text/event-stream" in headers.get(b"content-type", b"") and \
                headers.get(b"content-encoding", b"identity") == b"identity":
            pending.events, pending.splitter = [], SseSplitter()
        if status == 101:  # a tunnel from now on: nothing more is HTTP
            conn.finish("complete")
            conn.broken = True
        elif pending.method == "HEAD":  # httptools cannot be told: the head is the whole response
            conn.finish("complete")
            conn.responses = httptools.HttpResponseParser(self)

    def on_body(self, body: bytes) -> None:
        pending = self._answering()
        body = pending.keep(body)
        if pending.splitter is None:
            pending.pieces.append(body)
            return
        assert pending.events is not None
        now = time.perf_counter() - pending.started
        pending.events.extend(Event(now, bytes(event)) for event in pending.splitter.feed(body))

    def on_message_complete(self) -> None:
        if self.informational:
            self.informational = False
        else:
            self.conn.finish("complete")


class _Connection:
    """One upstream connection's bytes, parsed both ways."""

    def __init__(self, recorder: HttpRecorder, upstream: str) -> None:
        self.recorder = recorder
        self.upstream = upstream
        self.waiting: deque[_Pending] = deque()  # sent (its head at least), not yet answered in full
        self.broken = False  # a parser failed, or the connection became a tunnel: nothing more is read
        self.requests = httptools.HttpRequestParser(_Sent(self))
        self.responses = httptools.HttpResponseParser(_Received(self))

    def feed(self, parser: httptools.HttpRequestParser | httptools.HttpResponseParser, data: bytes) -> None:
        if self.broken:
            return
        try:
            parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self.broken = True
        except (httptools.HttpParserError, ValueError) as exc:
            self.broken = True
            ops.warning("recording: the exchanges with %s stop being recorded on one connection: %s",
                        self.upstream, exc)

    def finish(self, end: str) -> None:
        pending = self.waiting.popleft()
        self.recorder.write(self, pending, end)

    def close(self, end: str) -> None:
        """The connection ended, or the recording: a response under way is written as it got."""
        if self.waiting and self.waiting[0].status is not None:
            pending = self.waiting[0]
            headers = {name.lower() for name, _ in pending.response_headers}
            whole = b"content-length" not in headers and b"transfer-encoding" not in headers and end == "cut"
            self.finish("complete" if whole else "open" if pending.events is not None else end)
        self.recorder.unanswered += len(self.waiting)
        self.waiting.clear()


class HttpRecorder:
    """The byte tap (h1.ByteTap) that records what crosses every upstream connection into a cassette."""

    def __init__(self, writer: CassetteWriter, redactor: Redactor) -> None:
        self.writer = writer
        self.redactor = redactor
        self.started = time.perf_counter()
        self.connections: dict[UpstreamConnection, _Connection] = {}
        self.seq = 0
        self.unanswered = 0
        self.redacted: dict[str, int] = {}

    def next_seq(self) -> int:
        self.seq += 1
        return self.seq

    def _connection(self, conn: UpstreamConnection) -> _Connection:
        state = self.connections.get(conn)
        if state is None:
            pool = conn.pool
            upstream = f"{'https' if pool.tls is not None else 'http'}://{pool.host}:{pool.port}"
            state = self.connections[conn] = _Connection(self, upstream)
        return state

    # h1.ByteTap
    def sent(self, conn: UpstreamConnection, data: bytes) -> None:
        state = self._connection(conn)
        state.feed(state.requests, data)

    def received(self, conn: UpstreamConnection, data: bytes) -> None:
        state = self._connection(conn)
        state.feed(state.responses, data)

    def closed(self, conn: UpstreamConnection) -> None:
        state = self.connections.pop(conn, None)
        if state is not None:
            state.close("cut")

    def write(self, conn: _Connection, pending: _Pending, end: str) -> None:
        """One exchange, redacted, to the cassette."""
        found: list[str] = []
        redact = self.redactor
        request_headers = _text(pending.headers)
        response_headers = _text(pending.response_headers)
        body = b"".join(pending.body)
        request = Request(pending.method, redact.target(pending.target.decode("latin-1"), "request", found),
                          redact.headers(request_headers, "request", found),
                          redact.body(body, header(request_headers, "content-type"), "request", found))
        events = pending.events
        if events is not None and pending.splitter is not None and (rest := pending.splitter.rest()):
            events.append(Event(time.perf_counter() - pending.started, bytes(rest)))
        response = Response(
            pending.status or 0, pending.reason.decode("latin-1"), redact.headers(response_headers, "response", found),
            pending.t_head,
            redact.body(b"".join(pending.pieces), header(response_headers, "content-type"), "response", found),
            [Event(event.t, redact.event(event.data, "response", found)) for event in events]
            if events is not None else None,
            time.perf_counter() - pending.started, "cut" if pending.over else end)
        for place in found:
            self.redacted[place] = self.redacted.get(place, 0) + 1
        self.writer.write(Exchange(pending.seq, pending.started - self.started, conn.upstream, request, response,
                                   found))

    def close(self) -> None:
        """The recording ends: streams still open are written as far as they got, then the cassette is sorted."""
        for state in self.connections.values():
            state.close("open")
        self.connections.clear()
        self.writer.close(redacted=dict(sorted(self.redacted.items())), exchanges=self.seq - self.unanswered,
                          unanswered=self.unanswered)


class StdioRecorder:
    """Records a stdio session's lines: `frame("client", data)` for what reached the server, `frame("server",
    data)` for what it wrote; pieces of a line are joined until its newline."""

    def __init__(self, writer: CassetteWriter, redactor: Redactor) -> None:
        self.writer = writer
        self.redactor = redactor
        self.started = time.perf_counter()
        self.seq = 0
        self.partial = {"client": b"", "server": b""}
        self.redacted: dict[str, int] = {}

    def frame(self, side: str, data: bytes) -> None:
        buffered = self.partial[side] + data
        *lines, self.partial[side] = buffered.split(b"\n")
        for line in lines:
            self._write(side, line.removesuffix(b"\r"))

    def _write(self, side: str, line: bytes) -> None:
        found: list[str] = []
        line = self.redactor.json(line, "client" if side == "client" else "server", found)
        for place in found:
            self.redacted[place] = self.redacted.get(place, 0) + 1
        self.seq += 1
        self.writer.write(Frame(self.seq, time.perf_counter() - self.started, side, line, found))

    def close(self) -> None:
        for side, rest in self.partial.items():
            if rest:
                self._write(side, rest)
        self.writer.close(redacted=dict(sorted(self.redacted.items())), frames=self.seq)


def _text(headers: list[tuple[bytes, bytes]]) -> list[tuple[str, str]]:
    return [(name.decode("latin-1"), value.decode("latin-1")) for name, value in headers]
