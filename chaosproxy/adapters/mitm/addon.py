"""The mitmproxy addon: each request and response of the listed hosts through the engine, its actions
carried out by the executor every HTTP transport shares (adapters/execute) on mitmproxy's flows.

mitmproxy's hooks are awaited and hold their flow, so request-side actions and response delays are
plain awaits; response bodies go through `flow.response.stream` (adapters/mitm/bodies).
"""

from __future__ import annotations

import asyncio
from urllib.parse import unquote

from mitmproxy import http
from mitmproxy.addons import proxyserver
from mitmproxy.connection import Client
from yarl import URL

from chaosproxy.adapters import shaping
from chaosproxy.adapters.execute import act_on_request, decide, shape_body
from chaosproxy.adapters.http.calls import Exchange, log_call
from chaosproxy.adapters.http.heads import RULE_BODY_LIMIT, SMALL_BODY, TRACE_CONTEXT, is_text
from chaosproxy.adapters.jsonrpc import JsonRpcRelay
from chaosproxy.adapters.llm_relay import LlmExchange, LlmRelay
from chaosproxy.adapters.mitm.bodies import LlmEvents, Shaper, SseMessages, WholeBody
from chaosproxy.adapters.mitm.hosts import HostPatterns
from chaosproxy.adapters.mitm.wire import Wire
from chaosproxy.adapters.shaping import Stage
from chaosproxy.engine.actions import Respond
from chaosproxy.engine.core import Engine
from chaosproxy.engine.message import Message, Phase, mirrored_headers
from chaosproxy.engine.sessions import AGENT_HEADER, agent_name
from chaosproxy.telemetry.log import ops
from chaosproxy.telemetry.log_schema import Outcome, StreamEnd

TRANSPORT = "mitm"
_KEY = "chaosproxy"  # our state in flow.metadata
_CLOSING = (StreamEnd.CLOSE, StreamEnd.RESET, StreamEnd.CUT)  # endings carried out on the agent's connection
# The agent already talks to the real origin, so a legacy `endpoint` event needs no rewrite: the relay is
# given an origin no endpoint names.
_NO_UPSTREAM = URL("http://chaosproxy.invalid")


class Flow(Exchange):
    """One intercepted request: the call log's record, the engine's message, and where its answer stands."""

    __slots__ = ("msg", "llm", "decided", "read_whole", "hold", "cut", "logged")

    def __init__(self, msg: Message) -> None:
        super().__init__()
        self.msg = msg
        self.llm: LlmExchange | None = None  # a model-API request (chaosproxy.protocols.llm)
        self.decided = False  # decided at requestheaders when the body streams, else at request
        self.read_whole = False  # a buffered body whose JSON-RPC messages are decided at the response hook
        self.hold = False  # a stream cut with then: idle stays open until the agent gives up
        self.cut = False  # the proxy ended the connection itself: the agent did not go away
        self.logged = False


class ChaosAddon:
    """The mitmproxy addon: asks the engine about each request and response of the listed hosts."""

    def __init__(self, engine: Engine, hosts: HostPatterns) -> None:
        self.engine = engine
        self.hosts = hosts
        self.relay = JsonRpcRelay(engine, TRANSPORT, _NO_UPSTREAM)
        self.llm = LlmRelay(engine)
        self.proxyserver: proxyserver.Proxyserver | None = None  # set by MitmProxy, for Wire
        self._gone: dict[str, asyncio.Event] = {}  # client id -> set when it disconnects
        self._stopping = False

    # mitmproxy hooks

    async def requestheaders(self, flow: http.HTTPFlow) -> None:
        request = flow.request
        if request.pretty_host not in self.hosts:  # plain HTTP to a host we leave alone
            request.stream = True
            return
        agent = agent_name(request.headers.get(AGENT_HEADER))
        session = (request.headers.get("Mcp-Session-Id") or request.query.get("sessionId")
                   or request.query.get("session_id") or agent or flow.client_conn.peername[0] or "-")
        msg = Message(TRANSPORT, Phase.REQUEST, session=session, http_method=request.method,
                      path=unquote(request.path.partition("?")[0]), headers=request.headers,
                      route=request.pretty_host)
        interest = self.engine.interest
        if not interest.idle:
            self.engine.see(session, TRANSPORT, msg.route, agent)
        state = flow.metadata[_KEY] = Flow(msg)
        length = _body_length(request.headers, response=False)
        wanted = RULE_BODY_LIMIT if interest.request_bodies else SMALL_BODY
        if length is None and interest.request_bodies and "json" in request.headers.get("content-type", ""):
            return  # a chunked JSON(-RPC) request: read whole, decided on its messages at the request hook
        if length is None or length > wanted:  # decided on the headers; the body streams through
            request.stream = True
            await self._on_request(flow, state)

    async def request(self, flow: http.HTTPFlow) -> None:
        state: Flow | None = flow.metadata.get(_KEY)
        if state is None or state.decided:
            return
        if flow.request.stream:  # a chunked body past RULE_BODY_LIMIT: mitmproxy has passed it on already
            state.decided = True
            self._undecided(state, "request")
            return
        state.msg.body = flow.request.raw_content or None
        await self._on_request(flow, state)

    async def responseheaders(self, flow: http.HTTPFlow) -> None:
        response = flow.response
        assert response is not None
        state: Flow | None = flow.metadata.get(_KEY)
        if state is None:
            response.stream = True
            return
        state.status = response.status_code
        headers = response.headers
        content_type = headers.get("Content-Type", "")
        is_stream = "text/event-stream" in content_type
        length = _body_length(headers, response=True)
        reply = Message(TRANSPORT, Phase.RESPONSE, session=state.msg.session, http_method=state.msg.http_method,
                        path=state.msg.path, headers=headers, status=response.status_code, request=state.msg,
                        route=state.msg.route)
        reply.api, reply.model, reply.turn = state.msg.api, state.msg.model, state.msg.turn
        interest = self.engine.interest
        per_message = interest.acts(Phase.RESPONSE, wire=False) if state.llm is None else state.llm.watching
        fired = decide(self.engine, reply, state, messages=False, body_length=None if per_message else length) \
            if interest.acts(Phase.RESPONSE) else []
        # A body of unknown length (chunked) is read whole only when a rule may act on this very
        # response, and never past RULE_BODY_LIMIT: after that it streams on, undecided.
        read_whole = per_message and not is_stream and is_text(content_type) and (
            length <= RULE_BODY_LIMIT if length is not None else bool(interest.could_match(reply)))
        # (a fraction of a body read whole is of the body as the agent gets it)
        shape = shape_body([one.action for one in fired], None if read_whole else length, max_held=RULE_BODY_LIMIT,
                           engine=self.engine, request=state.msg)
        if shape.delay:
            await asyncio.sleep(shape.delay)
        if not shape.stages and (read_whole or (not is_stream and length is not None and length <= SMALL_BODY)):
            state.read_whole = read_whole  # buffered: mitmproxy keeps Content-Length right if a fault changes it
            return
        stages: list[Stage] = []
        if read_whole:  # the body may change under the shaping that follows: no length can be promised
            stages.append(WholeBody(lambda body: self._relay_body(body, state, headers), state.msg))
            headers.pop("content-length", None)
            headers["transfer-encoding"] = "chunked"
        elif is_stream and state.llm is not None:
            if (editor := state.llm.stream_editor(headers)) is not None:
                stages.append(LlmEvents(editor))
        elif is_stream and per_message:
            stages.append(SseMessages(self.relay, state.msg, state.faults))
        response.stream = self._shaper(flow, state, stages + shape.stages, shape.pace)

    async def response(self, flow: http.HTTPFlow) -> None:
        state: Flow | None = flow.metadata.get(_KEY)
        if state is None:
            return
        response = flow.response
        assert response is not None
        if response.stream and state.read_whole:  # a chunked body past RULE_BODY_LIMIT: mitmproxy streamed it
            self._undecided(state, "response")
        elif not response.stream and state.outcome != Outcome.FAULT_RESPONSE:
            body = response.raw_content or b""
            if state.read_whole:
                body = self._relay_body(body, state, response.headers)
                _set_body(response, body)
            state.bytes_out = len(body)
        if state.hold:
            await self.until_gone(flow)
        self._log(state)

    def error(self, flow: http.HTTPFlow) -> None:
        state: Flow | None = flow.metadata.get(_KEY)
        if state is None or flow.error is None:
            return
        if state.outcome == Outcome.OK and not state.cut:
            if "disconnect" in flow.error.msg.lower():
                state.outcome = Outcome.CLIENT_DISCONNECTED
            else:
                state.outcome, state.status = Outcome.UPSTREAM_ERROR, 502
                ops.warning("upstream %s failed for %s %s: %s", state.msg.route, state.msg.http_method,
                            state.msg.path, flow.error.msg)
        self._log(state)

    def client_disconnected(self, client: Client) -> None:
        if (gone := self._gone.pop(client.id, None)) is not None:
            gone.set()

    def _undecided(self, state: Flow, side: str) -> None:
        msg = state.msg
        self.engine.log.skip(rule=None, transport=TRANSPORT, session=msg.session, path=msg.path,
                             reason=f"a chunked {side} body past {RULE_BODY_LIMIT} bytes is passed on undecided")

    # carrying out the engine's decisions

    async def _on_request(self, flow: http.HTTPFlow, state: Flow) -> None:
        state.decided = True
        msg = state.msg
        state.llm = llm = self.llm.open(msg)  # a model-API request: msg learns its api, model and turn
        if self.engine.tracing.on:  # the call's span; the proxy's context goes upstream in header and _meta
            body = msg.body
            session = msg.session if msg.session != flow.client_conn.peername[0] else None
            carrier = self.engine.tracing.start(msg, network="tcp", url=flow.request.url, session_id=session)
            if carrier:  # the proxy's context in place of the agent's, whole
                for name in TRACE_CONTEXT:
                    flow.request.headers.pop(name.decode(), None)
            flow.request.headers.update(carrier)
            if msg.body is not body:
                _set_body(flow.request, msg.body or b"")
        if self.engine.interest.acts(Phase.REQUEST):
            original = msg.body
            fired = decide(self.engine, msg, state)
            if fired and await act_on_request(fired, state, _RequestSide(self, flow, state), self.relay, msg):
                return
            if msg.body is not original:  # a fault rewrote the JSON-RPC request
                _set_body(flow.request, msg.body or b"")
                _mirror_rpc_headers(flow.request.headers, msg)
        if llm is not None:
            original, llm.faults = msg.body, state.faults
            await llm.prepare()
            llm.rewrite_request()
            if msg.body is not original:
                _set_body(flow.request, msg.body or b"")
            if llm.watching:  # the reply will be read: ask for it uncompressed
                flow.request.headers["accept-encoding"] = "identity"
        if msg.body is not None and self.relay.watching:
            self.relay.expect(msg)

    def _relay_body(self, body: bytes, state: Flow, headers: http.Headers) -> bytes:
        """A whole reply through the relay that understands it: model API, or JSON-RPC."""
        if state.llm is not None:
            return state.llm.relay_body(body, state.status, headers)
        return self.relay.relay_body(body, state.msg, headers, faults=state.faults)

    def _shaper(self, flow: http.HTTPFlow, state: Flow, stages: list[Stage], pace: float | None) -> Shaper:
        ending = shaping.planned(stages)
        if ending is StreamEnd.CUT:  # end the body by closing the connection, as a server ending its stream does
            headers = flow.response.headers  # type: ignore[union-attr]
            headers.pop("content-length", None)
            headers.pop("transfer-encoding", None)
            headers["connection"] = "close"
        wire = self.wire(flow) if ending in _CLOSING or pace is not None else None
        return Shaper(state, stages, wire, pace)

    def wire(self, flow: http.HTTPFlow) -> Wire | None:
        wire = Wire.of(flow.client_conn, self.proxyserver)
        if wire is None:
            ops.warning("mitm: no handle on the connection from %s: a fault that cuts or paces it cannot act",
                        flow.client_conn.peername)
        return wire

    async def until_gone(self, flow: http.HTTPFlow, timeout: float | None = None) -> bool:
        """Wait until the agent hangs up (True) or `timeout` s pass (False)."""
        client = flow.client_conn
        if self._stopping or client.timestamp_end is not None:
            return True
        gone = self._gone.setdefault(client.id, asyncio.Event())
        try:
            await asyncio.wait_for(gone.wait(), timeout)
        except TimeoutError:
            return False
        return True

    def release_all(self) -> None:
        """Let every held flow go (the proxy is stopping)."""
        self._stopping = True
        for gone in self._gone.values():
            gone.set()

    def _log(self, state: Flow) -> None:
        if not state.logged:
            state.logged = True
            log_call(self.engine, TRANSPORT, state.msg, state)


class _RequestSide:
    """The request's side of the executor (adapters/execute.RequestSide) on one flow."""

    def __init__(self, addon: ChaosAddon, flow: http.HTTPFlow, state: Flow) -> None:
        self.addon, self.flow, self.state = addon, flow, state

    def answer(self, respond: Respond) -> None:
        self.flow.request.stream = False  # mitmproxy answers only once the request body is in
        self.flow.response = http.Response.make(respond.status, respond.body, respond.headers)
        self.state.status = respond.status
        self.state.bytes_out = len(respond.body)

    async def hold(self, seconds: float | None) -> bool:
        if await self.addon.until_gone(self.flow, seconds):
            self.flow.kill()
            return True
        return False

    async def reset(self, delay: float) -> None:
        if not (delay and await self.addon.until_gone(self.flow, delay)) and (wire := self.addon.wire(self.flow)):
            wire.reset()
        self.flow.kill()


def _body_length(headers: http.Headers, *, response: bool) -> int | None:
    """The body's length from the headers, None when unknown: chunked, or a response read until close."""
    if "transfer-encoding" in headers:
        return None
    if "content-length" not in headers:
        return None if response else 0
    try:
        return int(headers["content-length"])
    except ValueError:
        return None


def _set_body(message: http.Message, body: bytes) -> None:
    """Replace a body as is (still encoded, like the bytes the engine saw), keeping Content-Length true."""
    message.raw_content = body
    if "content-length" in message.headers:
        message.headers["content-length"] = str(len(body))


def _mirror_rpc_headers(headers: http.Headers, msg: Message) -> None:
    """Keep the 2026-era mirrored headers consistent with a rewritten body (servers reject a mismatch)."""
    for name, value in mirrored_headers(msg).items():
        if name in headers:
            headers[name] = value
