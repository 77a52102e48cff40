"""The upstream side: one keep-alive connection to an upstream (`UpstreamConnection`), serving one
request at a time for a `ResponseSink`, relaying a response as the upstream wrote it when it may, and the
pool of idle connections to one origin (`UpstreamPool`). A `ByteTap` sees every byte that crosses them.
"""

from __future__ import annotations

import asyncio
import re
import socket
import ssl
from typing import TYPE_CHECKING, Protocol, cast

import httptools

from chaosproxy.adapters.errors import UpstreamError
from chaosproxy.adapters.h1.bodies import HIGH_WATER, LOW_WATER, Producer
from chaosproxy.adapters.h1.heads import NO_BODY_STATUSES, Head, Headers, as_written
from chaosproxy.adapters.h1.wire import _Wire

if TYPE_CHECKING:
    from chaosproxy.adapters.h1.client import ClientConnection

UNKNOWN_LEFT = -(1 << 62)  # UpstreamConnection._left of a body whose size is not known (chunked)
_LAST_CHUNK = re.compile(rb"(?:^|\r\n)0+(?:;[^\r\n]*)?\r\n(?:[^\r\n]+\r\n)*\r\n")


class ResponseSink(Protocol):
    """Who receives the response events of an upstream connection (a pass-through or an inspector)."""

    as_is: int  # AS_IS_*: whether the response may go to the client as the upstream wrote it

    def informational(self, status: int, reason: bytes, headers: Headers) -> None: ...
    def response_head(self, head: Head) -> None: ...
    def response_as_is(self, status: int) -> None: ...
    def response_body(self, data: bytes) -> None: ...
    def response_end(self, trailers: Headers) -> None: ...
    def upstream_failed(self, error: BaseException) -> None: ...


AS_IS_NEVER, AS_IS_NO_EVENTS, AS_IS = 0, 1, 2  # ResponseSink.as_is


class ByteTap(Protocol):
    """Who watches the bytes of upstream connections (a cassette recorder): each piece sent and received
    as it goes, and the connection's end. Every path to an upstream writes and reads through
    UpstreamConnection, so one tap there sees all of them; with none set (the default) it costs a check."""

    def sent(self, conn: UpstreamConnection, data: bytes) -> None: ...
    def received(self, conn: UpstreamConnection, data: bytes) -> None: ...
    def closed(self, conn: UpstreamConnection) -> None: ...


class UpstreamConnection(_Wire):
    """One keep-alive connection to an upstream; it serves one request at a time for a `sink`."""

    def __init__(self, pool: UpstreamPool) -> None:
        self.pool = pool
        self.tap = pool.tap
        self.parser = httptools.HttpResponseParser(self)
        self.sink: ResponseSink | None = None
        self.head_request = False
        self.request_sent = False  # the whole request (head and body) is written
        self.reused = False
        self.closed = False
        self.response_started = False
        self.in_body = False
        self.close_delimited = False
        self.tunnel: ClientConnection | None = None
        self.upgraded = False  # a 101 came: the connection is a tunnel now, never pooled
        self.tunnel_pending = bytearray()
        # the client a pass-through relays to: its writes are corked while a response is parsed, and its
        # reading pauses while this connection cannot take more
        self.client: ClientConnection | None = None
        self._out: list[bytes] | None = None
        self._drain: asyncio.Future[None] | None = None
        self._writing_paused = False
        self._headers: Headers = []
        self._trailers: Headers | None = None
        self._reason = b""
        self._reading_paused = False
        self._keep_alive = False
        # A response relayed as it came (`as_is`): its head and body go to the client as the bytes
        # arrive, parsed on the side only for its end and size (`body_bytes`).
        self.as_is = False
        self.body_bytes = 0
        self._left = UNKNOWN_LEFT  # of a response relayed as it came: its body bytes not read yet (see _stray)
        self._ended = False  # a response relayed as it came ended in the piece being read (see on_message_complete)
        self._piece = self._head_piece = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # (a uvloop transport is none, but quacks like one)
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.transport.set_write_buffer_limits(HIGH_WATER, LOW_WATER)

    def begin(self, sink: ResponseSink, *, head_request: bool) -> None:
        """Serve one request: its response goes to `sink`."""
        self.sink = sink
        self.head_request = head_request
        self.request_sent = False
        self.response_started = False
        self.in_body = False
        self.close_delimited = False
        self.as_is = False
        self.body_bytes = 0
        self._mid_message = False
        if self._reading_paused:
            self.resume_reading()

    def send(self, data: bytes) -> None:
        if self.tap is not None:
            self.tap.sent(self, data)
        if self._out is not None:
            self._out.append(data)
        elif not self.closed and not self.transport.is_closing():
            self.transport.write(data)

    def _writable(self) -> bool:
        return not self.closed and not self.transport.is_closing()

    def _feeder(self) -> Producer | None:
        return self.client if self.client is not None else self.tunnel

    def _gone(self) -> BaseException | None:
        return UpstreamError("the upstream closed the connection") if self.closed else None

    def data_received(self, data: bytes) -> None:
        if self.tap is not None:
            self.tap.received(self, data)
        if self.upgraded:
            self._to_tunnel(data)
            return
        if self.sink is None:  # nothing asked: a server talking out of turn is not to be trusted
            self.transport.abort()
            return
        client = self.client
        if client is not None:
            client.cork()
            if self.as_is:
                client.write(data)
                if self._left != UNKNOWN_LEFT:
                    self._left -= len(data)
        self._piece = None if self._mid_message else data
        try:
            self.parser.feed_data(data)
            if self._ended:
                self._ended = False
                if client is not None and not data.endswith(b"0\r\n\r\n") and (stray := self._stray(data)):
                    client.unwrite(stray)  # blank lines after the response, which the parser skips
                self._complete(self._trailers or [])
        except httptools.HttpParserUpgrade as exc:
            self._to_tunnel(data[exc.args[0]:])
        except httptools.HttpParserError as exc:
            if self._ended and client is not None and (stray := self._stray(data)) is not None:
                self._ended = False  # the response is whole: it goes, the rest does not, nor the connection
                client.unwrite(stray)
                self._keep_alive = False
                self._complete(self._trailers or [])
                return
            error = UpstreamError(f"malformed response from upstream: {exc}")
            if self._ended:  # the rest of the piece, relayed with the response, is another: none of it goes
                self._ended = False
                if client is not None:
                    client.discard_corked()
                error = UpstreamError("the upstream sent a second response after the one asked for")
            self._fail(error)
            self.transport.abort()
        finally:
            self._piece = self._head_piece = None
            if client is not None:
                client.uncork()

    def _stray(self, data: bytes) -> int | None:
        """How many bytes at the end of `data`, whose beginning ended a response relayed as it came,
        are not that response's (None if that cannot be told). Exact for a Content-Length body; a
        chunked one ends at the first last-chunk and trailers in `data`."""
        if self._left != UNKNOWN_LEFT:
            return max(-self._left, 0)
        end = _LAST_CHUNK.search(data)
        return len(data) - end.end() if end is not None else None

    def _to_tunnel(self, data: bytes) -> None:
        if self.tunnel is not None:
            self.tunnel.write(data)
        else:
            self.tunnel_pending += data

    def start_tunnel(self, client: ClientConnection) -> None:
        """After a 101: the upstream's bytes go to `client` as they are, both ways."""
        self.tunnel = client
        if self.tunnel_pending:
            client.write(bytes(self.tunnel_pending))
            self.tunnel_pending.clear()
        client.start_tunnel(self)
        if self._writing_paused:
            client.pause_reading()

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.pool.forget(self)
        if self.tap is not None:
            self.tap.closed(self)
        if self.upgraded:
            if self.tunnel is not None:
                self.tunnel.transport.close()
            return
        self._end_drain(UpstreamError("the upstream closed the connection"))
        if self.sink is not None:
            if self.in_body and self.close_delimited:
                self._complete([])
            else:
                self._fail(UpstreamError("the upstream closed the connection" +
                                         (" mid-body" if self.in_body else " before answering")))

    def pause_reading(self) -> None:
        if not self._reading_paused and not self.closed:
            self._reading_paused = True
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self._reading_paused and not self.closed:
            self._reading_paused = False
            self.transport.resume_reading()

    # httptools callbacks
    def on_message_begin(self) -> None:
        if self._ended:  # data_received says what it was
            raise UpstreamError("a second response in one piece")
        self._headers = []
        self._trailers = None
        self._reason = b""
        self.response_started = True
        self._mid_message = True  # a message began: the piece it starts, if it starts one
        self._head_piece, self._piece = self._piece, None

    def on_status(self, reason: bytes) -> None:
        self._reason += reason

    def on_headers_complete(self) -> None:
        parser = self.parser
        status = parser.get_status_code()
        sink = self.sink
        assert sink is not None
        if 100 <= status < 200 and status != 101:
            sink.informational(status, self._reason, self._headers)
            return
        if sink.as_is and (piece := self._head_piece) is not None and self.client is not None and \
                status != 101 and piece.startswith(b"HTTP/1.1 ") and parser.should_keep_alive() and \
                (written := as_written(piece, self._headers, sink.as_is == AS_IS)) is not None:
            relayed, length = written
            self.as_is = self.in_body = self._keep_alive = True
            self._trailers = []
            if status in NO_BODY_STATUSES:
                length = 0
            # what is left of the body after this piece (negative: the piece holds more than the response)
            self._left = UNKNOWN_LEFT if length < 0 else length - (len(piece) - piece.find(b"\r\n\r\n") - 4)
            self.client.write(relayed)  # the head and what came of the body with it; the rest as it comes
            sink.response_as_is(status)
            return
        head = Head(self._headers, parser.get_http_version(), parser.should_keep_alive())
        head.status = status
        head.reason = self._reason
        head.upgrade = self.upgraded = status == 101
        self._trailers = []
        self.in_body = True
        self._keep_alive = head.keep_alive
        self.close_delimited = head.length is None and not head.chunked and status not in NO_BODY_STATUSES \
            and not self.head_request
        sink.response_head(head)
        if self.head_request:  # httptools cannot be told the request was HEAD: the head is the whole reply
            self.parser = httptools.HttpResponseParser(self)
            self._complete([])

    def on_body(self, body: bytes) -> None:
        if self.as_is:
            self.body_bytes += len(body)
        elif self.sink is not None and self.in_body:
            self.sink.response_body(body)

    def on_message_complete(self) -> None:
        self._mid_message = False
        if self.as_is:  # its pieces went to the client whole: it ends once the rest of this one is known
            self._ended = True  # to hold no other response (see data_received)
        elif self.in_body and not self.head_request:
            self._complete(self._trailers or [])

    def _complete(self, trailers: Headers) -> None:
        sink, self.sink = self.sink, None
        self.in_body = False
        self.client = None
        keep = self._keep_alive and not self.close_delimited and not self.closed
        if sink is not None:
            sink.response_end(trailers)
        if self.upgraded:
            return
        if keep and self.request_sent:
            self.pool.release(self)
        elif not self.closed:
            self.uncork()
            self.transport.close()

    def _fail(self, error: BaseException) -> None:
        sink, self.sink = self.sink, None
        self.client = None
        if sink is not None:
            sink.upstream_failed(error)

    def discard(self, sink: ResponseSink) -> None:
        """Never reuse this connection: `sink`'s exchange was abandoned half way (no-op once it is over)."""
        if self.sink is not sink:
            return
        self.sink = None
        self.client = None
        if not self.closed:
            self.uncork()
            self.transport.close()


class UpstreamPool:
    """Idle keep-alive connections to one upstream origin."""

    MAX_IDLE = 256

    def __init__(self, host: str, port: int, *, connect_timeout: float, tls: ssl.SSLContext | None = None) -> None:
        self.tls = tls
        self.host = host
        self.port = port
        self.connect_timeout = connect_timeout
        self.idle: list[UpstreamConnection] = []
        self.tap: ByteTap | None = None  # each new connection's (recording: `chaosproxy run --record`)

    def take_idle(self) -> UpstreamConnection | None:
        while self.idle:
            conn = self.idle.pop()
            if not conn.closed and not conn.transport.is_closing():
                conn.reused = True
                return conn
        return None

    async def connect(self) -> UpstreamConnection:
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(self.connect_timeout):
            _, conn = await loop.create_connection(lambda: UpstreamConnection(self), self.host, self.port,
                                                   ssl=self.tls)
        return conn

    async def acquire(self) -> UpstreamConnection:
        return self.take_idle() or await self.connect()

    def release(self, conn: UpstreamConnection) -> None:
        if len(self.idle) < self.MAX_IDLE:
            self.idle.append(conn)
        else:
            conn.transport.close()

    def forget(self, conn: UpstreamConnection) -> None:
        if conn in self.idle:
            self.idle.remove(conn)

    def close(self) -> None:
        for conn in self.idle:
            conn.transport.close()
        self.idle.clear()
