"""The reverse proxy: one listener, routes by path prefix, and for each request the path it takes
(`HttpProxy.relay_plain`, `HttpProxy.handle`); the deadlines of calls waiting for their upstream; the
answers the proxy gives in its own name."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Mapping
from http import HTTPStatus

import orjson

from chaosproxy.adapters.h1 import (
    ByteTap,
    ClientConnection,
    ClientExchange,
    ClientLimits,
    Headers,
    Listener,
    keeps_alive,
    method_name,
    stop_serving,
    without_keep_alive,
)
from chaosproxy.adapters.http.calls import Call, open_span
from chaosproxy.adapters.http.heads import (
    RULE_BODY_LIMIT,
    SMALL_BODY,
    TRACE_CONTEXT,
    HeaderView,
    as_sent,
    head_with,
    header,
    plain_session,
    session_and_path,
)
from chaosproxy.adapters.http.inspection import Inspection, ResponseReader
from chaosproxy.adapters.http.passthrough import Passthrough
from chaosproxy.adapters.http.plain import PlainRelay
from chaosproxy.adapters.http.route import Route
from chaosproxy.adapters.jsonrpc import JsonRpcRelay
from chaosproxy.engine.actions import Respond
from chaosproxy.engine.core import Engine
from chaosproxy.engine.interest import AGENT_HEADER_KEY
from chaosproxy.engine.message import Message, Phase
from chaosproxy.engine.sessions import SCOPE_HEADER, agent_name
from chaosproxy.protocols.a2a.wire import is_card
from chaosproxy.telemetry.log import Throttle, ops
from chaosproxy.telemetry.log_schema import Outcome

UPSTREAM_TIMEOUT = 300.0  # connect, and from the request sent to the response head


PLAIN_METHODS = frozenset({b"GET", b"POST", b"PUT", b"PATCH", b"OPTIONS"})  # HEAD and DELETE: general path


MAX_VERDICT_HEAD = 1024  # relay_plain keeps the rule check's answer (Interest.head_verdict) for a target (and
# header values a rule reads) no longer than this


class HttpProxy:
    """Reverse proxy from one listener to one upstream, or to several by path prefix (routes)."""

    def __init__(self, engine: Engine, upstream: str | Mapping[str, str], *, transport: str = "http",
                 upstream_timeout: float = UPSTREAM_TIMEOUT, max_message_bytes: int = RULE_BODY_LIMIT,
                 limits: ClientLimits | None = None, recorder: ByteTap | None = None) -> None:
        """`recorder`: watches every byte exchanged with the upstreams (a cassette's recorder); None costs nothing."""
        self.engine = engine
        self.upstream = upstream
        self.limits = limits or ClientLimits()
        engine.refused = self.limits.refused  # for /metrics
        self.failures = Throttle()  # an upstream that is down gets a line every 10 s, not one per request
        self.connections: set[ClientConnection] = set()
        self._sweep: asyncio.TimerHandle | None = None
        self.transport = transport
        self.upstream_timeout = upstream_timeout
        self.max_message_bytes = max_message_bytes
        routes = {"/": upstream} if isinstance(upstream, str) else upstream
        # longest prefix first, so /a/b wins over /a and / catches the rest
        self.routes = sorted(
            (Route(prefix, url, engine, transport, upstream_timeout) for prefix, url in routes.items()),
            key=lambda route: len(route.prefix), reverse=True)
        for route in self.routes:
            route.pool.tap = recorder
        self._listener: Listener | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.deadlines = Deadlines(upstream_timeout)
        self.session_header = b"mcp-session-id"  # Head.watched: the agent's session when it names one
        # the plain path's route (relay_plain) when there is one and it changes no target; else found by prefix
        root = self.routes[0]
        self._plain_route = root if len(self.routes) == 1 and not root.prefix and not root.base_path else None
        # Scopes (chaosproxy.control.scopes): a request naming one of these in the scope header is served
        # by its proxy, over the scope's own engine (scenario, gate counters); every other request, here.
        self.scopes: dict[bytes, HttpProxy] = {}
        self.scope_header = SCOPE_HEADER.lower().encode()

    def for_scope(self, engine: Engine) -> HttpProxy:
        """This proxy's routes, limits and timeouts over another engine: a scope's, served through this
        proxy's listener (it listens on nothing of its own)."""
        return HttpProxy(engine, self.upstream, transport=self.transport, upstream_timeout=self.upstream_timeout,
                         max_message_bytes=self.max_message_bytes, limits=self.limits)

    async def start(self, host: str, port: int) -> int:
        """Listen; returns the bound port (useful with port 0)."""
        loop = asyncio.get_running_loop()
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._listener = Listener(self, socket.create_server((host, port), family=family, backlog=1024))
        self.limits.clock = loop.time()
        self._sweep = loop.call_later(self._sweep_every(), self._close_overdue)
        return self._listener.sock.getsockname()[1]

    def _sweep_every(self) -> float:
        """How often overdue connections are looked for: the timeouts are kept to within this."""
        return min(1.0, self.limits.head_timeout / 4, self.limits.idle_timeout / 4)

    def _close_overdue(self) -> None:
        """Close the connections that took too long over a head or sat idle too long (ClientConnection.overdue),
        and advance the clock they are judged by."""
        loop = asyncio.get_running_loop()
        now = self.limits.clock = loop.time()
        for conn in list(self.connections):
            try:
                conn.overdue(now)
            except Exception:  # fail open: one connection's failure must not keep the others open
                ops.exception("closing an overdue client connection failed")
        self._sweep = loop.call_later(self._sweep_every(), self._close_overdue)

    def close_connections(self) -> None:
        """Cut every agent connection at once (a proxy disabled or deleted through the control API)."""
        for conn in list(self.connections):
            conn.transport.abort()

    async def stop(self) -> None:
        if self._sweep is not None:
            self._sweep.cancel()
        await stop_serving(self._listener, self._tasks)
        for route in self.routes:
            route.pool.close()
        self.deadlines.close()

    def _route(self, raw_target: str) -> tuple[Route | None, str | None]:
        for route in self.routes:
            if (target := route.target(raw_target)) is not None:
                return route, target
        return None, None

    def handle(self, exchange: ClientExchange) -> None:
        """A request whose head is in: here a call starts. Relayed untouched, or inspected in a task."""
        head = exchange.head
        if self.scopes and (scoped := self._scoped(head.headers)) is not None:
            scoped.handle(exchange)
            return
        raw_target = head.target.decode("latin-1")
        route, target = self._route(raw_target) if raw_target.startswith("/") else (None, None)
        msg = self._message(head.method, raw_target, head.watched, head.headers, exchange.peer, route)
        call: Call | None = None
        try:
            if not raw_target.startswith("/") or head.method == "CONNECT":
                call = Call(msg)
                call.outcome = Outcome.NOT_A_FORWARD_PROXY
                exchange.close_after = True
                self._respond(exchange, call, _not_a_forward_proxy(head.method))
                return
            if route is None or target is None:  # never an open relay: only configured upstreams
                call = Call(msg)
                call.outcome = Outcome.NO_ROUTE
                body = orjson.dumps({"error": {"code": 404, "message": f"chaosproxy: no route for {msg.path}",
                                               "routes": [r.prefix or "/" for r in self.routes]}})
                self._respond(exchange, call, Respond(404, body, {"Content-Type": "application/json"}))
                return
            # the target as the agent sent it (bytes) when no prefix comes off
            upstream_target = route.base_path + (target.encode("latin-1") if route.prefix else head.target)
            if not self.engine.interest.could_act(msg) and not head.upgrade and not is_card(msg.http_method, msg.path):
                if self.engine.tracing.on:  # the span first, then the same callbacks (adapters/traced.py)
                    from chaosproxy.adapters.http.traced import TracedPassthrough
                    passthrough: Passthrough = TracedPassthrough(self, exchange, msg, route, upstream_target)
                else:
                    passthrough = Passthrough(self, exchange, msg, route, upstream_target)
                call = passthrough
                passthrough.start()
                return
            call = Call(msg)
            inspection = Inspection(self, exchange, call, route, upstream_target)
            task = asyncio.get_running_loop().create_task(inspection.run())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            exchange.on_client_gone = lambda: task.cancel()
        except Exception:  # fail open: never a 500 from the proxy itself: logged once, a 502, serving on
            self.internal_error(exchange, call or Call(msg))

    def _scoped(self, headers: Headers) -> HttpProxy | None:
        """The proxy of the scope a request names in the scope header, when there is one by that name."""
        name = header(headers, self.scope_header)
        return self.scopes.get(name.strip()) if name is not None else None

    def _message(self, method: str, raw_target: str, watched: bytes | None, headers: Headers, peer: str,
                 route: Route | None) -> Message:
        """The Message of a request that arrived; the engine numbers its session now (Engine.see)."""
        agent = agent_name(header(headers, AGENT_HEADER_KEY))
        session, path = session_and_path(raw_target, watched, agent or peer)
        msg = Message(self.transport, Phase.REQUEST, session=session, http_method=method, path=path,
                      headers=HeaderView(headers), route=route.name if route else None)
        if not self.engine.interest.idle:
            self.engine.see(session, self.transport, msg.route, agent)
        return msg

    def _raw_message(self, method: bytes, target: bytes, watched: bytes | None, headers: Headers, peer: str,
                     route: Route) -> Message:
        return self._message(method_name(method), target.decode("latin-1"), watched, headers, peer, route)

    def relay_plain(self, client: ClientConnection, target: bytes, headers: Headers,
                    piece: bytes) -> ClientExchange | None:
        """The plain path: a request no rule could act on, that came whole in one piece of input with a
        head holding nothing to take out but the keep-alive lines httpx and undici send (`Connection:
        keep-alive`, `Keep-Alive`), goes upstream as written (Host aside, those lines out) on an idle pooled
        connection, with no Head or Passthrough made unless the response needs them
        (`PlainRelay.promote`), nor a Message unless the rule check meets a head it has not answered
        yet or the span needs one. None when the request is not such a one: `handle` takes it. With
        tracing on, the call's span opens here and the proxy's context goes upstream in the head (and
        in a JSON-RPC request's `params._meta`), as on the general path."""
        parser = client.parser
        method = parser.get_method()
        if self.scopes and header(headers, self.scope_header) is not None:
            return None  # a scope's request: `handle` gives it to the scope
        if method not in PLAIN_METHODS or target[:1] != b"/" or b"ession" in target or \
                b"/.well-known/" in target or \
                not parser.should_keep_alive() or parser.should_upgrade():
            return None
        route, upstream_target = self._plain_route, target
        if route is None:  # routes by prefix, or a base path: the target changes on the way
            route, rest = self._route(target.decode("latin-1"))
            if route is None or rest is None:
                return None  # no route: the general path answers 404
            upstream_target = route.base_path + (rest.encode("latin-1") if route.prefix else target)
        engine = self.engine
        interest = engine.interest  # one scenario's, for the whole request
        length, session, seen_host, picked, keep_alive_lines = -1, None, False, [], 0
        special = client.special  # the names Head's pass stops at
        read = interest.head_headers  # the names a rule's head check reads
        for name, value in headers:  # what Head's pass would find, in a head that holds nothing else
            lower = name.lower()
            if lower in read:
                picked.append((lower, value))
            if lower not in special:
                continue
            if lower == b"content-length" and length < 0 and value.strip().isdigit():
                length = int(value)
            elif lower == b"host" and not seen_host:
                seen_host = True
            elif lower == self.session_header:
                if session is None:
                    session = value
            elif keeps_alive(lower, value):  # as httpx and undici send it: about the agent's connection only
                keep_alive_lines += 1
            else:  # other hop-by-hop headers, Expect, a second Host or Content-Length
                return None
        session, agent = plain_session(session, picked) if picked else (session, None)
        msg = None
        if not interest.idle:  # asked once for each head alike (what a rule's head checks read of it)
            key = (self.transport, route.name, method, target, *picked)
            if (could := interest.head_verdict(key)) is None:
                msg = self._raw_message(method, target, session, headers, client.peer, route)
                short = len(target) + sum(len(value) for _, value in picked) <= MAX_VERDICT_HEAD
                could = interest.could_act(msg, key if short else None)
            if could:
                return None  # a rule may act on it: the general path asks the engine again, with its Head
            engine.see(session.decode("latin-1") if session is not None else client.peer, self.transport,
                       route.name, agent)
        length = max(length, 0)
        sent = as_sent(piece, length, route.host_header,
                       None if upstream_target is target else b"%b %b HTTP/1.1" % (method, upstream_target))
        if keep_alive_lines and sent is not None:
            sent = without_keep_alive(sent, keep_alive_lines)
        if sent is None:
            return None  # not all there, or not HTTP/1.1
        conn = route.pool.take_idle()
        if conn is None:  # a new connection is opened in a task: the general path does that
            return None
        exchange = ClientExchange(client, None, piece)
        body = sent[len(sent) - length:]
        # with tracing on, a call the sampler leaves out before a Message is needed goes on untouched
        if (tracing := engine.tracing).on and (root := tracing.root_draw(headers, body)) != 0:
            msg = msg or self._raw_message(method, target, session, headers, client.peer, route)
            if body and length <= SMALL_BODY:
                msg.body = body
            if context := open_span(engine, msg, route, upstream_target, client.peer, root or 0):
                head = sent[:len(sent) - length]
                if msg.body is not None and msg.body is not body:  # params._meta carries the context too
                    body = msg.body
                    context.append((b"content-length", b"%d" % len(body)))
                sent = head_with(head, context, TRACE_CONTEXT) + body
        PlainRelay(self, exchange, route, conn, method, target, upstream_target, headers, session, body, sent, msg)
        return exchange

    def internal_error(self, exchange: ClientExchange, call: Call) -> None:
        ops.exception("internal error on %s %s", call.msg.http_method, call.msg.path)
        call.outcome = Outcome.PROXY_ERROR
        if exchange.started:
            exchange.abort()
        else:
            exchange.close_after = True
            body = orjson.dumps({"error": {"code": 502, "message": "chaosproxy: internal error (see its log)"}})
            self._respond(exchange, call, Respond(502, body, {"Content-Type": "application/json",
                                                             "X-Chaosproxy-Error": "internal"}))
        call.finish(self.engine)

    def _respond(self, exchange: ClientExchange, call: Call, respond: Respond) -> None:
        """Answer in the proxy's name (a fault, a 404, a 502)."""
        call.status = respond.status
        call.bytes_out = len(respond.body)
        headers = [(name.encode("latin-1"), value.encode("latin-1")) for name, value in respond.headers.items()
                   if name.lower() not in ("content-length", "transfer-encoding", "connection")]
        call.finish(self.engine)  # logged before the agent can see the answer, so a log read after it has it
        if not exchange.gone:
            exchange.conn.cork()
            exchange.start(respond.status, _reason(respond.status), headers, len(respond.body))
            exchange.write(respond.body)
            exchange.conn.uncork()
            exchange.end()

    def upstream_failed(self, exchange: ClientExchange, call: Call, route: Route, error: BaseException) -> None:
        """The upstream could not be reached or broke the exchange: a 502 (504 on a timeout) if the
        agent has had no answer yet, else the connection is cut, as the upstream cut it."""
        timed_out = isinstance(error, TimeoutError)
        call.outcome = Outcome.UPSTREAM_TIMEOUT if timed_out else Outcome.UPSTREAM_ERROR
        self.failures.warning((route.upstream, type(error)), "upstream %s failed for %s %s: %s", route.upstream,
                              call.msg.http_method, call.msg.path, error or type(error).__name__)
        if isinstance(route.relay, JsonRpcRelay):
            route.relay.forget(call.msg)  # no reply will come on the legacy stream: not kept waiting for one
        if exchange.started:
            exchange.abort()
            call.finish(self.engine)
        else:
            exchange.close_after = exchange.close_after or not exchange.body.done
            self._respond(exchange, call, _upstream_error(route.upstream, error, timed_out))


class Deadlines:
    """Calls waiting for their response head (pass-throughs, and the readers of inspected calls), oldest
    first, under one timer (not one per request).

    Every wait is --upstream-timeout long, so the order of arrival is the order of the deadlines: the
    timer is set for the oldest, and when it fires, expires what is due and is set for the next.
    """

    __slots__ = ("timeout", "waiting", "_timer", "_loop")

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.waiting: dict[Passthrough | PlainRelay | ResponseReader, float] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def wait(self, passthrough: Passthrough | PlainRelay | ResponseReader) -> None:
        """Start `passthrough`'s wait, unless it waits already (a retry keeps the first try's deadline)."""
        waiting = self.waiting
        if passthrough not in waiting:
            loop = self._loop or self._bind()
            waiting[passthrough] = deadline = loop.time() + self.timeout
            if self._timer is None:
                self._timer = loop.call_at(deadline, self._expire)

    def done(self, passthrough: Passthrough | PlainRelay | ResponseReader) -> None:
        self.waiting.pop(passthrough, None)

    def _bind(self) -> asyncio.AbstractEventLoop:
        self._loop = asyncio.get_running_loop()
        return self._loop

    def _expire(self) -> None:
        self._timer = None
        assert self._loop is not None
        now, waiting = self._loop.time(), self.waiting
        while waiting:
            passthrough, deadline = next(iter(waiting.items()))
            if deadline > now:
                self._timer = self._loop.call_at(deadline, self._expire)
                return
            del waiting[passthrough]
            try:
                passthrough.timed_out()
            except Exception:  # fail open: one call's failure must not stop the others' deadlines
                ops.exception("handling an upstream timeout failed")

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.waiting.clear()


REASONS = {status.value: status.phrase.encode() for status in HTTPStatus}  # made at import: see _reason


def _reason(status: int) -> bytes:
    """A status's reason phrase. Nothing here may need a file or much memory: a 502 for running out of
    open files is built by this."""
    return REASONS.get(status, b"Unknown")


def _upstream_error(upstream: str, exc: BaseException, timed_out: bool) -> Respond:
    what = "timed out" if timed_out else "unreachable"
    body = orjson.dumps({"error": {"code": 504 if timed_out else 502,
                                   "message": f"chaosproxy: upstream {upstream} {what}",
                                   "detail": str(exc) or type(exc).__name__}})
    return Respond(504 if timed_out else 502, body, {
        "Content-Type": "application/json", "X-Chaosproxy-Error": f"upstream-{what.replace('timed out', 'timeout')}"})


def _not_a_forward_proxy(method: str) -> Respond:
    body = orjson.dumps({"error": {"code": 400, "message": (
        f"chaosproxy run is a reverse proxy and cannot serve {'CONNECT' if method == 'CONNECT' else 'absolute-form'} "
        "requests: point the agent's base URL at it (http://HOST:PORT/...), or use `chaosproxy mitm` as a "
        "forward proxy (HTTP_PROXY/HTTPS_PROXY)")}})
    return Respond(400, body, {"Content-Type": "application/json", "X-Chaosproxy-Error": "not-a-forward-proxy"})
