"""A request no rule can act on, with tracing on, that the plain path does not take (which opens its
span itself: `HttpProxy.relay_plain`): its span opened, then relayed by callbacks like any other.

The span needs the request's JSON-RPC body (its name, its parent in `params._meta`) and the proxy's
context has to go upstream in that `_meta` too, so a small body of known length is taken whole before
the head goes (it is usually in the same packet); a larger or chunked one streams on as it comes and
its span is named from the head alone. Kept off the inspecting path on purpose: a coroutine per call
would cost more than the span itself (bench/otel_overhead.py).
"""

from __future__ import annotations

from chaosproxy.adapters.h1 import Headers
from chaosproxy.adapters.http.calls import start_span
from chaosproxy.adapters.http.heads import SMALL_BODY
from chaosproxy.adapters.http.passthrough import Passthrough


class TracedPassthrough(Passthrough):
    __slots__ = ("pieces",)

    def start(self) -> None:
        exchange = self.exchange
        head = exchange.head
        if head.has_body and head.length is not None and head.length <= SMALL_BODY:
            exchange.on_client_gone = self._client_gone
            if head.expect_continue:
                exchange.send_continue()  # the proxy reads the body before anything goes upstream
            self.pieces: list[bytes] = []
            self.keep_body = None
            exchange.body.pipe(self.pieces.append, self._body_read)
            return
        start_span(self.proxy.engine, exchange, self, self.route, self.target)
        super().start()

    def _body_read(self, trailers: Headers) -> None:
        """The body is in: the span, then the relay. A callback of the HTTP parser's, which takes an
        exception for bad framing and leaves the call unanswered: one is answered here (502, logged)."""
        exchange = self.exchange
        exchange.body.unpipe()
        msg = self.msg
        msg.body = b"".join(self.pieces)
        try:
            start_span(self.proxy.engine, exchange, self, self.route, self.target)
            self.body = msg.body  # with the proxy's context in its _meta
            super().start()
        except Exception:  # fail open: the proxy's own failure answered 502 (internal_error), never a 500
            self.proxy.internal_error(exchange, self)
