"""HTTP reverse proxy adapter (aiohttp): forwards every path to one upstream, faults per request.

Bodies stream through chunk by chunk; a request body is read whole only when a rule needs to look
inside it (JSON-RPC method or tool), and a response body only when a fault needs its length.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

import aiohttp
import orjson
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from chaosproxy import streams
from chaosproxy.adapters.jsonrpc import JsonRpcRelay
from chaosproxy.actions import CutStream, Delay, Drip, Hang, Reply, Reset, Respond, Truncate
from chaosproxy.engine import Engine, Fired
from chaosproxy.llm.relay import LlmExchange, LlmRelay
from chaosproxy.log import ops
from chaosproxy.message import Message, Phase

HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te",
                        "trailer", "trailers", "transfer-encoding", "upgrade", "proxy-connection", "host"})
SMALL_BODY = 1 << 20  # request bodies up to this size are read in one go; larger ones stream
RULE_BODY_LIMIT = 16 << 20  # the largest request body a rule may look inside


def forwardable(headers: CIMultiDictProxy[str], *, drop: frozenset[str] = frozenset()) -> CIMultiDict[str]:
    """All headers but hop-by-hop ones (including those the Connection header names)."""
    hop = HOP_BY_HOP | drop
    if connection := headers.get("Connection"):
        hop = hop | {token.strip().lower() for token in connection.split(",")}
    forwarded: CIMultiDict[str] = CIMultiDict()
    spelling: dict[str, str] = {}  # repeated names keep their first spelling: aiohttp's client would
    for name, value in headers.items():  # otherwise keep only the last of X-V / X-v
        lower = name.lower()
        if lower not in hop:
            forwarded.add(spelling.setdefault(lower, name), value)
    return forwarded


class Exchange:
    """What the call log needs to know about one request, filled in as it goes."""

    __slots__ = ("started", "status", "bytes_out", "outcome", "faults")

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.status: int | None = None
        self.bytes_out = 0
        self.outcome = "ok"
        self.faults: list[str] = []


class Route:
    """Requests under `prefix` go to `upstream` with the prefix taken off ("/" takes everything else)."""

    __slots__ = ("prefix", "name", "upstream", "relay", "llm")

    def __init__(self, prefix: str, upstream: str, engine: Engine, transport: str) -> None:
        self.prefix = prefix.rstrip("/")
        self.name = self.prefix.lstrip("/") or "default"
        self.upstream = str(URL(upstream)).rstrip("/")
        self.relay = JsonRpcRelay(engine, transport, URL(self.upstream), self.prefix)
        self.llm = LlmRelay(engine)  # model-API requests (chat/completions, messages, responses)

    def target(self, raw_path: str) -> str | None:
        """The upstream URL for a request path (with query), or None when the path is not under the prefix."""
        if not self.prefix:
            return self.upstream + raw_path
        rest = raw_path[len(self.prefix):]
        if raw_path.startswith(self.prefix) and (not rest or rest[0] in "/?"):
            return self.upstream + (rest if rest.startswith("/") else "/" + rest)
        return None


class HttpProxy:
    """Reverse proxy from one listener to one upstream, or to several by path prefix (routes)."""

    def __init__(self, engine: Engine, upstream: str | Mapping[str, str], *, transport: str = "http") -> None:
        self.engine = engine
        self.transport = transport
        routes = {"/": upstream} if isinstance(upstream, str) else upstream
        # longest prefix first, so /a/b wins over /a and / catches the rest
        self.routes = sorted((Route(prefix, url, engine, transport) for prefix, url in routes.items()),
                             key=lambda route: len(route.prefix), reverse=True)
        self._client: aiohttp.ClientSession | None = None
        self._runner: web.ServerRunner | None = None

    async def start(self, host: str, port: int) -> int:
        """Listen; returns the bound port (useful with port 0)."""
        self._client = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=None, enable_cleanup_closed=True),
            auto_decompress=False,
            cookie_jar=aiohttp.DummyCookieJar(),
            skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding", "Content-Type"),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
        )
        server = web.Server(self.handle, handler_cancellation=True, access_log=None)
        self._runner = web.ServerRunner(server, handle_signals=False, shutdown_timeout=1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port, reuse_address=True)
        await site.start()
        return site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._client is not None:
            await self._client.close()

    def _route(self, raw_path: str) -> tuple[Route | None, str | None]:
        for route in self.routes:
            if (url := route.target(raw_path)) is not None:
                return route, url
        return None, None

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        exchange = Exchange()
        raw_path = request.raw_path
        session = request.headers.get("Mcp-Session-Id")
        if session is None:  # legacy HTTP+SSE names the session in the query; parse it only then
            query = request.query if "ession" in raw_path else {}
            session = query.get("sessionId") or query.get("session_id") or request.remote or "-"
        route, url = self._route(raw_path)
        msg = Message(self.transport, Phase.REQUEST, session=session, http_method=request.method,
                      path=request.path, headers=request.headers, route=route.name if route else None)
        try:
            if route is None or url is None:  # never an open relay: only configured upstreams
                exchange.outcome = "no_route"
                body = orjson.dumps({"error": {"code": 404, "message": f"chaosproxy: no route for {request.path}",
                                               "routes": [r.prefix or "/" for r in self.routes]}})
                return self._respond(Respond(404, body, {"Content-Type": "application/json"}), exchange)
            return await self._proxy(request, msg, exchange, route, url)
        except asyncio.CancelledError:
            exchange.outcome = "client_disconnected"
            raise
        except aiohttp.ClientError as exc:  # upstream broke off its reply before we answered: a 502, logged
            exchange.outcome = "upstream_error"
            ops.warning("upstream %s broke off its reply to %s %s: %s", url, request.method, request.path, exc)
            return self._respond(_upstream_error(str(url), exc), exchange)
        finally:
            log_call(self.engine, self.transport, msg, exchange)
            if request.method == "DELETE" and "Mcp-Session-Id" in request.headers and \
                    exchange.status is not None and exchange.status < 300:  # the agent ended its MCP session
                self.engine.end_session(session)

    async def _proxy(self, request: web.BaseRequest, msg: Message, exchange: Exchange, route: Route,
                     url: str) -> web.StreamResponse:
        engine = self.engine
        body: bytes | aiohttp.StreamReader | None = None
        if request.body_exists:
            length = request.content_length
            wanted = SMALL_BODY if not engine.needs_body else RULE_BODY_LIMIT
            body = await request.content.readexactly(length) if length is not None and length <= wanted \
                else request.content
            if isinstance(body, bytes):
                msg.body = body

        headers = forwardable(request.headers)
        llm = route.llm.open(msg)  # a model-API request: msg learns its api, model and turn
        if engine.tracing.on:  # the call's span; the proxy's context goes upstream in header and _meta
            session = msg.session if msg.session != (request.remote or "-") else None
            headers.update(engine.tracing.start(msg, network="tcp", url=url, session_id=session))
            if isinstance(body, bytes) and msg.body is not body:
                body = msg.body
                headers.popall("Content-Length", None)
        if engine.active(Phase.REQUEST):
            original = msg.body
            for fired in self._decide(msg, exchange):
                match fired.action:
                    case Delay(seconds):
                        await asyncio.sleep(seconds)
                    case Respond() as respond:
                        exchange.outcome = "fault_response"
                        return self._respond(respond, exchange)
                    case Reply(message, delay):
                        exchange.outcome = "fault_response"
                        await asyncio.sleep(delay)
                        return self._respond(route.relay.reply(msg, message), exchange)
                    case Hang(release_after):
                        exchange.outcome = "hang"
                        await asyncio.sleep(release_after if release_after is not None else float("inf"))
                        exchange.outcome = "ok"
                    case Reset():
                        exchange.outcome = "reset"
                        reset_transport(request.transport)
                        return web.Response(status=499)  # never sent: the connection is gone
            if msg.body is not original:  # a fault rewrote the JSON-RPC request
                body = msg.body
                _mirror_rpc_headers(headers, msg)
        if llm is not None:
            original = msg.body
            llm.faults = exchange.faults
            llm.rewrite_request()
            if msg.body is not original:
                body = msg.body
                headers.popall("Content-Length", None)
            if llm.watching:  # the reply will be read: ask for it uncompressed
                headers["Accept-Encoding"] = "identity"

        if msg.body is not None and route.relay.watching:
            route.relay.expect(msg)
        assert self._client is not None
        try:
            upstream = await self._client.request(request.method, URL(url, encoded=True), headers=headers, data=body,
                                                  allow_redirects=False)
        except (aiohttp.ClientError, OSError) as exc:
            exchange.outcome = "upstream_error"
            route.relay.forget(msg)
            ops.warning("upstream %s unreachable for %s %s: %s", route.upstream, request.method, request.path, exc)
            return self._respond(_upstream_error(route.upstream, exc), exchange)
        async with upstream:
            return await self._relay(request, msg, upstream, exchange, route.relay, llm)

    async def _relay(self, request: web.BaseRequest, msg: Message, upstream: aiohttp.ClientResponse,
                     exchange: Exchange, relay: JsonRpcRelay, llm: LlmExchange | None) -> web.StreamResponse:
        exchange.status = upstream.status
        headers = forwardable(upstream.headers, drop=frozenset({"content-length"}))
        length = upstream.content_length
        is_stream = "text/event-stream" in upstream.headers.get("Content-Type", "")
        actions = ()
        if self.engine.active(Phase.RESPONSE):
            reply = Message(self.transport, Phase.RESPONSE, session=msg.session, http_method=msg.http_method,
                            path=msg.path, headers=upstream.headers, status=upstream.status, request=msg,
                            route=msg.route)
            reply.api, reply.model, reply.turn = msg.api, msg.model, msg.turn
            actions = [fired.action for fired in self._decide(reply, exchange, messages=False)]

        per_message = self.engine.active(Phase.RESPONSE, wire=False) if llm is None else llm.watching
        # JSON-RPC replies and plain JSON or text bodies are read whole when a rule acts on messages
        read_whole = per_message and not is_stream and is_text(upstream.headers.get("Content-Type", "")) \
            and (length is None or length <= RULE_BODY_LIMIT)
        whole = (lambda payload: llm.relay_body(payload, upstream.status, upstream.headers)) if llm is not None \
            else (lambda payload: relay.relay_body(payload, msg, headers))
        if not actions and length is not None and length <= SMALL_BODY and not is_stream:
            payload = await upstream.read()
            if read_whole:
                payload = whole(payload)
            exchange.bytes_out = len(payload)
            return web.Response(status=upstream.status, reason=upstream.reason, headers=headers, body=payload)

        chunks: AsyncIterator[bytes] = upstream.content.iter_any()
        if is_stream and llm is not None:
            if per_message:
                chunks, length = llm.relay_events(chunks, upstream.headers), None
        elif is_stream and (per_message or request.method == "GET"):
            chunks = relay.relay_events(chunks, msg)  # legacy endpoint rewrite, per-message faults
        elif read_whole:
            payload = whole(await upstream.read())
            chunks, length = _once(payload), len(payload)
        response = web.StreamResponse(status=upstream.status, reason=upstream.reason, headers=headers)
        if length is not None and request.method != "HEAD":
            response.content_length = length
        ending = "eof"
        for action in actions:
            match action:
                case Delay(seconds):
                    await asyncio.sleep(seconds)
                case Drip(size, delay):
                    chunks = streams.drip(chunks, size, delay)
                case Truncate(limit, fraction):
                    if limit is None:
                        whole = length if length is not None else len(payload := await upstream.read())
                        limit = int(whole * fraction)  # type: ignore[operator]
                        if length is None:
                            chunks = _once(payload)
                    chunks, ending = streams.limit(chunks, limit), "close"
                case Reset(after_bytes):
                    chunks, ending = streams.limit(chunks, after_bytes or 0), "reset"
                case CutStream(after_events, idle):
                    chunks, ending = streams.sse_events(chunks, after_events), "idle" if idle else "cut"
        await response.prepare(request)
        try:
            async for chunk in chunks:
                exchange.bytes_out += len(chunk)
                await response.write(chunk)
        except aiohttp.ClientError as exc:  # upstream broke off mid-reply: the agent's reply is cut off too
            exchange.outcome = "upstream_error"
            ops.warning("upstream broke off its reply to %s %s: %s", request.method, request.path, exc)
            request.transport.close()  # type: ignore[union-attr]
            return response
        match ending:
            case "eof":
                await response.write_eof()
            case "cut":
                exchange.outcome = "stream_cut"
                await response.write_eof()  # a clean end, as a server that closed the stream
            case "close":
                exchange.outcome = "truncated"
                request.transport.close()  # type: ignore[union-attr]  # FIN after the bytes sent
            case "reset":
                exchange.outcome = "reset"
                reset_transport(request.transport)
            case "idle":
                exchange.outcome = "stream_idle"
                await asyncio.Event().wait()  # until the client goes away
        return response

    def _decide(self, msg: Message, exchange: Exchange, *, messages: bool = True) -> list[Fired]:
        fired = self.engine.decide(msg, messages=messages)
        exchange.faults.extend(f.rule.name for f in fired)
        return fired

    def _respond(self, respond: Respond, exchange: Exchange) -> web.Response:
        exchange.status = respond.status
        exchange.bytes_out = len(respond.body)
        return web.Response(status=respond.status, body=respond.body, headers=respond.headers)


def log_call(engine: Engine, transport: str, msg: Message, exchange: Exchange) -> None:
    """The `event: call` line for one request, whatever befell it (the agent's behaviour is scored on these)."""
    fields: dict[str, Any] = {}
    if msg.api is not None:
        fields = {"api": msg.api, "model": msg.model, "turn": msg.turn}
    elif msg.body is not None and (rpc := msg.rpc) is not None:
        fields = {"method": msg.method, "tool": msg.tool, "rpc_id": rpc.get("id")}
    engine.log.call(
        transport=transport, session=msg.session, route=msg.route, http_method=msg.http_method, path=msg.path,
        status=exchange.status, outcome=exchange.outcome, bytes_out=exchange.bytes_out,
        duration_ms=round((time.perf_counter() - exchange.started) * 1000, 3),
        faults=exchange.faults, **fields,
    )
    if msg.trace is not None:
        msg.trace.end(exchange.outcome, status=exchange.status)


async def _once(payload: bytes) -> AsyncIterator[bytes]:
    yield payload


def reset_transport(transport: asyncio.BaseTransport | None) -> None:
    """Abort with RST (SO_LINGER 0) rather than a polite FIN, as a crashed server or middlebox would."""
    if transport is None:
        return
    sock: socket.socket | None = transport.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


def is_text(content_type: str) -> bool:
    return "json" in content_type or content_type.startswith("text/")


def _mirror_rpc_headers(headers: CIMultiDict[str], msg: Message) -> None:
    """Keep the 2026-era mirrored headers consistent with a rewritten body (servers reject a mismatch)."""
    if "Mcp-Name" in headers and msg.tool is not None:
        headers["Mcp-Name"] = msg.tool
    if "Mcp-Method" in headers and msg.method is not None:
        headers["Mcp-Method"] = msg.method
    headers.popall("Content-Length", None)


def _upstream_error(upstream: str, exc: BaseException) -> Respond:
    body = orjson.dumps({"error": {"code": 502, "message": f"chaosproxy: upstream {upstream} unreachable",
                                   "detail": str(exc) or type(exc).__name__}})
    return Respond(502, body, {"Content-Type": "application/json", "X-Chaosproxy-Error": "upstream-unreachable"})


