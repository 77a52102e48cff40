"""HTTP/1.1 on asyncio Protocols with httptools: client connections, pooled upstream connections, bodies.

This is the wire layer of `chaosproxy run`. It knows framing (Content-Length, chunked, close-delimited,
HEAD, 1xx, 204/304, Upgrade) and flow control, and nothing about faults: each request is handed to a
`handler` (the proxy), which either pipes it straight through (callbacks only, no task) or inspects it
in a coroutine. A head goes on as it was written when nothing in it must change (it starts a piece of
input and holds no hop-by-hop header; a request's Host is set to the upstream's); any other is
re-serialised, hop-by-hop headers out. Bodies pass piece by piece as they arrive, re-framed only where
the framing must change (a re-serialised chunked body is re-chunked).
"""

from __future__ import annotations

import asyncio
import errno
import re
import socket
import ssl
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from typing import Protocol, cast

import httptools

from chaosproxy.adapters.errors import UpstreamError
from chaosproxy.protocols import streams
from chaosproxy.telemetry.log import ops

HIGH_WATER = 256 << 10  # a side whose buffer is over this pauses its producer
LOW_WATER = 64 << 10
LINGER_S = 2.0  # how long a refused client's input is read and dropped before its connection closes
MAX_QUEUED_REQUESTS = 8  # pipelined requests parsed ahead of the one being answered before reading pauses

Headers = list[tuple[bytes, bytes]]

HOP_BY_HOP = frozenset({b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"te",
                        b"trailer", b"trailers", b"transfer-encoding", b"upgrade", b"proxy-connection"})
NO_BODY_STATUSES = frozenset({204, 304})
IDEMPOTENT = frozenset({"GET", "HEAD", "PUT", "DELETE", "OPTIONS", "TRACE"})


NO_NAMES: frozenset[bytes] = frozenset()
# the names Head's one pass over the headers stops at: hop-by-hop, framing, Expect (and Host in a request)
RESPONSE_SPECIAL = HOP_BY_HOP | {b"content-length", b"expect"}
REQUEST_SPECIAL = RESPONSE_SPECIAL | {b"host"}
METHODS = {method.encode(): method for method in ("GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS", "PATCH")}


def method_name(method: bytes) -> str:
    return METHODS.get(method) or method.decode("ascii", "replace")


class Head:
    """A request or response head as parsed: the raw header pairs plus what framing needs.

    One pass over the headers finds the framing and sorts out `forward`: the end-to-end headers, bar
    Content-Length (the proxy frames what it sends) and, in a request, Host (the upstream's is sent).
    `special` names the headers the pass stops at: RESPONSE_SPECIAL, or REQUEST_SPECIAL plus `watch`,
    a header whose first value is kept as `watched` (the agent's session).
    """

    __slots__ = ("method", "target", "status", "reason", "version", "headers", "length", "chunked",
                 "keep_alive", "upgrade", "expect_continue", "hop", "forward", "watched", "plain")

    def __init__(self, headers: Headers, version: str, keep_alive: bool,
                 special: frozenset[bytes] = RESPONSE_SPECIAL, watch: bytes = b"\0") -> None:
        self.method = ""
        self.target = b""
        self.status = 0
        self.reason = b""
        self.version = version
        self.headers = headers
        self.keep_alive = keep_alive
        self.upgrade = False
        self.expect_continue = False
        self.length: int | None = None
        self.chunked = False
        self.watched: bytes | None = None
        hop = HOP_BY_HOP
        forward: Headers = []
        plain = 0  # counts what keeps the head from going on as written: hop-by-hop headers, repeats
        for pair in headers:
            lower = pair[0].lower()
            if lower not in special:
                forward.append(pair)
                continue
            value = pair[1]
            if lower == b"content-length":
                plain += 2 if self.length is not None else 0
                self.length = int(value) if value.strip().isdigit() else None
            elif lower == b"host":
                plain += 1  # the first is free (see below)
            elif lower == b"transfer-encoding":
                self.chunked = b"chunked" in value.lower()
                plain += 2
            elif lower == b"connection":
                plain += 2
                named = {token.strip().lower() for token in value.split(b",")}
                if not named <= hop:  # Connection: keep-alive names nothing new (the set stays shared)
                    hop = hop | named
            elif lower == b"expect":
                self.expect_continue = value.strip().lower() == b"100-continue"
                forward.append(pair)
            elif lower == watch:
                if self.watched is None:
                    self.watched = value
                forward.append(pair)
            elif lower in hop:
                plain += 2
        if self.chunked:
            self.length = None
        if hop is not HOP_BY_HOP:  # Connection named more hop-by-hop headers, maybe ones already passed
            forward = [pair for pair in forward if pair[0].lower() not in hop]
        self.hop = hop
        self.forward = forward
        self.plain = plain <= 1  # no hop-by-hop header, no repeated Content-Length, one Host at most

    @property
    def has_body(self) -> bool:
        return self.chunked or bool(self.length)

    def get(self, name: bytes) -> bytes | None:
        """The first value of a header (`name` in lower case)."""
        for key, value in self.headers:
            if key.lower() == name:
                return value
        return None

    def end_to_end(self, *, keep: frozenset[bytes] = NO_NAMES, drop: frozenset[bytes] = NO_NAMES) -> Headers:
        """The headers without hop-by-hop ones (including those Connection names), bar `keep`, and `drop`."""
        if self.hop is HOP_BY_HOP:  # no Connection header naming others: the set is one of a few, kept
            hop = _HOPS.get((keep, drop))
            if hop is None:
                hop = _HOPS[keep, drop] = (HOP_BY_HOP - keep) | drop
        else:
            hop = (self.hop - keep) | drop
        return [pair for pair in self.headers if pair[0].lower() not in hop]


_HOPS: dict[tuple[frozenset[bytes], frozenset[bytes]], frozenset[bytes]] = {}
_NOT_AS_IS = HOP_BY_HOP - {b"transfer-encoding"}
_AS_IS_CHECKED = HOP_BY_HOP | {b"content-type"}  # the names `as_written` looks at
_KEEP_ALIVE_LINE = re.compile(rb"\r\n(?:connection|keep-alive):[^\r]*", re.IGNORECASE)


def as_written(piece: bytes, headers: Headers, events: bool) -> tuple[bytes, int] | None:
    """`piece`, which starts with a whole response head (`headers`), as it may reach the client: as the
    upstream wrote it when the head has no hop-by-hop header bar `Transfer-Encoding: chunked` and
    (unless `events`) is not an event stream's; without its `Connection: keep-alive` and `Keep-Alive`
    lines when those are its only others, as Node's server sends them (they say how the upstream keeps
    its connection, not how the proxy keeps the agent's), with the body's Content-Length found on the
    way (-1: none, or chunked). None: the head must be re-serialised."""
    keep_alive_lines = 0
    length = -1
    chunked = False
    for name, value in headers:
        lower = name.lower()
        if lower in _AS_IS_CHECKED:
            if keeps_alive(lower, value):
                keep_alive_lines += 1
            elif lower in _NOT_AS_IS or (lower == b"transfer-encoding" and value.strip().lower() != b"chunked") or \
                    (lower == b"content-type" and not events and b"event-stream" in value):
                return None
            elif lower == b"transfer-encoding":
                chunked = True
        elif lower == b"content-length" and value.strip().isdigit():
            length = int(value)
    relayed = without_keep_alive(piece, keep_alive_lines) if keep_alive_lines else piece
    return None if relayed is None else (relayed, -1 if chunked else length)


UNKNOWN_LEFT = -(1 << 62)  # UpstreamConnection._left of a body whose size is not known (chunked)
_LAST_CHUNK = re.compile(rb"(?:^|\r\n)0+(?:;[^\r\n]*)?\r\n(?:[^\r\n]+\r\n)*\r\n")


def keeps_alive(lower: bytes, value: bytes) -> bool:
    """Whether a header (its name in lower case) only says the connection it came on is kept alive."""
    return lower == b"keep-alive" or (lower == b"connection" and value.strip().lower() == b"keep-alive")


def without_keep_alive(piece: bytes, lines: int) -> bytes | None:
    """`piece`, which starts with a whole message head holding `lines` Connection and Keep-Alive header
    lines, without those lines (None if they are not all found in the head)."""
    blank = piece.find(b"\r\n\r\n")
    head, found = _KEEP_ALIVE_LINE.subn(b"", piece[:blank])
    return head + piece[blank:] if blank > 0 and found == lines else None


def serialize_head(first_line: bytes, headers: Headers, framing: bytes = b"") -> bytes:
    """A head on the wire: the first line, the headers as given, then `framing` (ready-made header lines)."""
    if not headers:
        return first_line + framing + b"\r\n"
    return b"".join((first_line, b"\r\n".join(map(_name_value, headers)), b"\r\n", framing, b"\r\n"))


_name_value = b": ".join  # one header line, without its CRLF, from a (name, value) pair


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(data), data)


def last_chunk(trailers: Iterable[tuple[bytes, bytes]]) -> bytes:
    return b"0\r\n" + b"".join(name + b": " + value + b"\r\n" for name, value in trailers) + b"\r\n"


class Producer(Protocol):
    """The connection a body comes from: told to stop reading while the body's consumer lags."""

    def pause_reading(self) -> None: ...
    def resume_reading(self) -> None: ...


class Body:
    """One message body as it arrives, for a consumer that pulls (async iteration) or is pushed to (pipe).

    Pieces are buffered until the consumer takes them; past HIGH_WATER the producer is paused, so a
    1 GiB body never sits in memory.
    """

    __slots__ = ("_pieces", "_size", "done", "trailers", "error", "_waiter", "_pipe", "_end", "_producer",
                 "_paused", "received")

    def __init__(self, producer: Producer | None) -> None:
        self._pieces: deque[bytes] | None = None  # made when a piece must wait (a piped body never does)
        self._size = 0
        self.done = False
        self.trailers: Headers = []
        self.error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._pipe: Callable[[bytes], None] | None = None
        self._end: Callable[[Headers], None] | None = None
        self._producer = producer
        self._paused = False
        self.received = 0

    def feed(self, data: bytes) -> None:
        self.received += len(data)
        if self._pipe is not None:
            self._pipe(data)
            return
        if self._pieces is None:
            self._pieces = deque()
        self._pieces.append(data)
        self._size += len(data)
        if self._size > HIGH_WATER and not self._paused:
            assert self._producer is not None  # (NO_BODY and SENT_BODY, which have none, are never fed)
            self._paused = True
            self._producer.pause_reading()
        self._wake()

    def finish(self, trailers: Headers) -> None:
        self.done = True
        self.trailers = trailers
        if self._end is not None:
            self._end(trailers)
        else:
            self._wake()

    def fail(self, error: BaseException) -> None:
        if not self.done:
            self.error = error
            self.done = True
            self._wake()

    def pipe(self, write: Callable[[bytes], None], end: Callable[[Headers], None]) -> None:
        """From now on, push every piece to `write` and the end to `end` (what was buffered first)."""
        while self._pieces:
            write(self._pieces.popleft())
        self._size = 0
        self._pipe = write
        if self.done and self.error is None:
            end(self.trailers)
        else:
            self._end = end
        self._resume_producer()

    def unpipe(self) -> None:
        self._pipe = self._end = None

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _resume_producer(self) -> None:
        if self._paused:
            assert self._producer is not None
            self._paused = False
            self._producer.resume_reading()

    async def read(self) -> bytes:
        """The next piece; b"" at the end. Raises the error that ended the body early."""
        while not self._pieces:
            if self.done:
                if self.error is not None:
                    raise self.error
                return b""
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        piece = self._pieces.popleft()
        self._size -= len(piece)
        if self._size < LOW_WATER:
            self._resume_producer()
        return piece

    def chunks(self) -> AsyncIterator[bytes]:
        return streams.reads(self.read)

    async def read_up_to(self, limit: int) -> tuple[bytes, bool]:
        """Up to `limit` bytes (more if a piece overshoots); True when that was the whole body."""
        pieces: list[bytes] = []
        size = 0
        while size <= limit:
            piece = await self.read()
            if not piece:
                return b"".join(pieces), True
            pieces.append(piece)
            size += len(piece)
        return b"".join(pieces), False


class _NoBody(Body):
    """The body of a request that has none (no Content-Length, no chunked): over from the start, and
    one object for all such requests, which then cost no Body of their own."""

    __slots__ = ()

    def __init__(self) -> None:
        super().__init__(None)  # never fed, so never paused
        self.done = True

    def finish(self, trailers: Headers) -> None:
        pass

    def pipe(self, write: Callable[[bytes], None], end: Callable[[Headers], None]) -> None:
        end([])

    def unpipe(self) -> None:
        pass


NO_BODY: Body = _NoBody()


class _SentBody(_NoBody):
    """The body of a request that went upstream whole with its head: what the parser still hands on of
    it has gone already."""

    __slots__ = ()

    def feed(self, data: bytes) -> None:
        pass


SENT_BODY: Body = _SentBody()


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


class _Wire(asyncio.Protocol):
    """What both ends of the relay share: header collection for httptools, corked writes, and flow control.

    While a side's transport cannot take more (over HIGH_WATER), the side that feeds it stops reading
    (`_feeder`: the other end of a pass-through or a tunnel), and a coroutine writing to it waits in
    `drain`.

    A message that starts a piece of input is known by that piece (`_head_piece`, while its head is
    parsed), so its head can go on as it was written when nothing in it must change.
    """

    _piece: bytes | None  # the piece being parsed, while no message began in it or before it
    _head_piece: bytes | None
    _mid_message = False

    transport: asyncio.Transport
    _out: list[bytes] | None
    _headers: Headers
    _trailers: Headers | None
    _drain: asyncio.Future[None] | None
    _writing_paused: bool

    def _writable(self) -> bool:
        raise NotImplementedError

    def _feeder(self) -> Producer | None:
        """Whose reading stops while this side's transport is full."""
        raise NotImplementedError

    def _gone(self) -> BaseException | None:
        """What a drain raises when this side's connection is gone (None while it is there)."""
        raise NotImplementedError

    def pause_writing(self) -> None:
        self._writing_paused = True
        if (feeder := self._feeder()) is not None:
            feeder.pause_reading()

    def resume_writing(self) -> None:
        self._writing_paused = False
        if (feeder := self._feeder()) is not None:
            feeder.resume_reading()
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)

    def _end_drain(self, error: BaseException) -> None:
        if self._drain is not None and not self._drain.done():
            self._drain.set_exception(error)

    async def drain(self) -> None:
        if (gone := self._gone()) is not None:
            raise gone
        if self._writing_paused:
            if self._drain is None or self._drain.done():
                self._drain = asyncio.get_running_loop().create_future()
            await self._drain

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._trailers is not None:
            self._trailers.append((name, value))
        else:
            self._headers.append((name, value))

    def cork(self) -> None:
        """Hold writes until `uncork`: a head and body written in one turn go out in one send."""
        if self._out is None:
            self._out = []

    def uncork(self) -> None:
        out, self._out = self._out, None
        if out and self._writable():
            self.transport.write(out[0] if len(out) == 1 else b"".join(out))

    def discard_corked(self) -> None:
        """Drop what was written since `cork`: it must not go out."""
        if self._out is not None:
            self._out.clear()

    def unwrite(self, size: int) -> None:
        """Drop the last `size` bytes written since `cork`: they must not go out."""
        out = self._out
        while out and size > 0:
            last = out.pop()
            if len(last) > size:
                out.append(last[:len(last) - size])
            size -= len(last)


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


OUT_OF_FILES = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
ACCEPT_BATCH = 64  # connections accepted per wake-up, so that one busy listener cannot starve the loop
ACCEPT_PAUSE_S = 0.5  # how long accepting stops when the process is out of files (nginx: 500 ms)
OUT_OF_FILES_LOG_S = 10.0  # at most one line this often says so


class Listener:
    """Accepts agents' connections on a listening socket, one ClientConnection each.

    The event loop's own server would do, but for one case: out of open files (EMFILE), uvloop's (libuv's)
    accepts every waiting connection and closes it at once, so agents that were queued get a reset. Here
    accepting pauses instead (as nginx does), the connections open go on being served, waiting agents
    stay in the kernel's queue until a file is free, and the limit is logged once in a while and counted.
    """

    def __init__(self, handler: Handler, sock: socket.socket) -> None:
        self.handler = handler
        self.sock = sock
        self.loop = asyncio.get_running_loop()
        self._logged_at = -OUT_OF_FILES_LOG_S
        self._closed = False
        self._setting_up: set[asyncio.Task[None]] = set()
        sock.setblocking(False)
        self.loop.add_reader(sock.fileno(), self._accept)

    def _accept(self) -> None:
        for _ in range(ACCEPT_BATCH):
            try:
                conn, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in OUT_OF_FILES:
                    self._pause(exc)
                return  # (any other error is the one connection's: it is gone; the next wake-up goes on)
            conn.setblocking(False)
            task = self.loop.create_task(self._serve(conn))
            self._setting_up.add(task)  # (the loop keeps only a weak reference)
            task.add_done_callback(self._setting_up.discard)

    async def _serve(self, conn: socket.socket) -> None:
        try:
            await self.loop.connect_accepted_socket(lambda: ClientConnection(self.handler), conn)
        except OSError:  # the agent left before its connection was set up
            conn.close()

    def _pause(self, error: OSError) -> None:
        self.handler.limits.refused["out_of_files"] += 1
        if self.loop.time() - self._logged_at >= OUT_OF_FILES_LOG_S:
            self._logged_at = self.loop.time()
            ops.warning("out of open files (%s, %d connections open): not accepting for %g s at a time until one "
                        "is free", error.strerror, len(self.handler.connections), ACCEPT_PAUSE_S)
        self.loop.remove_reader(self.sock.fileno())
        self.loop.call_later(ACCEPT_PAUSE_S, self._resume)

    def _resume(self) -> None:
        if not self._closed:
            self.loop.add_reader(self.sock.fileno(), self._accept)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.loop.remove_reader(self.sock.fileno())
            self.sock.close()


async def stop_serving(listener: Listener | None, tasks: set[asyncio.Task[None]]) -> None:
    """Stop accepting agents and cancel the exchanges under way, waiting up to 1 s for them to end."""
    if listener is not None:
        listener.close()
    for task in list(tasks):
        task.cancel()
    if tasks:
        await asyncio.wait(tasks, timeout=1)


def ignore(_: object) -> None:
    """A pipe's end that takes what it is given and does nothing with it."""


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
