"""The agent's side: its connection (`ClientConnection`) parses requests and hands them to the proxy
(`Handler`) one at a time, in order; each request and its response is a `ClientExchange`. What a
connection may cost (`ClientLimits`) and the answers that refuse a request in the proxy's name are here.
"""

from __future__ import annotations

import asyncio
import socket
from collections import deque
from collections.abc import Callable, Sequence
from typing import Protocol, cast

import httptools

from chaosproxy.adapters.h1.bodies import HIGH_WATER, LOW_WATER, NO_BODY, SENT_BODY, Body, Producer, ignore
from chaosproxy.adapters.h1.heads import (
    NO_BODY_STATUSES,
    REQUEST_SPECIAL,
    Head,
    Headers,
    chunk,
    last_chunk,
    method_name,
    serialize_head,
)
from chaosproxy.adapters.h1.upstream import UpstreamConnection
from chaosproxy.adapters.h1.wire import _Wire
from chaosproxy.telemetry.log import ops

LINGER_S = 2.0  # how long a refused client's input is read and dropped before its connection closes
MAX_QUEUED_REQUESTS = 8  # pipelined requests parsed ahead of the one being answered before reading pauses


class ClientLimits:
    """What an agent's connection may cost: the size of a request head, and how long it may take to
    send one or sit idle between requests. `clock` is coarse time (seconds), advanced by the sweep that
    enforces the timeouts (`HttpProxy`), so a request costs no clock read."""

    __slots__ = ("max_line", "max_head", "head_timeout", "idle_timeout", "clock", "refused")

    def __init__(self, max_line: int = 8 << 10, max_head: int = 64 << 10, head_timeout: float = 60.0,
                 idle_timeout: float = 75.0) -> None:
        self.max_line = max_line  # the request line, or one header line
        self.max_head = max_head  # the whole head
        self.head_timeout = head_timeout
        self.idle_timeout = idle_timeout
        self.clock = 0.0
        # connections the proxy closed or would not take, by reason
        self.refused: dict[str, int] = {"head_too_large": 0, "head_timeout": 0, "idle_timeout": 0, "out_of_files": 0}


class HeadTooLarge(Exception):
    """A request line, header line or head over its limit (answered 431)."""


def refusal(status: bytes, error: bytes, message: bytes) -> bytes:
    """A whole response, made once at import, refusing a request in the proxy's name and closing the
    connection (what is answered when a limit is reached must not need memory or files itself)."""
    body = b'{"error":{"code":%b,"message":"chaosproxy: %b"}}' % (status.split()[0], message)
    return serialize_head(b"HTTP/1.1 %b\r\n" % status, [
        (b"Content-Type", b"application/json"), (b"Content-Length", b"%d" % len(body)), (b"Connection", b"close"),
        (b"X-Chaosproxy-Error", error)]) + body


BAD_REQUEST = refusal(b"400 Bad Request", b"bad-request", b"malformed HTTP request")
REQUEST_TIMEOUT = refusal(b"408 Request Timeout", b"head-timeout", b"the request head took too long")
INTERNAL_ERROR = refusal(b"502 Bad Gateway", b"internal", b"internal error (see its log)")
HEAD_TOO_LARGE = refusal(b"431 Request Header Fields Too Large", b"head-too-large",
                         b"the request line, a header line or the head is over its limit")


class Handler(Protocol):
    """The proxy as a client connection sees it: called once per request, in order, when it is its turn."""

    session_header: bytes  # lower case; its first value in a request is `Head.watched`
    limits: ClientLimits
    connections: set[ClientConnection]  # open ones, for `ClientConnection.overdue`


    def handle(self, exchange: ClientExchange) -> None: ...

    def relay_plain(self, client: ClientConnection, target: bytes, headers: Headers,
                    piece: bytes) -> ClientExchange | None:
        """Take a request whose head starts `piece` and that no other request waits before, at its head
        (the plain path: no Head made, see `ClientExchange`); None leaves it to `handle`."""


class ClientExchange:
    """One request on a client connection and the response to it, written in order."""

    __slots__ = ("conn", "head", "body", "started", "chunked_out", "close_after", "no_body", "finished",
                 "on_client_gone", "upstream", "piece")

    def __init__(self, conn: ClientConnection, head: Head | None, piece: bytes | None) -> None:
        """`head` None: a request on the plain path (keep-alive, not HEAD, sent on whole with its head),
        given its Head only if the general path takes over."""
        self.conn = conn
        self.piece = piece  # the input the request came in, when it starts it: the head may go on as written
        if head is None:  # self.head stays unset until then
            self.body, self.close_after, self.no_body = SENT_BODY, False, False
        else:
            self.head = head
            self.body = Body(conn) if head.has_body else NO_BODY
            self.close_after = not head.keep_alive
            self.no_body = head.method == "HEAD"
        self.started = False  # response head written
        self.chunked_out = False
        self.finished = False
        self.on_client_gone: Callable[[], object] | None = None
        self.upstream: Producer | None = None  # paused while the client cannot take more (pass-through)

    @property
    def peer(self) -> str:
        return self.conn.peer

    @property
    def gone(self) -> bool:
        return self.conn.lost

    def send_continue(self) -> None:
        """Answer `Expect: 100-continue` in the proxy's name (it is about to read the body itself)."""
        if self.head.expect_continue and not self.started:
            self.head.expect_continue = False
            self.conn.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def informational(self, status: int, reason: bytes, headers: Headers) -> None:
        """Relay a 1xx response (100 Continue, 103 Early Hints) ahead of the final one."""
        if not self.started:
            if status == 100:
                self.head.expect_continue = False
            self.conn.write(serialize_head(b"HTTP/1.1 %d %b\r\n" % (status, reason), headers))

    def start(self, status: int, reason: bytes, headers: Headers, length: int | None, *,
              no_body: bool = False) -> None:
        """Write the response head. `headers` hold no framing headers; `length` (None: unknown) is the
        body's size, sent as Content-Length also when there is no body (HEAD: what a GET would get)."""
        self.started = True
        no_body = no_body or self.no_body or status in NO_BODY_STATUSES or status < 200
        framing = b""
        if length is not None and status not in NO_BODY_STATUSES:
            framing = b"Content-Length: %d\r\n" % length
        elif not no_body:
            if self.head.version == "1.1":
                self.chunked_out = True
                framing = b"Transfer-Encoding: chunked\r\n"
            else:
                self.close_after = True  # a close-delimited body is the only way to an HTTP/1.0 client
        if no_body:
            self.no_body = True
        if self.head.expect_continue and self.head.has_body and not self.body.done:
            self.close_after = True  # the client may still send the body we never asked for
        if self.close_after:
            framing += b"Connection: close\r\n"
        elif self.head.version == "1.0":
            framing += b"Connection: keep-alive\r\n"
        self.conn.write(serialize_head(b"HTTP/1.1 %d %b\r\n" % (status, reason or b"-"), headers, framing))

    def write(self, data: bytes) -> None:
        if data and not self.no_body:
            self.conn.write(chunk(data) if self.chunked_out else data)

    def end(self, trailers: Sequence[tuple[bytes, bytes]] = ()) -> None:
        """The response is complete: the next request on this connection may be answered."""
        if self.chunked_out and not self.no_body:
            self.conn.write(last_chunk(trailers))
        self.finish()

    def finish(self) -> None:
        if not self.finished:
            self.finished = True
            self.on_client_gone = None  # its call's, which refers back here: freed now, not by the GC
            self.conn.exchange_done(self)

    def close(self) -> None:
        """Close the connection once what was written is flushed (a truncated body ends like this)."""
        self.close_after = True
        self.conn.uncork()
        self.conn.transport.close()
        self.finish()

    def abort(self, *, reset: bool = False) -> None:
        """Drop the connection now; with `reset`, with a TCP RST as a crashed server would."""
        transport = self.conn.transport
        if reset and (sock := transport.get_extra_info("socket")) is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        self.conn.uncork()  # what was relayed before the break still goes first
        transport.abort()
        self.finish()

    async def drain(self) -> None:
        await self.conn.drain()


class ClientConnection(_Wire):
    """One agent connection: parses requests, hands them to the handler one at a time, in order."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.special = REQUEST_SPECIAL | {handler.session_header}
        self.parser = httptools.HttpRequestParser(self)
        self.peer = "-"
        self.queue: deque[ClientExchange] = deque()
        self.parsing: ClientExchange | None = None  # whose body the parser is reading
        self.lost = False
        self._url = b""
        self._headers: Headers = []
        self._trailers: Headers | None = None
        self._reading_paused = 0
        self._drain: asyncio.Future[None] | None = None
        self._writing_paused = False
        self.tunnel: UpstreamConnection | None = None  # after a 101: bytes go there unparsed
        self.tunnel_pending = bytearray()
        self.upgrading = False
        self._out: list[bytes] | None = None  # corked: what one event's callbacks write, sent as one
        self.receiving = False  # inside data_received: upstream writes are corked until it returns
        self._piece = self._head_piece = None
        self.corked: list[UpstreamConnection] = []
        self.limits = limits = handler.limits
        self.in_head = False  # a request head has begun and is not complete
        self.head_size = 0  # the bytes of the pieces of input it has been arriving in
        self.header_bytes = 0  # the bytes of its header fields (and trailers) parsed so far
        self.lingering = False  # refused: what the client still sends is read and dropped until it stops
        self.since = limits.clock  # when the head began, or (nothing queued) when the connection fell idle

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.handler.connections.add(self)
        self.transport = cast(asyncio.Transport, transport)  # (a uvloop transport is none, but quacks like one)
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        peer = transport.get_extra_info("peername")
        self.peer = peer[0] if isinstance(peer, tuple) else "-"
        self.transport.set_write_buffer_limits(HIGH_WATER, LOW_WATER)

    def data_received(self, data: bytes) -> None:
        if self.lingering:
            return
        if self.upgrading:
            if self.tunnel is not None:
                self.tunnel.send(data)
            else:
                self.tunnel_pending += data
                if len(self.tunnel_pending) > HIGH_WATER:  # the upstream has not switched protocols (yet)
                    self.pause_reading()
            return
        self.receiving = True
        self._piece = None if self._mid_message else data
        try:
            self.parser.feed_data(data)
            if self.in_head:
                self.head_size += len(data)
                if self.head_size > self.limits.max_head:
                    raise HeadTooLarge(f"a request head over {self.limits.max_head} bytes")
        except httptools.HttpParserUpgrade as exc:
            self.upgrading = True
            self.tunnel_pending += data[exc.args[0]:]
        except (httptools.HttpParserError, HeadTooLarge) as exc:
            if isinstance(exc, HeadTooLarge) or isinstance(exc.__context__, HeadTooLarge):
                self.limits.refused["head_too_large"] += 1
                self._bad_input(exc, HEAD_TOO_LARGE)
            elif isinstance(exc, httptools.HttpParserCallbackError):  # the proxy's own failure, not the agent's
                ops.error("internal error on a request from %s", self.peer, exc_info=exc.__context__ or exc)
                self._bad_input(exc, INTERNAL_ERROR)
            else:
                self._bad_input(exc)
        finally:
            self.receiving = False
            self._piece = self._head_piece = None
            while self.corked:
                self.corked.pop().uncork()

    def eof_received(self) -> bool:
        if self.parsing is not None and not self.parsing.body.done:
            self.parsing.body.fail(ConnectionResetError("the client closed before the end of its body"))
        return False  # a client that stops sending has gone: its pending calls end (as aiohttp had it)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.handler.connections.discard(self)
        if self.tunnel is not None:
            self.tunnel.transport.close()
        gone = ConnectionResetError("the client went away")
        for exchange in list(self.queue):
            exchange.body.fail(gone)
            if not exchange.finished and exchange.on_client_gone is not None:
                exchange.on_client_gone()
        self.queue.clear()
        self._end_drain(gone)

    def _feeder(self) -> Producer | None:
        if self.tunnel is not None:
            return self.tunnel
        return self.queue[0].upstream if self.queue else None

    def _gone(self) -> BaseException | None:
        return ConnectionResetError("the client went away") if self.lost else None

    # httptools callbacks
    def on_message_begin(self) -> None:
        self._url = b""
        self._headers = []
        self._trailers = None
        self._mid_message = True  # a message began: the piece it starts, if it starts one
        self._head_piece, self._piece = self._piece, None
        self.in_head = True
        self.head_size = self.header_bytes = 0
        self.since = self.limits.clock

    def on_url(self, url: bytes) -> None:
        if len(self._url) + len(url) > self.limits.max_line:
            raise HeadTooLarge(f"a request line over {self.limits.max_line} bytes")
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        size = len(name) + len(value)
        self.header_bytes += size
        if size > self.limits.max_line or self.header_bytes > self.limits.max_head:
            raise HeadTooLarge(f"a header line over {self.limits.max_line} bytes or headers over "
                               f"{self.limits.max_head}")
        if self._trailers is not None:
            self._trailers.append((name, value))
        else:
            self._headers.append((name, value))

    def on_headers_complete(self) -> None:
        self.in_head = False
        parser = self.parser
        if self._head_piece is not None and not self.queue:
            exchange = self.handler.relay_plain(self, self._url, self._headers, self._head_piece)
            if exchange is not None:  # its body went with its head: what the parser reads of it is not kept
                self._trailers = []
                self.queue.append(exchange)
                return
        head = Head(self._headers, parser.get_http_version(), parser.should_keep_alive(), self.special,
                    self.handler.session_header)
        method = parser.get_method()
        head.method = method_name(method)
        head.target = self._url
        head.upgrade = parser.should_upgrade()
        self._trailers = []
        exchange = ClientExchange(self, head, self._head_piece)
        self.parsing = exchange
        self.queue.append(exchange)
        if len(self.queue) == 1:
            self.handler.handle(exchange)
        elif len(self.queue) > MAX_QUEUED_REQUESTS:
            self.pause_reading()

    def on_body(self, body: bytes) -> None:
        exchange = self.parsing
        if exchange is not None:
            if exchange.body is NO_BODY:  # never with the parser's framing; kept apart all the same
                exchange.body = Body(self)
            exchange.body.feed(body)

    def on_message_complete(self) -> None:
        self._mid_message = False
        if self.parsing is not None:
            self.parsing.body.finish(self._trailers or [])
            self.parsing = None

    # for exchanges
    def write(self, data: bytes) -> None:
        if self._out is not None:
            self._out.append(data)
        elif not self.lost:
            self.transport.write(data)

    def _writable(self) -> bool:
        return not self.lost

    def cork_upstream(self, upstream: UpstreamConnection) -> None:
        """Writes to `upstream` made while this connection's input is parsed go out together after it."""
        if self.receiving:
            upstream.cork()
            self.corked.append(upstream)

    def pause_reading(self) -> None:
        self._reading_paused += 1
        if self._reading_paused == 1 and not self.lost:
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self._reading_paused:
            self._reading_paused -= 1
            if not self._reading_paused and not self.lost:
                self.transport.resume_reading()

    def exchange_done(self, exchange: ClientExchange) -> None:
        if not self.queue or self.queue[0] is not exchange:
            return
        self.queue.popleft()
        if self.tunnel is not None:
            return
        if exchange.close_after or self.lost:
            self.uncork()
            self.transport.close()
            return
        if not exchange.body.done:  # the response did not wait for the body: skip what is left of it
            exchange.body.pipe(ignore, ignore)
        if len(self.queue) == MAX_QUEUED_REQUESTS:
            self.resume_reading()
        if self.queue:
            self.handler.handle(self.queue[0])
        elif not self.in_head:
            self.since = self.limits.clock

    def refuse(self, refusal: bytes) -> None:
        """Answer `refusal` and close, the way nginx's lingering close does: the client's unread input is
        read and dropped for a while first, so that closing does not reset the connection and lose the
        answer before the client reads it."""
        self.lingering = True
        self.transport.write(refusal)
        if self.transport.can_write_eof():
            self.transport.write_eof()
        asyncio.get_running_loop().call_later(LINGER_S, self.transport.close)

    def overdue(self, now: float) -> str | None:
        """Whether the connection is to be closed at `now` for taking too long over a head (answered
        408) or for sitting idle with nothing asked: which timeout it met, or None."""
        if self.queue or self.lost or self.upgrading or self.lingering:
            return None  # being answered (a pipelined head waits its turn), or a tunnel
        limits = self.limits
        if self.in_head:
            if now - self.since < limits.head_timeout:
                return None
            limits.refused["head_timeout"] += 1
            self.refuse(REQUEST_TIMEOUT)
            return "head_timeout"
        if now - self.since < limits.idle_timeout:
            return None
        limits.refused["idle_timeout"] += 1
        self.transport.close()
        return "idle_timeout"

    def start_tunnel(self, upstream: UpstreamConnection) -> None:
        """After a 101: from now on the connection is a byte pipe to `upstream` both ways."""
        self.tunnel = upstream
        if self.tunnel_pending:
            upstream.send(bytes(self.tunnel_pending))
            self.tunnel_pending.clear()
        if self._writing_paused:
            upstream.pause_reading()
        while self._reading_paused:
            self.resume_reading()
        self.upgrading = True

    def _bad_input(self, exc: Exception, refusal: bytes = BAD_REQUEST) -> None:
        """Input the parser refuses (or a head over its limits): `refusal` when nothing is being
        answered, else just the end."""
        if self.parsing is not None and not self.parsing.body.done:
            self.parsing.body.fail(ConnectionResetError(f"bad request framing: {exc}"))
        if not self.queue:
            self.refuse(refusal)
        else:
            self.transport.pause_reading()
            for exchange in self.queue:
                exchange.close_after = True
