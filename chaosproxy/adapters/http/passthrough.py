"""The pass-through: a request no rule can act on, relayed by callbacks as it arrives (no task), its
response as the upstream wrote it when nothing in its head must change. It also takes over the calls
the plain path promotes and the inspected calls whose replies no rule can act on."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from mypy_extensions import mypyc_attr

from chaosproxy.adapters.errors import UpstreamError, UpstreamTimeout
from chaosproxy.adapters.h1 import (
    AS_IS,
    AS_IS_NEVER,
    AS_IS_NO_EVENTS,
    IDEMPOTENT,
    Body,
    ClientExchange,
    Head,
    Headers,
    UpstreamConnection,
    chunk,
    ignore,
    last_chunk,
    serialize_head,
)
from chaosproxy.adapters.http.calls import Call
from chaosproxy.adapters.http.heads import SMALL_BODY, as_sent, body_framing, first_line, header
from chaosproxy.adapters.http.route import Route
from chaosproxy.engine.message import Message
from chaosproxy.telemetry.log_schema import Outcome

if TYPE_CHECKING:
    from chaosproxy.adapters.http.proxy import HttpProxy


RETRY_LIMIT = 64 << 10  # a request is replayed on a fresh connection only if it is no larger than this


@mypyc_attr(allow_interpreted_subclasses=True)  # adapters/traced.py's TracedPassthrough
class Passthrough(Call):
    """A request no rule can act on (its own call): its head as written or re-serialised, body and response
    relayed as they arrive.

    Only callbacks run here (no task), except to open a new upstream connection.
    """

    __slots__ = ("proxy", "exchange", "route", "target", "conn", "replay", "retried", "keep_body", "events",
                 "length", "body", "headers", "as_is")

    def __init__(self, proxy: HttpProxy, exchange: ClientExchange, msg: Message, route: Route, target: bytes) -> None:
        super().__init__(msg)
        self.proxy = proxy
        self.exchange = exchange
        self.route = route
        self.target = target
        self.conn: UpstreamConnection | None = None
        self.replay: list[bytes] | None = None  # what was sent on a reused connection, to resend once
        self.retried = False
        self.keep_body: list[bytes] | None = [] if exchange.head.has_body else None  # for the call line
        self.events: Body | None = None  # a GET event stream's body, relayed event by event
        self.length: int | None = None  # the response body's Content-Length
        self.body: bytes | None = None  # the whole body, when it goes with the head (a traced call, or as written)
        self.headers: Headers | None = None  # the headers sent upstream, when an Inspection decided them
        self.as_is = AS_IS_NEVER  # set when the request is sent

    def start(self) -> None:
        self.exchange.on_client_gone = self._client_gone
        conn = self.route.pool.take_idle()
        if conn is None:
            self._connect()
        else:
            self._send(conn)

    def _connect(self) -> None:
        task = asyncio.get_running_loop().create_task(self._connect_then_send())
        self.proxy._tasks.add(task)
        task.add_done_callback(self.proxy._tasks.discard)

    async def _connect_then_send(self) -> None:
        try:
            conn = await self.route.pool.connect()
        except (OSError, TimeoutError) as exc:
            self.proxy.upstream_failed(self.exchange, self, self.route, exc)
            return
        if self.exchange.gone:
            self.route.pool.release(conn)
            return
        self._send(conn)

    def _send(self, conn: UpstreamConnection) -> None:
        exchange = self.exchange
        head = exchange.head
        self.conn = conn
        conn.begin(self, head_request=head.method == "HEAD")
        client = exchange.conn
        conn.client = client  # each pauses the other's reading while it cannot take more
        exchange.upstream = conn
        client.cork_upstream(conn)
        if client._writing_paused:
            conn.pause_reading()
        if conn.reused and not self.retried and head.method in IDEMPOTENT:
            self.replay = []
        # the response may go to the client as the upstream wrote it when nothing in its head must change
        # (a GET's event stream stays apart: a legacy endpoint event may need pointing back here)
        if head.version == "1.1" and not exchange.close_after and not exchange.no_body and \
                not (head.expect_continue and not exchange.body.done):
            self.as_is = AS_IS_NO_EVENTS if head.method == "GET" else AS_IS
        body, headers = self.body, self.headers
        if body is None and headers is None and self._send_as_written():
            return
        framing = body_framing(head.length, head.chunked) if body is None else body_framing(len(body), False)
        if headers is None:
            headers = self.route.request_head(head, self, body_read=body is not None)
        data = serialize_head(first_line(head.method, self.target), headers, framing)
        self._write(data if body is None else data + body)
        self.proxy.deadlines.wait(self)  # kept from a first try when this is the retry
        if head.has_body and body is None:
            exchange.body.pipe(self._write_body, self._end_body)
        else:
            conn.request_sent = True

    def _send_as_written(self) -> bool:
        """Send the request as the agent wrote it, Host and request target aside, when it came whole in
        one piece of input and its head holds nothing to take out (one write, no header list)."""
        exchange, conn = self.exchange, self.conn
        head, piece = exchange.head, exchange.piece
        if piece is None or not head.plain or self.upstream_headers or conn is None:
            return False
        length = head.length or 0
        data = as_sent(piece, length, self.route.host_header, None if self.target is head.target else
                       b"%b %b HTTP/1.1" % (head.method.encode("latin-1"), self.target))
        if data is None:
            return False
        if length:
            self.body = body = data[len(data) - length:]
            if length <= SMALL_BODY:
                self.msg.body = body
            self.keep_body = None
            exchange.body.pipe(ignore, ignore)  # what the parser hands on of it has gone already
        self._write(data)
        self.proxy.deadlines.wait(self)
        conn.request_sent = True
        return True

    def timed_out(self) -> None:
        """No response head within --upstream-timeout (called by `Deadlines`)."""
        if self.conn is not None:
            self.conn.discard(self)
        self.exchange.body.unpipe()
        self.proxy.upstream_failed(self.exchange, self, self.route, UpstreamTimeout(
            f"no response head within {self.proxy.upstream_timeout:g} s"))

    def _stop_timer(self) -> None:
        self.proxy.deadlines.done(self)

    def _write(self, data: bytes) -> None:
        if self.replay is not None:
            self.replay.append(data)
            if sum(map(len, self.replay)) > RETRY_LIMIT:
                self.replay = None
        assert self.conn is not None
        self.conn.send(data)

    def _write_body(self, data: bytes) -> None:
        if self.keep_body is not None:
            self.keep_body.append(data)
            if self.exchange.body.received > SMALL_BODY:
                self.keep_body = None
        self._write(chunk(data) if self.exchange.head.chunked else data)

    def _end_body(self, trailers: Headers) -> None:
        if self.exchange.head.chunked:
            self._write(last_chunk(()))  # request trailers stay here: see REQUEST_TRAILERS
        if self.conn is not None:
            self.conn.request_sent = True
        if self.keep_body is not None:
            self.msg.body = b"".join(self.keep_body)
            self.keep_body = None

    # ResponseSink
    def informational(self, status: int, reason: bytes, headers: Headers) -> None:
        self.replay = None
        self.exchange.informational(status, reason, headers)

    def response_head(self, head: Head) -> None:
        self.replay = None
        self._stop_timer()
        self.status = head.status
        headers = head.forward
        if self.exchange.head.method == "GET" and head.status == 200 and \
                b"text/event-stream" in (header(headers, b"content-type") or b"") and \
                header(headers, b"content-encoding") in (None, b"identity"):
            self._relay_events(headers)  # a legacy endpoint event may need pointing back through the proxy
            return
        self.length = head.length
        self.exchange.start(head.status, head.reason, headers, head.length)

    def response_as_is(self, status: int) -> None:
        self.replay = None
        self._stop_timer()
        self.status = status
        self.exchange.started = True

    def response_body(self, data: bytes) -> None:
        if self.events is not None:
            self.events.feed(data)
            return
        self.bytes_out += len(data)
        if self.bytes_out == self.length:  # the agent has it all with this piece: log first
            self.finish(self.proxy.engine)
        self.exchange.write(data)

    def response_end(self, trailers: Headers) -> None:
        if self.events is not None:
            self.events.finish(trailers)
            return
        if self.conn is not None and self.conn.as_is:
            self.bytes_out = self.conn.body_bytes
            self.finish(self.proxy.engine)  # before the last piece goes (the client's writes are corked)
            self.exchange.finish()
            return
        self.finish(self.proxy.engine)
        self.exchange.end(trailers)

    def _relay_events(self, headers: Headers) -> None:
        assert self.conn is not None
        self.events = Body(self.conn)
        self.exchange.start(200, b"OK", headers, None)
        task = asyncio.get_running_loop().create_task(self._pump_events())
        self.proxy._tasks.add(task)
        task.add_done_callback(self.proxy._tasks.discard)
        self.exchange.on_client_gone = task.cancel

    async def _pump_events(self) -> None:
        exchange, call, events = self.exchange, self, self.events  # this pass-through is the call
        assert events is not None
        relay = self.route.relay_for(call.msg.path or "/")
        try:
            async for piece in relay.relay_events(events.chunks(), call.msg, call.faults,
                                                  self.proxy.max_message_bytes):
                call.bytes_out += len(piece)
                exchange.write(piece)
                await exchange.drain()
            exchange.end(events.trailers)
        except asyncio.CancelledError:
            call.outcome = Outcome.CLIENT_DISCONNECTED
            if self.conn is not None:
                self.conn.discard(self)
        except (ConnectionError, UpstreamError):
            call.outcome = Outcome.CLIENT_DISCONNECTED if exchange.gone else Outcome.UPSTREAM_ERROR
            exchange.abort()
        except Exception:  # fail open: the proxy's own failure answered 502 (internal_error), never a 500
            self.proxy.internal_error(exchange, call)
        finally:
            call.finish(self.proxy.engine)

    def upstream_failed(self, error: BaseException) -> None:
        if self.replay is not None and not self.exchange.started:  # a pooled connection the upstream had closed
            replay, self.replay, self.retried = self.replay, None, True
            self.exchange.body.unpipe()
            task = asyncio.get_running_loop().create_task(self._resend(replay))
            self.proxy._tasks.add(task)
            task.add_done_callback(self.proxy._tasks.discard)
            return
        self._stop_timer()
        self.exchange.body.unpipe()
        self.proxy.upstream_failed(self.exchange, self, self.route, error)

    async def _resend(self, replay: list[bytes]) -> None:
        try:
            conn = await self.route.pool.connect()
        except (OSError, TimeoutError) as exc:
            self.proxy.upstream_failed(self.exchange, self, self.route, exc)
            return
        self.conn = conn
        conn.begin(self, head_request=self.exchange.head.method == "HEAD")
        for data in replay:
            conn.send(data)
        if self.exchange.head.has_body and self.body is None:
            self.exchange.body.pipe(self._write_body, self._end_body)
        else:
            conn.request_sent = True

    def _client_gone(self) -> None:
        self._stop_timer()
        self.outcome = Outcome.CLIENT_DISCONNECTED
        if self.conn is not None:
            self.conn.discard(self)
        self.finish(self.proxy.engine)
