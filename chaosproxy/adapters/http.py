"""HTTP reverse proxy adapter: one listener, routes by path prefix, faults per request.

The wire is `h1` (asyncio Protocols + httptools). Each request is judged on its head alone
(`Engine.could_act`): when no rule could act on it or its response, it is relayed as it arrives by
callbacks (`Passthrough`, no task, no copy); otherwise it takes the inspecting path (`Inspection`,
one coroutine), which reads what rules need, asks the engine, and carries the actions out. A plain
request no rule could act on (whole in one read, nothing in its head to take out) that finds an idle
pooled connection takes the plain path first (`HttpProxy.relay_plain`, `PlainRelay`): relayed as
written with no Head or Passthrough made (with tracing on, its span opened and the proxy's context put
in its head and body), unless its exchange needs the general path.

Where a call starts and ends, for whoever wants to hook in (tracing): `HttpProxy.handle` builds the
`Call` once the head is known and before anything goes upstream (`Call.upstream_headers` are added to
the request sent there); `Call.finish` logs its call line, exactly once, whatever befell the call.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from http import HTTPStatus
from typing import Any
from urllib.parse import unquote

import orjson
from mypy_extensions import mypyc_attr
from yarl import URL

from chaosproxy import streams
from chaosproxy.actions import CutStream, Delay, Drip, Hang, Reply, Reset, Respond, Truncate
from chaosproxy.adapters.h1 import (
    AS_IS, AS_IS_NEVER, AS_IS_NO_EVENTS, IDEMPOTENT, Body, ClientConnection, ClientExchange, ClientLimits, Head,
    Headers, Listener, UpstreamConnection, UpstreamPool, chunk, ignore, keeps_alive, last_chunk, method_name,
    serialize_head, without_keep_alive,
)
from chaosproxy.adapters.errors import UpstreamError, UpstreamTimeout, UpstreamUnreachable
from chaosproxy.adapters.jsonrpc import BodyRelay, JsonRpcRelay
from chaosproxy.engine import AGENT_HEADER_KEY, Engine, Fired
from chaosproxy.llm import api_for_path
from chaosproxy.llm.relay import LlmExchange, LlmRelay
from chaosproxy.log import Throttle, ops
from chaosproxy.message import Message, Phase, mirrored_headers, parse_rpc, rpc_call
from chaosproxy.sessions import agent_name
from chaosproxy.redact import redacted_url

HOP_BY_HOP = frozenset(name.decode() for name in (
    b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"te", b"trailer", b"trailers",
    b"transfer-encoding", b"upgrade", b"proxy-connection", b"host"))
SMALL_BODY = 1 << 20  # request bodies up to this size are kept for the call line (JSON-RPC method, tool)
RULE_BODY_LIMIT = 16 << 20  # the largest body (or SSE event) a rule may look inside
# REQUEST_TRAILERS: trailers of a chunked request are not forwarded. Upstream connections are pooled
# across agents, and some servers (aiohttp's among them) read request trailers as headers of the
# *next* request on the connection: one agent's trailer would reach another agent's request.
PLAIN_METHODS = frozenset({b"GET", b"POST", b"PUT", b"PATCH", b"OPTIONS"})  # HEAD and DELETE: general path
MAX_VERDICTS = 4096  # answers of the rule check relay_plain keeps (Engine.head_verdicts): all dropped beyond
MAX_VERDICT_HEAD = 1024  # ... each for a target (and header values a rule reads) no longer than this
RETRY_LIMIT = 64 << 10  # a request is replayed on a fresh connection only if it is no larger than this
UPSTREAM_TIMEOUT = 300.0  # connect, and from the request sent to the response head
CONTENT_LENGTH = frozenset({b"content-length"})  # re-framed by the proxy
HOST_AND_LENGTH = frozenset({b"host", b"content-length"})
UPGRADE = frozenset({b"upgrade"})
UPGRADE_AND_CONNECTION = frozenset({b"upgrade", b"connection"})


class HeaderView(Mapping[str, str]):
    """Raw header pairs read as a case-insensitive str mapping (first value wins), decoded on demand."""

    __slots__ = ("pairs",)

    def __init__(self, pairs: Headers) -> None:
        self.pairs = pairs

    def get(self, name: str, default: Any = None) -> Any:  # type: ignore[override]
        wanted = name.lower().encode("latin-1")
        for key, value in self.pairs:
            if key.lower() == wanted:
                return value.decode("latin-1")
        return default

    def __getitem__(self, name: str) -> str:
        value = self.get(name)
        if value is None:
            raise KeyError(name)
        return value

    def __iter__(self) -> Iterator[str]:
        return (key.decode("latin-1") for key, _ in self.pairs)

    def __len__(self) -> int:
        return len(self.pairs)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.get(name) is not None


def header(pairs: Headers, name: bytes) -> bytes | None:
    for key, value in pairs:
        if key.lower() == name:
            return value
    return None


def without(pairs: Headers, *names: bytes) -> Headers:
    return [(key, value) for key, value in pairs if key.lower() not in names]


@mypyc_attr(allow_interpreted_subclasses=True)  # the mitm adapter's flows are exchanges too
class Exchange:
    """What the call log needs to know about one request, filled in as it goes (mitm's flows are these too)."""

    __slots__ = ("started", "status", "bytes_out", "outcome", "faults")

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.status: int | None = None
        self.bytes_out = 0
        self.outcome = "ok"
        self.faults: list[str] = []


@mypyc_attr(allow_interpreted_subclasses=True)
class Call(Exchange):
    """One request through `chaosproxy run`, from its head being in to its call line being logged (once)."""

    __slots__ = ("msg", "logged", "upstream_headers")

    def __init__(self, msg: Message) -> None:  # Exchange's fields set here too: one call less per request
        self.started = time.perf_counter()
        self.status = None
        self.bytes_out = 0
        self.outcome = "ok"
        self.faults = []
        self.msg = msg
        self.logged = False
        self.upstream_headers: Headers = []  # added to the request sent upstream (e.g. traceparent)

    def finish(self, engine: Engine) -> None:
        """Here a call ends: its call line (and its span, when tracing) is written, exactly once."""
        if not self.logged:
            self.logged = True
            msg = self.msg
            log_call(engine, msg.transport, msg, self)
            if msg.http_method == "DELETE" and self.status is not None and self.status < 300 and \
                    "Mcp-Session-Id" in msg.headers:  # the agent ended its MCP session: its state goes
                engine.end_session(msg.session)


class Route:
    """Requests under `prefix` go to `upstream` with the prefix taken off ("/" takes everything else)."""

    __slots__ = ("prefix", "name", "upstream", "base_path", "host_header", "pool", "relay", "llm")

    def __init__(self, prefix: str, upstream: str, engine: Engine, transport: str, timeout: float) -> None:
        url = URL(upstream)
        self.prefix = prefix.rstrip("/")
        self.name = self.prefix.lstrip("/") or "default"
        self.upstream = redacted_url(str(url)).rstrip("/")  # what logs, spans and errors show
        self.base_path = url.raw_path.rstrip("/").encode()
        port = b":%d" % url.port if url.port is not None and not url.is_default_port() else b""
        self.host_header = (url.raw_host or "").encode() + port
        context = ssl.create_default_context() if url.scheme == "https" else None
        self.pool = UpstreamPool(url.raw_host or "127.0.0.1", url.port or 80, connect_timeout=timeout, tls=context)
        self.relay: BodyRelay = JsonRpcRelay(engine, transport, URL(self.upstream), self.prefix)
        self.llm = LlmRelay(engine)  # model-API requests (chat/completions, messages, responses)

    def target(self, raw_target: str) -> str | None:
        """The upstream request target (path and query) for a request's, or None when not under the prefix."""
        if not self.prefix:
            return raw_target
        rest = raw_target[len(self.prefix):]
        if raw_target.startswith(self.prefix) and (not rest or rest[0] in "/?"):
            return rest if rest.startswith("/") else "/" + rest
        return None

    def relay_for(self, path: str) -> BodyRelay:
        """The body relay for a request path (JSON-RPC today; model APIs get their own by path)."""
        return self.relay

    def request_head(self, head: Head, call: Call, *, upgrade: bool = False, body_read: bool = False) -> Headers:
        """The headers sent upstream: the agent's end-to-end ones, Host naming the upstream. `body_read`:
        the proxy read the body itself (and said 100 Continue), so no Expect goes upstream."""
        if upgrade:
            headers = [(b"Host", self.host_header), *head.end_to_end(keep=UPGRADE, drop=HOST_AND_LENGTH),
                       (b"Connection", b"Upgrade")]
        else:
            headers = [(b"Host", self.host_header), *head.forward]
        if call.upstream_headers:  # in place of the agent's (its traceparent: the proxy's span is the parent now)
            names = [name for name, _ in call.upstream_headers]  # lower case
            headers = [(name, value) for name, value in headers if name.lower() not in names] + call.upstream_headers
        return without(headers, b"expect") if body_read else headers


def as_sent(piece: bytes, length: int, host: bytes, request_line: bytes | None = None) -> bytes | None:
    """The request that starts `piece` (its head, then `length` bytes of body) as the agent wrote it, but
    for its Host header, which says `host` (added after the request line when there is none), and, when
    given, its request line; in one splice. None when it is not all in `piece`, or not HTTP/1.1."""
    blank = piece.find(b"\r\n\r\n")
    line_end = piece.find(b"\r\n")
    end = blank + 4 + length
    if blank < 0 or line_end <= 0 or piece[0] == 10 or len(piece) < end or \
            not piece.startswith(b" HTTP/1.1", line_end - 9):
        return None  # (or an empty line before the request line, which the parser skips)
    at = piece[:blank].lower().find(b"\r\nhost:", line_end)
    after = line_end if at < 0 else piece.find(b"\r\n", at + 2)
    return b"%b%b\r\nHost: %b%b" % (request_line or piece[:line_end], piece[line_end:max(at, line_end)], host,
                                    piece[after:end])


def head_with(head: bytes, headers: Headers) -> bytes:
    """`head` (as `as_sent` made it) with `headers` (lower-case names) in place of its own ones."""
    names = {name for name, _ in headers}
    first, *lines = head[:-4].split(b"\r\n")
    kept = [line for line in lines if line.partition(b":")[0].lower() not in names]
    return b"\r\n".join([first, *kept, *[b"%b: %b" % pair for pair in headers]]) + b"\r\n\r\n"


def session_and_path(raw_target: str, watched: bytes | None, peer: str) -> tuple[str, str]:
    """A request's session (its Mcp-Session-Id, a legacy `sessionId` in the query, or `peer`: the name the
    agent gave itself, else its address) and its path (unquoted)."""
    path, _, query = raw_target.partition("?")
    if watched is not None:
        session = watched.decode("latin-1")
    elif "ession" in query:  # legacy HTTP+SSE names the session in the query; parse it only then
        params = URL("/?" + query).query
        session = params.get("sessionId") or params.get("session_id") or peer
    else:
        session = peer
    return session, unquote(path) if "%" in path else path


def plain_session(watched: bytes | None, picked: Headers) -> tuple[bytes | None, str | None]:
    """What session a plain-path request names (as `watched` does: its Mcp-Session-Id, else the name
    the agent gave itself; None for its address), and that name, from the headers relay_plain picked."""
    agent = agent_name(next((value for name, value in picked if name == AGENT_HEADER_KEY), None))
    return (watched if watched is not None or agent is None else agent.encode()), agent


def first_line(method: str, target: bytes) -> bytes:
    return b"%b %b HTTP/1.1\r\n" % (method.encode("latin-1"), target)


def body_framing(length: int | None, chunked: bool) -> bytes:
    if chunked:
        return b"Transfer-Encoding: chunked\r\n"
    return b"Content-Length: %d\r\n" % length if length is not None else b""


class HttpProxy:
    """Reverse proxy from one listener to one upstream, or to several by path prefix (routes)."""

    def __init__(self, engine: Engine, upstream: str | Mapping[str, str], *, transport: str = "http",
                 upstream_timeout: float = UPSTREAM_TIMEOUT, max_message_bytes: int = RULE_BODY_LIMIT,
                 limits: ClientLimits | None = None) -> None:
        self.engine = engine
        self.limits = limits or ClientLimits()
        self.failures = Throttle()  # an upstream that is down gets a line every 10 s, not one per request
        self.connections: set[ClientConnection] = set()
        self._sweep: asyncio.TimerHandle | None = None
        self.transport = transport
        self.upstream_timeout = upstream_timeout
        self.max_message_bytes = max_message_bytes
        routes = {"/": upstream} if isinstance(upstream, str) else upstream
        # longest prefix first, so /a/b wins over /a and / catches the rest
        self.routes = sorted((Route(prefix, url, engine, transport, upstream_timeout) for prefix, url in routes.items()),
                             key=lambda route: len(route.prefix), reverse=True)
        self._listener: Listener | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.deadlines = Deadlines(upstream_timeout)
        self.session_header = b"mcp-session-id"  # Head.watched: the agent's session when it names one
        # the plain path's route (relay_plain) when there is one and it changes no target; else found by prefix
        root = self.routes[0]
        self._plain_route = root if len(self.routes) == 1 and not root.prefix and not root.base_path else None

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
            except Exception:  # one connection's failure must not keep the others open
                ops.exception("closing an overdue client connection failed")
        self._sweep = loop.call_later(self._sweep_every(), self._close_overdue)

    async def stop(self) -> None:
        if self._sweep is not None:
            self._sweep.cancel()
        if self._listener is not None:
            self._listener.close()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=1)
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
        raw_target = head.target.decode("latin-1")
        route, target = self._route(raw_target) if raw_target.startswith("/") else (None, None)
        msg = self._message(head.method, raw_target, head.watched, head.headers, exchange.peer, route)
        call: Call | None = None
        try:
            if not raw_target.startswith("/") or head.method == "CONNECT":
                call = Call(msg)
                call.outcome = "not_a_forward_proxy"
                exchange.close_after = True
                self._respond(exchange, call, _not_a_forward_proxy(head.method))
                return
            if route is None or target is None:  # never an open relay: only configured upstreams
                call = Call(msg)
                call.outcome = "no_route"
                body = orjson.dumps({"error": {"code": 404, "message": f"chaosproxy: no route for {msg.path}",
                                               "routes": [r.prefix or "/" for r in self.routes]}})
                self._respond(exchange, call, Respond(404, body, {"Content-Type": "application/json"}))
                return
            # the target as the agent sent it (bytes) when no prefix comes off
            upstream_target = route.base_path + (target.encode("latin-1") if route.prefix else head.target)
            if not self.engine.could_act(msg) and not head.upgrade:
                if self.engine.tracing.on:  # the span first, then the same callbacks (adapters/traced.py)
                    from chaosproxy.adapters.traced import TracedPassthrough
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
        except Exception:  # never a 500 from the proxy itself: log it once, answer 502, keep serving
            self.internal_error(exchange, call or Call(msg))

    def _message(self, method: str, raw_target: str, watched: bytes | None, headers: Headers, peer: str,
                 route: Route | None) -> Message:
        """The Message of a request that arrived; the engine numbers its session now (Engine.see)."""
        agent = agent_name(header(headers, AGENT_HEADER_KEY))
        session, path = session_and_path(raw_target, watched, agent or peer)
        msg = Message(self.transport, Phase.REQUEST, session=session, http_method=method, path=path,
                      headers=HeaderView(headers), route=route.name if route else None)
        if not self.engine.idle:
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
        if method not in PLAIN_METHODS or target[:1] != b"/" or b"ession" in target or \
                not parser.should_keep_alive() or parser.should_upgrade():
            return None
        route, upstream_target = self._plain_route, target
        if route is None:  # routes by prefix, or a base path: the target changes on the way
            route, rest = self._route(target.decode("latin-1"))
            if route is None or rest is None:
                return None  # no route: the general path answers 404
            upstream_target = route.base_path + (rest.encode("latin-1") if route.prefix else target)
        engine = self.engine
        length, session, seen_host, picked, keep_alive_lines = -1, None, False, [], 0
        special = client.special  # the names Head's pass stops at
        read = engine.head_headers  # the names a rule's head check reads
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
        if not engine.idle:  # asked once for each head alike (what a rule's head checks read of it)
            key = (self.transport, route.name, method, target, *picked)
            verdicts = engine.head_verdicts
            if (could := verdicts.get(key)) is None:
                msg = self._raw_message(method, target, session, headers, client.peer, route)
                could = engine.could_act(msg)
                if len(target) + sum(len(value) for _, value in picked) <= MAX_VERDICT_HEAD:
                    if len(verdicts) >= MAX_VERDICTS:
                        verdicts.clear()
                    verdicts[key] = could
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
                sent = head_with(head, context) + body
        PlainRelay(self, exchange, route, conn, method, target, upstream_target, headers, session, body, sent, msg)
        return exchange

    def internal_error(self, exchange: ClientExchange, call: Call) -> None:
        ops.exception("internal error on %s %s", call.msg.http_method, call.msg.path)
        call.outcome = "proxy_error"
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
        call.outcome = "upstream_timeout" if timed_out else "upstream_error"
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
            except Exception:  # one call's failure must not stop the others' deadlines
                ops.exception("handling an upstream timeout failed")

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.waiting.clear()


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
            call.outcome = "client_disconnected"
            if self.conn is not None:
                self.conn.discard(self)
        except (ConnectionError, UpstreamError):
            call.outcome = "client_disconnected" if exchange.gone else "upstream_error"
            exchange.abort()
        except Exception:
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
        self.outcome = "client_disconnected"
        if self.conn is not None:
            self.conn.discard(self)
        self.finish(self.proxy.engine)


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
        self._log("ok")  # before the last piece goes (the client's writes are corked)
        self.exchange.finish()

    def upstream_failed(self, error: BaseException) -> None:
        self.promote().upstream_failed(error)

    def _client_gone(self) -> None:
        self.proxy.deadlines.done(self)
        self.conn.discard(self)
        self._log("client_disconnected")

    def _log(self, outcome: str) -> None:
        msg = self.msg
        called = rpc_call(msg.rpc) if msg is not None and msg.parsed else self.body or None
        self.proxy.engine.log.write_call((
            self.proxy.transport, self.session, self.exchange.conn.peer, self.route.name, self.method, self.target,
            self.status, outcome, self.conn.body_bytes, time.perf_counter() - self.started, called),
            _plain_call_line)
        if msg is not None and msg.trace is not None:
            msg.trace.end(outcome, status=self.status)


class ResponseReader:
    """An upstream response for a coroutine: await the head, then read the body piece by piece."""

    __slots__ = ("exchange", "head", "body", "conn", "timeout")
    as_is = AS_IS_NEVER  # what a coroutine reads may change on the way: never relayed as it came

    def __init__(self, exchange: ClientExchange, conn: UpstreamConnection, timeout: float) -> None:
        """`timeout`: --upstream-timeout, which `Deadlines` holds the head to (see `timed_out`)."""
        self.exchange = exchange
        self.conn = conn
        self.timeout = timeout
        self.head: asyncio.Future[Head] = asyncio.get_running_loop().create_future()
        self.body = Body(conn)

    def timed_out(self) -> None:
        """No response head within `timeout` (called by `Deadlines`)."""
        if not self.head.done():
            self.head.set_exception(UpstreamTimeout(f"no response head within {self.timeout:g} s"))

    def informational(self, status: int, reason: bytes, headers: Headers) -> None:
        self.exchange.informational(status, reason, headers)

    def response_head(self, head: Head) -> None:
        if not self.head.done():
            self.head.set_result(head)

    def response_as_is(self, status: int) -> None:  # never: it is AS_IS_NEVER
        raise AssertionError("a response read by a coroutine is never relayed as it came")

    def response_body(self, data: bytes) -> None:
        self.body.feed(data)

    def response_end(self, trailers: Headers) -> None:
        self.body.finish(trailers)

    def upstream_failed(self, error: BaseException) -> None:
        if not self.head.done():
            self.head.set_exception(error)
        else:
            self.body.fail(error)


class Inspection:
    """A request some rule may act on: read what rules need, decide, carry the actions out. When no
    rule can act on its response, a Passthrough takes the call over once the request is decided
    (`_hand_over`): the response is relayed by callbacks, as the upstream wrote it when it may."""

    def __init__(self, proxy: HttpProxy, exchange: ClientExchange, call: Call, route: Route, target: bytes) -> None:
        self.proxy = proxy
        self.engine = proxy.engine
        self.exchange = exchange
        self.call = call
        self.route = route
        self.target = target
        self.relay = route.relay_for(call.msg.path or "/")
        self.conn: UpstreamConnection | None = None
        self.reader: ResponseReader | None = None
        self.handed_over = False

    async def run(self) -> None:
        exchange, call = self.exchange, self.call
        by_address = call.msg.session == exchange.peer  # no session id, no agent name: clients may share it
        if by_address:
            self.engine.call_began(call.msg.session)
        try:
            await self._run()
        except asyncio.CancelledError:
            call.outcome = "client_disconnected"
            exchange.abort()
        except (ConnectionError, UpstreamError) as exc:  # the client went away, or the upstream broke mid-body
            if exchange.gone:
                call.outcome = "client_disconnected"
            else:
                self.proxy.upstream_failed(exchange, call, self.route, exc)
        except Exception:
            self.proxy.internal_error(exchange, call)
        finally:
            if by_address:
                self.engine.call_ended(call.msg.session)
            if self.conn is not None and self.reader is not None:
                self.conn.discard(self.reader)
            if not self.handed_over:  # (else the Passthrough logs it)
                call.finish(self.engine)

    async def _run(self) -> None:
        engine, exchange, call, msg = self.engine, self.exchange, self.call, self.call.msg
        head = exchange.head
        body: bytes | None = None  # the whole request body, when it was read
        prefix = b""  # the part read of a body too large to hold: the rest streams after it
        if head.has_body:
            wanted = self.proxy.max_message_bytes if engine.needs_body else SMALL_BODY
            if head.length is None or head.length <= wanted:
                exchange.send_continue()
                read, whole = await exchange.body.read_up_to(wanted)
                if whole:
                    body = msg.body = read
                else:
                    prefix = read
        llm = self.route.llm.open(msg)  # a model-API request: msg learns its api, model and turn
        if engine.tracing.on:  # the call's span; the proxy's context goes upstream in header and _meta
            start_span(engine, exchange, call, self.route, self.target)
            if body is not None and msg.body is not body:
                body = msg.body
        headers = self.route.request_head(head, call, upgrade=head.upgrade, body_read=body is not None)
        if engine.active(Phase.REQUEST):
            original = msg.body
            for fired in self._decide(msg):
                match fired.action:
                    case Delay(seconds):
                        await asyncio.sleep(seconds)
                    case Respond() as respond:
                        call.outcome = "fault_response"
                        return self.proxy._respond(exchange, call, respond)
                    case Reply(message, delay):
                        call.outcome = "fault_response"
                        await asyncio.sleep(delay)
                        return self.proxy._respond(exchange, call, self.relay.reply(msg, message))
                    case Hang(release_after):
                        call.outcome = "hang"
                        await asyncio.sleep(release_after if release_after is not None else float("inf"))
                        call.outcome = "ok"
                    case Reset():
                        call.outcome = "reset"
                        exchange.abort(reset=True)
                        return
            if msg.body is not original:  # a fault rewrote the JSON-RPC request
                body = msg.body
                headers = _mirror_rpc_headers(headers, msg)
        if msg.body is not None and self.relay.watching:
            self.relay.expect(msg)
        if llm is None and not head.upgrade and (body is not None or not head.has_body) and \
                not engine.could_act_on_reply(msg):
            self._hand_over(body, headers)
            return
        if llm is not None:
            original = msg.body
            llm.faults = call.faults
            await llm.prepare()
            llm.rewrite_request()
            if msg.body is not original:
                body = msg.body
        if engine.active(Phase.RESPONSE, wire=False) or (llm is not None and llm.watching):
            # rules read response bodies: ask for them plain
            headers = [*without(headers, b"accept-encoding"), (b"Accept-Encoding", b"identity")]
        streamed = head.has_body and body is None
        if body is not None:
            framing = body_framing(len(body), False)
        else:
            framing = body_framing(head.length, head.length is None) if streamed else b""
        request = first_line(head.method, self.target) + b"".join(
            name + b": " + value + b"\r\n" for name, value in headers) + framing + b"\r\n"
        replayable = not streamed and head.method in IDEMPOTENT
        deadlines = self.proxy.deadlines
        for attempt in (1, 2):
            reader = await self._send(request + (body or b""), prefix if streamed else None)
            deadlines.wait(reader)  # no head within --upstream-timeout: it fails with UpstreamTimeout
            response: Head | None = None
            try:
                response = await reader.head
            except UpstreamTimeout:
                raise
            except UpstreamError:
                assert self.conn is not None
                # a pooled connection the upstream had closed between requests: once more on a new one
                if attempt == 2 or not self.conn.reused or self.conn.response_started or not replayable:
                    raise
                self.conn = None
            finally:
                deadlines.done(reader)
            if response is not None:
                break
        assert response is not None  # (the second try's failure is raised)
        await self._relay(msg, response, reader, llm)

    def _hand_over(self, body: bytes | None, headers: Headers) -> None:
        """No rule can act on the response: a Passthrough takes the call, its request sent as decided
        here (`body` as read or rewritten, `headers` with the span's context), its response relayed by
        callbacks."""
        call = self.call
        passthrough = Passthrough(self.proxy, self.exchange, call.msg, self.route, self.target)
        passthrough.started, passthrough.faults = call.started, call.faults
        passthrough.body, passthrough.headers, passthrough.keep_body = body, headers, None
        self.handed_over = True
        passthrough.start()

    async def _send(self, request: bytes, streamed_prefix: bytes | None) -> ResponseReader:
        """Send the request upstream; a body too large to hold follows as it arrives."""
        exchange = self.exchange
        try:
            conn = self.conn = await self.route.pool.acquire()
        except (OSError, TimeoutError) as exc:
            raise UpstreamUnreachable(str(exc) or type(exc).__name__) from exc
        reader = self.reader = ResponseReader(exchange, conn, self.proxy.upstream_timeout)
        conn.begin(reader, head_request=exchange.head.method == "HEAD")
        conn.send(request)
        if streamed_prefix is None:
            conn.request_sent = True
        else:
            task = asyncio.get_running_loop().create_task(self._stream_body(conn, streamed_prefix))
            self.proxy._tasks.add(task)
            task.add_done_callback(self.proxy._tasks.discard)
        return reader

    async def _stream_body(self, conn: UpstreamConnection, prefix: bytes | None) -> None:
        """A request body too large to hold goes upstream as it arrives (re-chunked when its length is unknown)."""
        head = self.exchange.head
        chunked = head.length is None
        try:
            if prefix:
                conn.send(chunk(prefix) if chunked else prefix)
            async for piece in self.exchange.body.chunks():
                conn.send(chunk(piece) if chunked else piece)
                await conn.drain()
            if chunked:
                conn.send(last_chunk(()))  # see REQUEST_TRAILERS
            conn.request_sent = True
        except (ConnectionError, UpstreamError):
            if self.reader is not None:
                conn.discard(self.reader)

    async def _relay(self, msg: Message, response: Head, reader: ResponseReader, llm: LlmExchange | None) -> None:
        engine, exchange, call, relay = self.engine, self.exchange, self.call, self.relay
        call.status = response.status
        headers = response.end_to_end(drop=CONTENT_LENGTH)
        length = response.length
        content_type = (header(headers, b"content-type") or b"").decode("latin-1")
        is_stream = "text/event-stream" in content_type
        if response.upgrade:  # 101: from here on a tunnel both ways
            exchange.start(101, response.reason, response.end_to_end(keep=UPGRADE_AND_CONNECTION),
                           None, no_body=True)
            assert self.conn is not None
            self.conn.start_tunnel(exchange.conn)
            self.conn = self.reader = None
            exchange.finish()
            return
        if exchange.head.upgrade:
            exchange.close_after = True  # the client is not told to stop sending its other protocol
        actions: list[Any] = []
        if engine.active(Phase.RESPONSE):
            reply = Message(msg.transport, Phase.RESPONSE, session=msg.session, http_method=msg.http_method,
                            path=msg.path, headers=HeaderView(response.headers), status=response.status,
                            request=msg, route=msg.route)
            reply.api, reply.model, reply.turn = msg.api, msg.model, msg.turn
            actions = [fired.action for fired in self._decide(reply, messages=False)]
        if exchange.no_body or response.status in (204, 304):
            call.finish(engine)
            exchange.start(response.status, response.reason, headers, length)
            exchange.end(reader.body.trailers)
            return
        per_message = engine.active(Phase.RESPONSE, wire=False) if llm is None else llm.watching
        chunks: AsyncIterator[bytes] = reader.body.chunks()
        inspect = per_message and (is_stream or is_text(content_type))
        encoding = (header(headers, b"content-encoding") or b"identity").decode("latin-1").strip().lower()
        if inspect and encoding not in DECODABLE:
            inspect = False
            engine.log.skip(rule=None, transport=msg.transport, session=msg.session, path=msg.path,
                            reason=f"response body is {encoding}-encoded: rules cannot read it")
        elif inspect and is_stream and encoding != "identity":  # decoded as it arrives, relayed decoded
            chunks = streams.decoded(chunks, encoding)
            headers, length, encoding = without(headers, b"content-encoding"), None, "identity"
        payload: bytes | None = None
        if is_stream and llm is not None:
            if inspect:
                chunks, length = llm.relay_events(chunks, HeaderView(headers)), None
        elif is_stream and (inspect or (msg.http_method == "GET" and encoding == "identity")):
            chunks = relay.relay_events(chunks, msg, call.faults, self.proxy.max_message_bytes)
            length = None
        elif inspect and not is_stream and (length is None or length <= self.proxy.max_message_bytes):
            read, whole = await reader.body.read_up_to(self.proxy.max_message_bytes)
            if whole:
                payload, headers = self._relay_whole(read, encoding, response.status, headers, llm)
                # trailers go only on a chunked body
                chunks, length = streams.once(payload), None if reader.body.trailers else len(payload)
            else:
                chunks = streams.then(read, chunks)
        ending = "eof"
        for action in actions:
            match action:
                case Delay(seconds):
                    await asyncio.sleep(seconds)
                case Drip(size, delay):
                    chunks = streams.drip(chunks, size, delay)
                case Truncate(limit, fraction):
                    if limit is None:
                        chunks, limit = await self._fraction(chunks, length, fraction or 0.0, response, headers)
                    if limit is not None:
                        chunks, ending = streams.limit(chunks, limit), "close"
                case Reset(after_bytes):
                    chunks, ending = streams.limit(chunks, after_bytes or 0), "reset"
                case CutStream(after_events, idle):
                    chunks, ending = streams.sse_events(chunks, after_events), "idle" if idle else "cut"
        # a reply that is all here goes out in one send, after its call line: whoever reads the log once
        # the agent has its answer finds the call there (as a stream's pieces, by contrast, go at once)
        whole = not actions and (payload is not None or reader.body.done)
        if whole:
            exchange.conn.cork()
        if not exchange.started:
            exchange.start(response.status, response.reason, headers, length)
        async for piece in chunks:
            call.bytes_out += len(piece)
            if call.bytes_out == length and ending == "eof":  # the agent has it all with this piece: log first
                call.finish(engine)
            exchange.write(piece)
            if not whole:
                await exchange.drain()
        if whole:
            call.finish(engine)
            exchange.conn.uncork()
        match ending:
            case "eof":
                call.finish(engine)
                exchange.end(reader.body.trailers)
            case "cut":
                call.outcome = "stream_cut"
                call.finish(engine)
                exchange.end()  # a clean end, as a server that closed the stream
            case "close":
                call.outcome = "truncated"
                exchange.close()  # FIN after the bytes sent
            case "reset":
                call.outcome = "reset"
                exchange.abort(reset=True)
            case "idle":
                call.outcome = "stream_idle"
                await asyncio.Event().wait()  # until the client goes away

    def _relay_whole(self, raw: bytes, encoding: str, status: int, headers: Headers,
                     llm: LlmExchange | None) -> tuple[bytes, Headers]:
        """A whole reply body (`raw`, as the upstream encoded it) decided on: the body and headers the
        agent gets. An encoded body is read decoded; unless a fault changed it, it goes as it came."""
        msg = self.call.msg
        plain = raw if encoding == "identity" else streams.decode_whole(raw, encoding, self.proxy.max_message_bytes)
        if plain is None:
            self.engine.log.skip(rule=None, transport=msg.transport, session=msg.session, path=msg.path,
                                 reason=f"response body is not {encoding} of at most "
                                        f"{self.proxy.max_message_bytes} bytes: rules cannot read it")
            return raw, headers
        sent = headers
        if plain is not raw:
            headers = without(headers, b"content-encoding")
        replaced: dict[str, str] = {}
        view = HeaderView(headers)
        payload = llm.relay_body(plain, status, view) if llm is not None \
            else self.relay.relay_body(plain, msg, view, replaced, self.call.faults)
        if "Content-Type" in replaced:
            headers = [*without(headers, b"content-type"), (b"Content-Type", replaced["Content-Type"].encode("latin-1"))]
        elif plain is not raw and payload == plain:  # nothing changed it: the agent gets what was sent
            return raw, sent
        return payload, headers

    async def _fraction(self, chunks: AsyncIterator[bytes], length: int | None, fraction: float, response: Head,
                        headers: Headers) -> tuple[AsyncIterator[bytes], int | None]:
        """How many bytes `fraction` of the body is. A body of unknown length is held (headers sent
        first) until it ends; one that does not end within a while or a size is not truncated."""
        if length is not None:
            return chunks, int(length * fraction)
        self.exchange.start(response.status, response.reason, headers, None)
        held: list[bytes] = []
        size = 0
        try:
            async with asyncio.timeout(FRACTION_WAIT_S):
                async for piece in chunks:
                    held.append(piece)
                    size += len(piece)
                    if size > self.proxy.max_message_bytes:
                        raise TimeoutError
        except TimeoutError:
            msg = self.call.msg
            self.engine.log.skip(rule=None, fault="truncate", transport=msg.transport, session=msg.session,
                                 path=msg.path, reason="fraction of a body that did not end: relayed whole")
            return streams.then(b"".join(held), chunks), None
        return streams.once(b"".join(held)), int(size * fraction)

    def _decide(self, msg: Message, *, messages: bool = True) -> list[Fired]:
        fired = self.engine.decide(msg, messages=messages)
        self.call.faults.extend(f.rule.name for f in fired)
        return fired


DECODABLE = frozenset({"identity", "gzip", "x-gzip", "deflate"})  # bodies rules can read (decoded if need be)
FRACTION_WAIT_S = 2.0  # how long a body of unknown length is held to learn its size for `truncate`


def start_span(engine: Engine, exchange: ClientExchange, call: Call, route: Route, target: bytes) -> None:
    """Open the call's span (tracing on); the headers carrying the proxy's context go upstream with it."""
    call.upstream_headers = open_span(engine, call.msg, route, target, exchange.peer)


def open_span(engine: Engine, msg: Message, route: Route, target: bytes, peer: str, root: int = 0) -> Headers:
    """Open the span of a call to `target` on `route` (tracing on; `root`: see Tracing.start): the headers
    that carry the proxy's context upstream (lower-case names; none when the sampler leaves the call out)."""
    carrier = engine.tracing.start(msg, network="tcp", url=route.upstream + target.decode("latin-1").removeprefix(
        route.base_path.decode()), session_id=msg.session if msg.session != peer else None, root=root)
    return [(name.encode(), value.encode("latin-1")) for name, value in carrier.items()]


def log_call(engine: Engine, transport: str, msg: Message, exchange: Exchange) -> None:
    """The `event: call` line for one request, whatever befell it (the agent's behaviour is scored on these).

    Only the values are taken here (`_call_line` makes the line, at the log's next flush): an
    unparsed request body small enough is kept as it is, and read for its JSON-RPC fields then.
    """
    body = msg.body
    if type(body) is bytes and len(body) <= DEFERRED_BODY and not msg.parsed:
        called: Any = body
    else:
        called = rpc_call(msg.rpc) if body is not None else None
    engine.log.write_call((
        transport, msg.session, msg.route, msg.http_method, msg.path, exchange.status, exchange.outcome,
        exchange.bytes_out, time.perf_counter() - exchange.started, tuple(exchange.faults) if exchange.faults else (),
        called, (msg.api, msg.model, msg.turn) if msg.api is not None else None), _call_line)
    if msg.trace is not None:
        msg.trace.end(exchange.outcome, status=exchange.status)


DEFERRED_BODY = 64 << 10  # a request body up to this size is kept until the call line is made


def _call_line(ts: str, run_id: str, seed: int, record: tuple[Any, ...]) -> dict[str, Any]:
    (transport, session, route, http_method, path, status, outcome, bytes_out, duration_s, faults, called,
     model_call) = record
    line = {"ts": ts, "event": "call", "run_id": run_id, "seed": seed, "transport": transport, "session": session,
            "route": route, "http_method": http_method, "path": path, "status": status, "outcome": outcome,
            "bytes_out": bytes_out, "duration_ms": round(duration_s * 1e6) / 1000,  # round(x, 3) is slow
            "faults": faults}
    if type(called) is bytes:  # the request body, not parsed on the way
        called = rpc_call(parse_rpc(called))
    if called is not None:
        line["method"], line["tool"], line["rpc_id"] = called
    elif model_call is not None or (http_method == "POST" and path and api_for_path(path)):
        # a model-API call (named even when no rule acted and the body was never parsed)
        line["api"], line["model"], line["turn"] = model_call or (api_for_path(path), None, None)
    return line


def _plain_call_line(ts: str, run_id: str, seed: int, record: tuple[Any, ...]) -> dict[str, Any]:
    """A call line from a PlainRelay's record: its raw values decoded here, at the flush (what
    `_call_line` makes of them, with no fault, no model call, and the body not parsed yet)."""
    transport, watched, peer, route, method, target, status, outcome, bytes_out, duration_s, body = record
    raw = target.decode("latin-1")
    if watched is None and "?" not in raw and "%" not in raw:
        session, path = peer, raw
    else:
        session, path = session_and_path(raw, watched, peer)
    http_method = method_name(method)
    line = {"ts": ts, "event": "call", "run_id": run_id, "seed": seed, "transport": transport, "session": session,
            "route": route, "http_method": http_method, "path": path, "status": status, "outcome": outcome,
            "bytes_out": bytes_out, "duration_ms": round(duration_s * 1e6) / 1000, "faults": ()}
    called = rpc_call(parse_rpc(body)) if type(body) is bytes else body  # the body, or its fields read
    if called is not None:
        line["method"], line["tool"], line["rpc_id"] = called
    elif http_method == "POST" and (api := api_for_path(path)):
        line["api"], line["model"], line["turn"] = api, None, None
    return line


def is_text(content_type: str) -> bool:
    return "json" in content_type or content_type.startswith("text/")


def _mirror_rpc_headers(headers: Headers, msg: Message) -> Headers:
    """Keep the 2026-era mirrored headers consistent with a rewritten body (servers reject a mismatch)."""
    mirrored = mirrored_headers(msg)
    return [(name, value if (new := mirrored.get(name.lower().decode("latin-1"))) is None else new.encode())
            for name, value in headers]


REASONS = {status.value: status.phrase.encode() for status in HTTPStatus}  # made at import: see _reason


def _reason(status: int) -> bytes:
    """A status's reason phrase. Nothing here may need a file or much memory: a 502 for running out of
    open files is built by this."""
    return REASONS.get(status, b"Unknown")


def _upstream_error(upstream: str, exc: BaseException, timed_out: bool) -> Respond:
    what = "timed out" if timed_out else "unreachable"
    body = orjson.dumps({"error": {"code": 504 if timed_out else 502, "message": f"chaosproxy: upstream {upstream} {what}",
                                   "detail": str(exc) or type(exc).__name__}})
    return Respond(504 if timed_out else 502, body, {
        "Content-Type": "application/json", "X-Chaosproxy-Error": f"upstream-{what.replace('timed out', 'timeout')}"})


def _not_a_forward_proxy(method: str) -> Respond:
    body = orjson.dumps({"error": {"code": 400, "message": (
        f"chaosproxy run is a reverse proxy and cannot serve {'CONNECT' if method == 'CONNECT' else 'absolute-form'} "
        "requests: point the agent's base URL at it (http://HOST:PORT/...), or use `chaosproxy mitm` as a "
        "forward proxy (HTTP_PROXY/HTTPS_PROXY)")}})
    return Respond(400, body, {"Content-Type": "application/json", "X-Chaosproxy-Error": "not-a-forward-proxy"})
