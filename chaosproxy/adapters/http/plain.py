"""The plain path: a request no rule could act on, whole in one piece of input, sent as written on an
idle pooled connection and its response relayed as the upstream wrote it; anything else its exchange
meets is handed to a Passthrough (`PlainRelay.promote`)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from chaosproxy.adapters.h1 import (
    AS_IS,
    AS_IS_NO_EVENTS,
    IDEMPOTENT,
    ClientExchange,
    Head,
    Headers,
    UpstreamConnection,
    method_name,
)
from chaosproxy.adapters.http.calls import plain_call_line
from chaosproxy.adapters.http.heads import SMALL_BODY
from chaosproxy.adapters.http.passthrough import Passthrough
from chaosproxy.adapters.http.route import Route
from chaosproxy.engine.message import Message, rpc_call
from chaosproxy.telemetry.log_schema import Outcome

if TYPE_CHECKING:
    from chaosproxy.adapters.http.proxy import HttpProxy


class PlainRelay:
    """A request on the plain path (`HttpProxy.relay_plain`): sent as written, its response relayed as
    the upstream wrote it, one call line. Anything else its exchange meets (a response head that must
    change, a 1xx, a failure, a timeout) is the general path's: `promote` hands the call to a
    Passthrough in the state it would have had from the start."""

    __slots__ = ("proxy", "exchange", "route", "conn", "method", "target", "upstream_target", "headers", "session",
                 "body", "sent", "started", "status", "as_is", "msg")

    def __init__(self, proxy: HttpProxy, exchange: ClientExchange, route: Route, conn: UpstreamConnection,
                 method: bytes, target: bytes, upstream_target: bytes, headers: Headers, session: bytes | None,
                 body: bytes, sent: bytes, msg: Message | None) -> None:
        """`target`: as the agent wrote it; `upstream_target`: as sent on (the route's prefix and base path
        applied). `msg`: the call's Message if the rule check or the span made one (else made if promoted)."""
        self.started = time.perf_counter()
        self.proxy = proxy
        self.exchange = exchange
        self.route = route
        self.conn = conn
        self.method = method
        self.target = target
        self.upstream_target = upstream_target
        self.headers = headers
        self.session = session
        self.body = body
        self.sent = sent
        self.status: int | None = None
        self.msg = msg
        # a GET's event stream stays apart: a legacy endpoint event may need pointing back here
        self.as_is = AS_IS_NO_EVENTS if method == b"GET" else AS_IS
        client = exchange.conn
        conn.begin(self, head_request=False)
        conn.client = client  # each pauses the other's reading while it cannot take more
        exchange.upstream = conn
        exchange.on_client_gone = self._client_gone
        if client._writing_paused:
            conn.pause_reading()
        conn.send(sent)
        conn.request_sent = True
        proxy.deadlines.wait(self)

    def promote(self) -> Passthrough:
        """The general path takes the call over: the request's Head, Message and Passthrough, made now."""
        proxy, exchange, conn = self.proxy, self.exchange, self.conn
        head = Head(self.headers, "1.1", True, exchange.conn.special, proxy.session_header)
        head.method = method_name(self.method)
        head.target = self.target
        exchange.head = head
        msg = self.msg or proxy._message(head.method, self.target.decode("latin-1"), head.watched, self.headers,
                                         exchange.peer, self.route)
        passthrough = Passthrough(proxy, exchange, msg, self.route, self.upstream_target)
        passthrough.started, passthrough.status, passthrough.bytes_out = self.started, self.status, conn.body_bytes
        passthrough.conn = conn
        passthrough.as_is = self.as_is
        passthrough.keep_body = None
        if self.body:
            passthrough.body = self.body  # sent whole with the head
            if len(self.body) <= SMALL_BODY:
                msg.body = self.body
        if conn.reused and head.method in IDEMPOTENT:  # the upstream may have closed it unseen: resent once
            passthrough.replay = [self.sent]
        conn.sink = passthrough
        exchange.on_client_gone = passthrough._client_gone
        proxy.deadlines.done(self)
        proxy.deadlines.wait(passthrough)
        return passthrough

    def timed_out(self) -> None:
        """No response head within --upstream-timeout (called by `Deadlines`, which let it go)."""
        passthrough = self.promote()
        self.proxy.deadlines.done(passthrough)
        passthrough.timed_out()

    # ResponseSink
    def informational(self, status: int, reason: bytes, headers: Headers) -> None:
        self.promote().informational(status, reason, headers)

    def response_head(self, head: Head) -> None:
        self.promote().response_head(head)

    def response_as_is(self, status: int) -> None:
        self.proxy.deadlines.done(self)
        self.status = status
        self.exchange.started = True

    def response_body(self, data: bytes) -> None:  # never: a response not relayed as is promotes first
        self.promote().response_body(data)

    def response_end(self, trailers: Headers) -> None:
        self._log(Outcome.OK)  # before the last piece goes (the client's writes are corked)
        self.exchange.finish()

    def upstream_failed(self, error: BaseException) -> None:
        self.promote().upstream_failed(error)

    def _client_gone(self) -> None:
        self.proxy.deadlines.done(self)
        self.conn.discard(self)
        self._log(Outcome.CLIENT_DISCONNECTED)

    def _log(self, outcome: str) -> None:
        msg = self.msg
        called = rpc_call(msg.rpc) if msg is not None and msg.parsed else self.body or None
        self.proxy.engine.log.write_call((
            self.proxy.transport, self.session, self.exchange.conn.peer, self.route.name, self.method, self.target,
            self.status, outcome, self.conn.body_bytes, time.perf_counter() - self.started, called),
            plain_call_line)
        if msg is not None and msg.trace is not None:
            msg.trace.end(outcome, status=self.status)
