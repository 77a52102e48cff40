"""The inspecting path: a request some rule may act on, in a coroutine that reads what rules need,
asks the engine, and carries the actions out on the request and its response."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from chaosproxy.adapters.a2a_relay import A2aExchange
from chaosproxy.adapters.errors import UpstreamError, UpstreamTimeout, UpstreamUnreachable
from chaosproxy.adapters.execute import OUTCOMES, act_on_request, decide, shape_body
from chaosproxy.adapters.h1 import (
    AS_IS_NEVER,
    IDEMPOTENT,
    Body,
    ClientExchange,
    Head,
    Headers,
    UpstreamConnection,
    chunk,
    last_chunk,
)
from chaosproxy.adapters.http.calls import Call, start_span
from chaosproxy.adapters.http.heads import (
    CONTENT_LENGTH,
    SMALL_BODY,
    UPGRADE_AND_CONNECTION,
    HeaderView,
    body_framing,
    first_line,
    header,
    is_text,
    mirror_rpc_headers,
    without,
)
from chaosproxy.adapters.http.passthrough import Passthrough
from chaosproxy.adapters.http.route import Route
from chaosproxy.adapters.llm_relay import LlmExchange
from chaosproxy.adapters.shaping import Stage, planned, shaped
from chaosproxy.adapters.shaping import ending as body_ending
from chaosproxy.engine.actions import Action, Respond
from chaosproxy.engine.message import Message, Phase
from chaosproxy.protocols import streams
from chaosproxy.telemetry.log_schema import Outcome, StreamEnd

if TYPE_CHECKING:
    from chaosproxy.adapters.http.proxy import HttpProxy


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
            call.outcome = Outcome.CLIENT_DISCONNECTED
            exchange.abort()
        except (ConnectionError, UpstreamError) as exc:  # the client went away, or the upstream broke mid-body
            if exchange.gone:
                call.outcome = Outcome.CLIENT_DISCONNECTED
            else:
                self.proxy.upstream_failed(exchange, call, self.route, exc)
        except Exception:  # fail open: the proxy's own failure answered 502 (internal_error), never a 500
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
        interest = engine.interest  # the scenario in force when the request came
        head = exchange.head
        body: bytes | None = None  # the whole request body, when it was read
        prefix = b""  # the part read of a body too large to hold: the rest streams after it
        if head.has_body:
            wanted = self.proxy.max_message_bytes if interest.request_bodies else SMALL_BODY
            if head.length is None or head.length <= wanted:
                exchange.send_continue()
                read, whole = await exchange.body.read_up_to(wanted)
                if whole:
                    body = msg.body = read
                else:
                    prefix = read
        llm = self.route.llm.open(msg)  # a model-API request: msg learns its api, model and turn
        a2a = self.route.a2a.open(msg) if llm is None else None  # an A2A request: msg learns its method, task...
        if engine.tracing.on:  # the call's span; the proxy's context goes upstream in header and _meta
            start_span(engine, exchange, call, self.route, self.target)
            if body is not None and msg.body is not body:
                body = msg.body
        headers = self.route.request_head(head, call, upgrade=head.upgrade, body_read=body is not None)
        if interest.acts(Phase.REQUEST):
            original = msg.body
            if (fired := decide(engine, msg, call)) and await act_on_request(fired, call, self, self.relay, msg):
                return
            if msg.body is not original:  # a fault rewrote the JSON-RPC request
                body = msg.body
                headers = mirror_rpc_headers(headers, msg)
        if a2a is not None:
            a2a.faults, original = call.faults, msg.body
            if (answer := await a2a.answer()) is not None:
                call.outcome = Outcome.FAULT_RESPONSE
                return self.proxy._respond(exchange, call, answer)
            if msg.body is not original:  # a fault rewrote the REST request's body
                body = msg.body
            headers = a2a.request_headers(headers)
        if engine.lists_tools_first(msg) and not self.relay.answers_on_stream(msg):
            from chaosproxy.adapters.listing import list_tools  # (aiohttp's client: loaded when first needed)
            engine.learn_listing(msg, await list_tools(self.route.url_of(self.target), headers, msg.rpc or {},
                                                       self.proxy.max_message_bytes))
        if msg.body is not None and self.relay.watching:
            self.relay.expect(msg)
        if llm is None and (a2a is None or not a2a.watching) and not head.upgrade and \
                (body is not None or not head.has_body) and not interest.could_act_on_reply(msg):
            self._hand_over(body, headers)
            return
        if llm is not None:
            original = msg.body
            llm.faults = call.faults
            await llm.prepare()
            llm.rewrite_request()
            if msg.body is not original:
                body = msg.body
            if not llm.watching and not head.upgrade and (body is not None or not head.has_body) and \
                    not interest.acts(Phase.RESPONSE, messages=False):  # no rule can change its reply
                self._hand_over(body, headers)
                return
        if interest.acts(Phase.RESPONSE, wire=False) or (llm is not None and llm.watching) or \
                (a2a is not None and a2a.watching):
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
        await self._relay(msg, response, reader, llm, a2a)

    # the request's side of the executor (adapters/execute.RequestSide)

    def answer(self, respond: Respond) -> None:
        self.proxy._respond(self.exchange, self.call, respond)

    async def hold(self, seconds: float | None) -> bool:
        """(An agent that goes away cancels the call's task.)"""
        await asyncio.sleep(seconds if seconds is not None else float("inf"))
        return False

    async def reset(self, delay: float) -> None:
        await asyncio.sleep(delay)
        self.exchange.abort(reset=True)

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

    async def _relay(self, msg: Message, response: Head, reader: ResponseReader, llm: LlmExchange | None,
                     a2a: A2aExchange | None) -> None:
        engine, exchange, call, relay = self.engine, self.exchange, self.call, self.relay
        interest = engine.interest  # the scenario in force when the response came
        call.status = status = response.status
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
        actions: list[Action] = []
        if interest.acts(Phase.RESPONSE):
            reply = Message(msg.transport, Phase.RESPONSE, session=msg.session, http_method=msg.http_method,
                            path=msg.path, headers=HeaderView(response.headers), status=response.status,
                            request=msg, route=msg.route)
            reply.api, reply.model, reply.turn, reply.a2a = msg.api, msg.model, msg.turn, msg.a2a
            # the body's length, when known and no rule on messages can change it: a cut past it does not fire
            fixed = llm is None and a2a is None and not interest.acts(Phase.RESPONSE, wire=False)
            known = 0 if exchange.no_body or status in (204, 304) else length
            actions = [fired.action for fired in decide(engine, reply, call, messages=False,
                                                        body_length=known if fixed else None)]
        if exchange.no_body or response.status in (204, 304):
            call.finish(engine)
            exchange.start(response.status, response.reason, headers, length)
            exchange.end(reader.body.trailers)
            return
        per_message = llm.watching if llm is not None else a2a.watching if a2a is not None else \
            interest.acts(Phase.RESPONSE, wire=False)
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
        elif is_stream and a2a is not None:
            if inspect:
                chunks, length = a2a.relay_events(chunks), None
        elif is_stream and (inspect or (msg.http_method == "GET" and encoding == "identity")):
            chunks = relay.relay_events(chunks, msg, call.faults, self.proxy.max_message_bytes)
            length = None
        elif a2a is not None and a2a.card and response.status == 200 and not is_stream:
            read, whole = await reader.body.read_up_to(self.proxy.max_message_bytes)
            if whole:  # its URLs pointed back here, faults on it decided (its own ETag, a 304 of the proxy's)
                status, payload, headers = self._relay_card(read, encoding, headers, a2a)
                chunks, length = streams.once(payload), len(payload)
            else:
                chunks = streams.then(read, chunks)
        elif inspect and not is_stream and (length is None or length <= self.proxy.max_message_bytes):
            read, whole = await reader.body.read_up_to(self.proxy.max_message_bytes)
            if whole:
                payload, headers = self._relay_whole(read, encoding, response.status, headers, llm, a2a)
                # trailers go only on a chunked body
                chunks, length = streams.once(payload), None if reader.body.trailers else len(payload)
            else:
                chunks = streams.then(read, chunks)
        stages: list[Stage] = []
        if actions:  # the body as the faults on the response's head shape it (of its length as relayed)
            shape = shape_body(actions, length, max_held=self.proxy.max_message_bytes, engine=engine, request=msg)
            if shape.delay:
                await asyncio.sleep(shape.delay)
            if stages := shape.stages:
                chunks = shaped(chunks, stages, shape.pace)
        # a reply that is all here goes out in one send, after its call line: whoever reads the log once
        # the agent has its answer finds the call there (as a stream's pieces, by contrast, go at once)
        whole = not actions and (payload is not None or reader.body.done)
        if whole:
            exchange.conn.cork()
        if not exchange.started:
            exchange.start(status, response.reason if status == response.status else b"Not Modified", headers,
                           length)  # (a card's 304 is the only status the proxy changes here)
        ending = planned(stages)  # (a body its stages never cut ends as upstream ends it)
        async for piece in chunks:
            call.bytes_out += len(piece)
            if call.bytes_out == length and ending == StreamEnd.EOF:  # the agent has it all with this piece: log first
                call.finish(engine)
            exchange.write(piece)
            if not whole:
                await exchange.drain()
        if whole:
            call.finish(engine)
            exchange.conn.uncork()
        ending = body_ending(stages)
        call.outcome = OUTCOMES.get(ending, call.outcome)
        match ending:
            case StreamEnd.EOF:
                call.finish(engine)
                exchange.end(reader.body.trailers)
            case StreamEnd.CUT:
                call.finish(engine)
                exchange.end()  # a clean end, as a server that closed the stream
            case StreamEnd.CLOSE:
                exchange.close()  # FIN after the bytes sent
            case StreamEnd.RESET:
                exchange.abort(reset=True)
            case StreamEnd.IDLE:
                await asyncio.Event().wait()  # until the client goes away

    def _relay_whole(self, raw: bytes, encoding: str, status: int, headers: Headers,
                     llm: LlmExchange | None, a2a: A2aExchange | None) -> tuple[bytes, Headers]:
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
        if llm is not None:
            payload = llm.relay_body(plain, status, view)
        elif a2a is not None:
            payload = a2a.relay_body(plain, status)
        else:
            payload = self.relay.relay_body(plain, msg, view, replaced, self.call.faults)
        if "Content-Type" in replaced:
            headers = [*without(headers, b"content-type"),
                       (b"Content-Type", replaced["Content-Type"].encode("latin-1"))]
        elif plain is not raw and payload == plain:  # nothing changed it: the agent gets what was sent
            return raw, sent
        return payload, headers

    def _relay_card(self, raw: bytes, encoding: str, headers: Headers, a2a: A2aExchange) -> tuple[int, bytes, Headers]:
        """An agent card as the agent gets it: status, body (as it came unless changed) and headers."""
        plain = raw if encoding == "identity" else streams.decode_whole(raw, encoding, self.proxy.max_message_bytes)
        if plain is None:
            return 200, raw, headers
        replaced: dict[str, str] = {}
        status, payload = a2a.relay_card(plain, replaced)
        self.call.status = status
        if payload is plain and not replaced:
            return status, raw, headers
        if plain is not raw:
            headers = without(headers, b"content-encoding")
        for name, value in replaced.items():
            encoded = name.encode("latin-1")
            headers = [*without(headers, encoded.lower()), (encoded, value.encode("latin-1"))]
        return status, payload, headers


DECODABLE = frozenset({"identity", "gzip", "x-gzip", "deflate"})  # bodies rules can read (decoded if need be)

