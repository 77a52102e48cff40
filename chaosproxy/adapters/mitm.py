"""HTTPS interception adapter: mitmproxy in regular (forward) mode with the engine as an addon.

For agents whose tool calls go to HTTPS APIs they cannot repoint: the agent sets HTTPS_PROXY to this
proxy and trusts mitmproxy's CA. Connections to hosts outside `--hosts` are tunnelled as they are
(never decrypted, mitmproxy's `allow_hosts`); each request to a listed host becomes a
`Message(transport="mitm", route=HOST)` and meets the same faults as under `chaosproxy run`.

mitmproxy's hooks are awaited and hold their flow, so request-side actions and response delays are
plain awaits. Response bodies go through `flow.response.stream`, a synchronous transform of each
chunk. Faults that act below HTTP (cut the connection after N bytes, drip the body) need the
agent's socket, which mitmproxy does not expose: `_Wire` reaches it through the proxyserver addon's
connection table, the one piece of mitmproxy's internals this module relies on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import socket
import struct
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from mitmproxy import certs, http
from mitmproxy.addons import block, core, disable_h2c, next_layer, proxyserver, tlsconfig
from mitmproxy.connection import Client
from mitmproxy.exceptions import OptionsError
from mitmproxy.master import Master
from mitmproxy.options import Options
from mitmproxy.proxy.server import ConnectionIO
from yarl import URL

from chaosproxy.adapters.http.calls import Exchange, log_call
from chaosproxy.adapters.http.heads import RULE_BODY_LIMIT, SMALL_BODY, TRACE_CONTEXT, is_text
from chaosproxy.adapters.jsonrpc import JsonRpcRelay
from chaosproxy.engine.actions import CutStream, Delay, Drip, Hang, Reply, Reset, Respond, Truncate
from chaosproxy.engine.core import Engine, Fired
from chaosproxy.engine.message import Message, Phase, mirrored_headers
from chaosproxy.engine.sessions import AGENT_HEADER, agent_name
from chaosproxy.errors import ConfigError
from chaosproxy.protocols import streams
from chaosproxy.protocols.llm.relay import LlmExchange, LlmRelay
from chaosproxy.protocols.llm.stream import Editor
from chaosproxy.telemetry.log import ops
from chaosproxy.telemetry.log_schema import Outcome, StreamEnd

TRANSPORT = "mitm"
DEFAULT_CONFDIR = Path("~/.mitmproxy")
CA_CERT = "mitmproxy-ca-cert.pem"  # what the agent trusts (SSL_CERT_FILE, REQUESTS_CA_BUNDLE, NODE_EXTRA_CA_CERTS)
_KEY = "chaosproxy"  # our state in flow.metadata
_CLOSING = (StreamEnd.CLOSE, StreamEnd.RESET, StreamEnd.EOF)  # endings that end the body by closing the connection
# The agent already talks to the real origin, so a legacy `endpoint` event needs no rewrite: the relay is
# given an origin no endpoint names.
_NO_UPSTREAM = URL("http://chaosproxy.invalid")
_HOST_GLOB = re.compile(r"[A-Za-z0-9._*?:-]+")
_IPV4 = r"\d{1,3}(?:\.\d{1,3}){3}"
_IPV6 = r"[0-9A-Fa-f]*:[0-9A-Fa-f:.]*"  # at least one colon beside the port's: never a host name


class HostPatterns:
    """The `--hosts` globs (api.example.com, *.corp): hosts whose traffic is decrypted and faulted.

    Without globs every host is. Globs name hosts, not ports: every port of a listed host is in.
    """

    def __init__(self, globs: Sequence[str] = ()) -> None:
        self.globs = tuple(globs)
        self._regexes = [_glob_regex(_checked(glob)) for glob in self.globs]
        union = "|".join(f"(?:{regex})" for regex in self._regexes)
        self._fullmatch = re.compile(union, re.IGNORECASE).fullmatch if union else None

    @classmethod
    def parse(cls, value: str | None) -> HostPatterns:
        """From the flag's comma-separated value; ValueError quoting the offending glob."""
        if value is None:
            return cls()
        globs = [glob.strip() for glob in value.split(",")]
        if not any(globs):
            raise ValueError("--hosts is empty: give host globs such as api.example.com,*.corp")
        return cls(globs)

    def __contains__(self, host: str) -> bool:
        return self._fullmatch is None or self._fullmatch(host) is not None

    @property
    def allow_hosts(self) -> list[str]:
        """mitmproxy's `allow_hosts`: regexes on "host:port" (the CONNECT target, SNI, Host header or peer IP).

        A connection is decrypted when any of those names matches one, so a listed IP would also
        let in every name that resolves to it (--hosts 127.0.0.1 let localhost in): see ignore_hosts.
        """
        return [rf"^(?:{regex}):\d+$" for regex in self._regexes]

    @property
    def ignore_hosts(self) -> list[str]:
        """mitmproxy's `ignore_hosts`: a connection is tunnelled when a name the agent asked for (the
        CONNECT target, SNI, Host header) is not listed. IP addresses are exempt, since the peer IP
        mitmproxy also checks is where a listed name resolved to, not a name the agent chose."""
        if not self._regexes:
            return []
        listed = "|".join(f"(?:{regex})" for regex in self._regexes)
        return [rf"^(?!(?:{listed}):\d+$)(?!{_IPV4}:\d+$)(?!\[?{_IPV6}\]?:\d+$).+$"]

    def __str__(self) -> str:
        return ", ".join(self.globs) if self.globs else "every host"


def _checked(glob: str) -> str:
    host = glob.removeprefix("[").removesuffix("]")  # [::1]
    if not host:
        raise ValueError("--hosts has an empty entry (a stray comma?)")
    if "/" in host:
        raise ValueError(f"--hosts takes host names, not URLs: {glob!r} (e.g. api.example.com)")
    if host.count(":") == 1:
        raise ValueError(f"--hosts takes host names without a port: {glob!r} (every port of a listed host "
                         "is intercepted)")
    if not _HOST_GLOB.fullmatch(host):
        raise ValueError(f"invalid host glob {glob!r} in --hosts: use letters, digits, '.', '-', "
                         "and the wildcards '*' and '?'")
    return host


def _glob_regex(glob: str) -> str:
    return "".join(".*" if char == "*" else "." if char == "?" else re.escape(char) for char in glob)


class ConfdirError(ConfigError):
    """The CA directory cannot be used as given."""


def ca_directory(confdir: Path | None) -> Path:
    """The CA directory, with mitmproxy's CA in it (made on first use in the default ~/.mitmproxy).

    A directory given explicitly must exist (a typo should not silently mint a new CA the agent does
    not trust). Raises ConfdirError for a bad path, OSError when the CA cannot be written or read.
    """
    path = (confdir or DEFAULT_CONFDIR).expanduser()
    if confdir is not None and not path.exists():
        raise ConfdirError(f"the CA directory {path} does not exist (create it, or leave --confdir out "
                           f"to use {DEFAULT_CONFDIR})")
    if path.exists() and not path.is_dir():
        raise ConfdirError(f"the CA directory {path} is not a directory")
    try:
        certs.CertStore.from_store(path, "mitmproxy", 2048)
    except OSError as exc:
        raise OSError(exc.errno, f"cannot keep mitmproxy's CA in {path}: {exc.strerror or exc}") from exc
    except ValueError as exc:  # a damaged PEM
        raise ConfdirError(f"the CA in {path} is unreadable: {exc}") from exc
    return path


class _Flow(Exchange):
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
        self.proxyserver: proxyserver.Proxyserver | None = None  # set by MitmProxy, for _Wire
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
        state = flow.metadata[_KEY] = _Flow(msg)
        length = _body_length(request.headers, response=False)
        wanted = RULE_BODY_LIMIT if interest.request_bodies else SMALL_BODY
        if length is None and interest.request_bodies and "json" in request.headers.get("content-type", ""):
            return  # a chunked JSON(-RPC) request: read whole, decided on its messages at the request hook
        if length is None or length > wanted:  # decided on the headers; the body streams through
            request.stream = True
            await self._on_request(flow, state)

    async def request(self, flow: http.HTTPFlow) -> None:
        state: _Flow | None = flow.metadata.get(_KEY)
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
        state: _Flow | None = flow.metadata.get(_KEY)
        if state is None:
            response.stream = True
            return
        state.status = response.status_code
        headers = response.headers
        content_type = headers.get("Content-Type", "")
        is_stream = "text/event-stream" in content_type
        length = _body_length(headers, response=True)
        actions = []
        reply = Message(TRANSPORT, Phase.RESPONSE, session=state.msg.session, http_method=state.msg.http_method,
                        path=state.msg.path, headers=headers, status=response.status_code, request=state.msg,
                        route=state.msg.route)
        reply.api, reply.model, reply.turn = state.msg.api, state.msg.model, state.msg.turn
        interest = self.engine.interest
        if interest.acts(Phase.RESPONSE):
            actions = [fired.action for fired in self._decide(reply, state, messages=False)]
        for action in actions:
            if isinstance(action, Delay):
                await asyncio.sleep(action.seconds)
        shaping = [action for action in actions if isinstance(action, Drip | Truncate | Reset | CutStream)]
        per_message = interest.acts(Phase.RESPONSE, wire=False) if state.llm is None else state.llm.watching
        # A body of unknown length (chunked) is read whole only when a rule may act on this very
        # response, and never past RULE_BODY_LIMIT: after that it streams on, undecided.
        read_whole = per_message and not is_stream and is_text(content_type) and (
            length <= RULE_BODY_LIMIT if length is not None else bool(interest.could_match(reply)))
        if not shaping and (read_whole or (not is_stream and length is not None and length <= SMALL_BODY)):
            state.read_whole = read_whole  # buffered: mitmproxy keeps Content-Length right if a fault changes it
            return
        stages: list[_Stage] = []
        if read_whole:  # the body may change under the shaping that follows: no length can be promised
            stages.append(_WholeBody(lambda body: self._relay_body(body, state, headers), state.msg))
            headers.pop("content-length", None)
            headers["transfer-encoding"] = "chunked"
        elif is_stream and state.llm is not None:
            if (editor := state.llm.stream_editor(headers)) is not None:
                stages.append(_LlmEvents(editor))
        elif is_stream and per_message:
            stages.append(_SseMessages(self.relay, state.msg, state.faults))
        response.stream = self._shaper(flow, state, stages, shaping, length)

    async def response(self, flow: http.HTTPFlow) -> None:
        state: _Flow | None = flow.metadata.get(_KEY)
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
            await self._until_gone(flow)
        self._log(state)

    def error(self, flow: http.HTTPFlow) -> None:
        state: _Flow | None = flow.metadata.get(_KEY)
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

    def _undecided(self, state: _Flow, side: str) -> None:
        msg = state.msg
        self.engine.log.skip(rule=None, transport=TRANSPORT, session=msg.session, path=msg.path,
                             reason=f"a chunked {side} body past {RULE_BODY_LIMIT} bytes is passed on undecided")

    # carrying out the engine's decisions

    async def _on_request(self, flow: http.HTTPFlow, state: _Flow) -> None:
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
            for fired in self._decide(msg, state):
                match fired.action:
                    case Delay(seconds):
                        await asyncio.sleep(seconds)
                    case Respond() as respond:
                        state.outcome = Outcome.FAULT_RESPONSE
                        self._respond(flow, respond, state)
                        return
                    case Reply(message, delay):
                        state.outcome = Outcome.FAULT_RESPONSE
                        await asyncio.sleep(delay)
                        self._respond(flow, self.relay.reply(msg, message), state)
                        return
                    case Hang(release_after):
                        state.outcome = Outcome.HANG
                        if await self._until_gone(flow, release_after):
                            flow.kill()
                            return
                        state.outcome = Outcome.OK
                    case Reset(delay=delay):
                        state.outcome = Outcome.RESET
                        if delay and await self._until_gone(flow, delay):
                            flow.kill()
                            return
                        if (wire := self._wire(flow)) is not None:
                            wire.reset()
                        flow.kill()
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

    def _relay_body(self, body: bytes, state: _Flow, headers: http.Headers) -> bytes:
        """A whole reply through the relay that understands it: model API, or JSON-RPC."""
        if state.llm is not None:
            return state.llm.relay_body(body, state.status, headers)
        return self.relay.relay_body(body, state.msg, headers, faults=state.faults)

    def _respond(self, flow: http.HTTPFlow, respond: Respond, state: _Flow) -> None:
        flow.request.stream = False  # mitmproxy answers only once the request body is in
        flow.response = http.Response.make(respond.status, respond.body, respond.headers)
        state.status = respond.status
        state.bytes_out = len(respond.body)

    def _shaper(self, flow: http.HTTPFlow, state: _Flow, stages: list[_Stage],
                actions: list[Drip | Truncate | Reset | CutStream], length: int | None) -> _Shaper:
        ending: StreamEnd | None = None
        pace: float | None = None
        for action in actions:
            match action:
                case Drip(size, delay):
                    stages.append(_Slices(size))
                    pace = delay
                case Truncate(limit, fraction):
                    stages.append(_Limit(limit) if limit is not None else _Fraction(fraction or 0.0, length))
                    ending = StreamEnd.CLOSE
                case Reset(after_bytes):
                    stages.append(_Limit(after_bytes or 0))
                    ending = StreamEnd.RESET
                case CutStream(after_events, idle):
                    stages.append(_Events(after_events))
                    ending = StreamEnd.IDLE if idle else StreamEnd.EOF
        if ending == StreamEnd.EOF:  # end the body by closing the connection, as a server ending its stream does
            headers = flow.response.headers  # type: ignore[union-attr]
            headers.pop("content-length", None)
            headers.pop("transfer-encoding", None)
            headers["connection"] = "close"
        wire = self._wire(flow) if ending in _CLOSING or pace is not None else None
        return _Shaper(state, stages, ending, wire, pace)

    def _decide(self, msg: Message, state: _Flow, *, messages: bool = True) -> list[Fired]:
        fired = self.engine.decide(msg, messages=messages)
        state.faults.extend(f.rule.name for f in fired)
        return fired

    def _wire(self, flow: http.HTTPFlow) -> _Wire | None:
        wire = _Wire.of(flow.client_conn, self.proxyserver)
        if wire is None:
            ops.warning("mitm: no handle on the connection from %s: a fault that cuts or paces it cannot act",
                        flow.client_conn.peername)
        return wire

    async def _until_gone(self, flow: http.HTTPFlow, timeout: float | None = None) -> bool:
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

    def _log(self, state: _Flow) -> None:
        if not state.logged:
            state.logged = True
            log_call(self.engine, TRANSPORT, state.msg, state)


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


# Response bodies, chunk by chunk. A stage takes the chunks so far (and whether the body ended there)
# and returns what goes on; `cut` is set once it lets nothing more through.

class _Stage:
    cut = False

    def __call__(self, chunks: list[bytes], end: bool) -> list[bytes]:
        raise NotImplementedError


class _Shaper:
    """`flow.response.stream`: runs each upstream chunk through the stages, then carries out the ending.

    mitmproxy writes each chunk this generator yields before resuming it, so an ending carried out
    after the last yield (close, reset) falls right after those bytes, before anything else (the
    chunked terminator) can follow them.
    """

    def __init__(self, state: _Flow, stages: list[_Stage], ending: StreamEnd | None, wire: _Wire | None,
                 pace: float | None) -> None:
        self.state = state
        self.stages = stages
        self.ending = ending
        self.wire = wire
        self.pace = pace
        self.done = False

    def __call__(self, chunk: bytes) -> Iterator[bytes]:
        if self.done:
            return
        if self.pace is not None and self.wire is not None:
            self.wire.pace(self.pace)
            self.pace = None
        chunks, end = [chunk] if chunk else [], not chunk
        try:
            for stage in self.stages:
                chunks = stage(chunks, end)
                end = end or stage.cut
        except Exception:  # fail open: the rest of the body passes as it comes
            ops.exception("mitm: shaping a response body failed; passing the rest through")
            self.stages, self.ending = [], None
            chunks, end = [chunk] if chunk else [], not chunk
        for piece in chunks:
            self.state.bytes_out += len(piece)
            yield piece
        if end:
            self.done = True
            self._finish()

    def _finish(self) -> None:
        wire = self.wire
        if wire is not None:
            wire.unpace()
            self.state.cut = self.ending in _CLOSING
        match self.ending:
            case StreamEnd.CLOSE | StreamEnd.RESET | StreamEnd.EOF if wire is None:
                pass  # _Wire.of said why; the body just ends here
            case StreamEnd.CLOSE:
                self.state.outcome = Outcome.TRUNCATED
                wire.close()  # type: ignore[union-attr]
            case StreamEnd.RESET:
                self.state.outcome = Outcome.RESET
                wire.reset()  # type: ignore[union-attr]
            case StreamEnd.EOF:
                self.state.outcome = Outcome.STREAM_CUT
                wire.close()  # type: ignore[union-attr]
            case StreamEnd.IDLE:
                self.state.outcome = Outcome.STREAM_IDLE
                self.state.hold = True  # the response hook waits, so the end of the body is never sent


class _WholeBody(_Stage):
    """The whole body, its JSON-RPC message decided on once it is in."""

    def __init__(self, decide: Callable[[bytes], bytes], request: Message) -> None:
        self.decide, self.request = decide, request
        self.parts: list[bytes] | None = []
        self.size = 0

    def __call__(self, chunks: list[bytes], end: bool) -> list[bytes]:
        if self.parts is None:  # past the limit: streaming on
            return chunks
        self.parts += chunks
        self.size += sum(map(len, chunks))
        if self.size > RULE_BODY_LIMIT:
            ops.warning("mitm: %s %s: a body past %d bytes is passed on undecided", self.request.http_method,
                        self.request.path, RULE_BODY_LIMIT)
            held, self.parts = self.parts, None
            return held
        if not end:
            return []
        return [self.decide(b"".join(self.parts))]


class _LlmEvents(_Stage):
    """A model API's streamed reply through its format's editor, event by event."""

    def __init__(self, editor: Editor) -> None:
        self.editor = editor
        self.splitter = streams.SseSplitter()

    def __call__(self, chunks: list[bytes], end: bool) -> list[bytes]:
        events = [event for chunk in chunks for event in self.splitter.feed(chunk)]
        if end and (rest := self.splitter.rest()):
            events.append(rest)
        out = [piece for event in events for piece in self.editor.feed(event)]
        return out + self.editor.finish() if end and not self.editor.ended else out


class _SseMessages(_Stage):
    """SSE events, each one's JSON-RPC message decided on as it completes; the rules that fire go on
    the call line's `faults` (on a legacy GET stream, the replies' faults are their POSTs')."""

    def __init__(self, relay: JsonRpcRelay, request: Message, faults: list[str]) -> None:
        self.relay, self.request = relay, request
        self.session = request.session
        self.faults: list[str] | None = faults
        self.splitter = streams.SseSplitter()

    def __call__(self, chunks: list[bytes], end: bool) -> list[bytes]:
        events = [event for chunk in chunks for event in self.splitter.feed(chunk)]
        if end and (rest := self.splitter.rest()):
            events.append(rest)
        return [self._event(event) for event in events]

    def _event(self, event: bytes) -> bytes:
        if streams.sse_field(event, b"event") == b"endpoint":  # legacy HTTP+SSE: the stream's session
            target = URL((streams.sse_data(event) or b"").decode("utf-8", "replace").strip())
            self.session = target.query.get("sessionId") or target.query.get("session_id") or self.session
            self.faults = None
            return event
        return self.relay.relay_frame(event, self.request, self.session, self.faults)


class _Slices(_Stage):
    """Re-cut into pieces of `size` bytes (a dripped body: the wire paces them)."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __call__(self, chunks: list[bytes], end: bool) -> list[bytes]:
        size = self.size
        return [chunk[i:i + size] for chunk in chunks for i in range(0, len(chunk), size)]


class _Limit(_Stage):
    """The first `left` bytes."""

    def __init__(self, left: int) -> None:
        self.left = left
        self.cut = left <= 0

    def __call__(self, chunks: list[bytes], end: bool) -> list[bytes]:
        out = []
        for chunk in chunks:
            if self.cut:
                break
            out.append(chunk[:self.left])
            self.left -= len(out[-1])
            self.cut = self.left <= 0
        return out


class _Fraction(_Stage):
    """The first `fraction` of the body: of its Content-Length, or of the whole body once it is in."""

    def __init__(self, fraction: float, length: int | None) -> None:
        self.fraction = fraction
        self.limit = _Limit(int(length * fraction)) if length is not None else None
        self.parts: list[bytes] = []

    def __call__(self, chunks: list[bytes], end: bool) -> list[bytes]:
        if self.limit is None:
            self.parts += chunks
            if not end:
                return []
            whole = b"".join(self.parts)
            self.limit = _Limit(int(len(whole) * self.fraction))
            chunks = [whole]
        out = self.limit(chunks, end)
        self.cut = self.limit.cut
        return out


class _Events(_Stage):
    """The stream up to and including the end of its `left`-th SSE event."""

    def __init__(self, left: int) -> None:
        self.left = left
        self.cut = left <= 0
        self.splitter = streams.SseSplitter()

    def __call__(self, chunks: list[bytes], end: bool) -> list[bytes]:
        out: list[bytes] = []
        for chunk in chunks:
            for event in self.splitter.feed(chunk):
                if self.cut:
                    return out
                out.append(event)
                self.left -= 1
                self.cut = self.left <= 0
        if end and not self.cut and (rest := self.splitter.rest()):
            out.append(rest)
        return out


def reset_transport(transport: asyncio.BaseTransport | None) -> None:
    """Abort with RST (SO_LINGER 0) rather than a polite FIN, as a crashed server or middlebox would."""
    if transport is None:
        return
    sock: socket.socket | None = transport.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()  # type: ignore[attr-defined]


class _Wire:
    """The agent's TCP connection under a flow, for faults below HTTP: pace its writes, close it, reset it.

    mitmproxy keeps it in the proxyserver addon's table of live connections (the table its inject.*
    commands use); everything mitmproxy sends the agent goes through that ConnectionIO's writer.
    """

    def __init__(self, io: ConnectionIO) -> None:
        self.io = io

    @classmethod
    def of(cls, client: Client, server: proxyserver.Proxyserver | None) -> _Wire | None:
        handler = server.connections.get(client.id) if server is not None else None
        io = getattr(handler, "transports", {}).get(client)
        return cls(io) if io is not None and io.writer is not None else None

    def pace(self, delay: float) -> None:
        """From now on, each write (one body piece: one TLS record) goes out `delay` s after the one before."""
        if not isinstance(self.io.writer, _PacedWriter):
            self.io.writer = _PacedWriter(self.io, delay)  # type: ignore[assignment]  # (a stand-in writer)

    def unpace(self) -> None:
        """Writes from now on go out at once (after those held back); then the real writer is put back."""
        if isinstance(writer := self.io.writer, _PacedWriter):
            writer.release()

    def close(self) -> None:
        """FIN after the bytes written so far (no TLS close_notify: the body just stops)."""
        self.io.writer.close()  # type: ignore[union-attr]

    def reset(self) -> None:
        writer = self.io.writer
        if isinstance(writer, _PacedWriter):
            writer.then(lambda: reset_transport(writer.writer.transport))
        else:
            reset_transport(writer.transport)  # type: ignore[union-attr]


class _PacedWriter:
    """Stands in for a connection's asyncio writer while a body drips: holds each write back `delay` s.

    `drain` waits for the held writes, so mitmproxy stops reading upstream meanwhile: memory stays flat.
    """

    def __init__(self, io: ConnectionIO, delay: float) -> None:
        self.io = io
        self.writer: asyncio.StreamWriter = io.writer  # type: ignore[assignment]
        self.delay: float | None = delay
        self.pending: deque[tuple[Callable[[], Any], float | None]] = deque()  # with the pause before it
        self.flushed = asyncio.Event()
        self.flushed.set()
        self.task: asyncio.Task[None] | None = None
        self.first = True

    def write(self, data: bytes) -> None:
        self.then(lambda: self.writer.write(data), self.delay)

    def write_eof(self) -> None:
        self.then(self.writer.write_eof)

    def close(self) -> None:
        self.then(self.writer.close)

    def is_closing(self) -> bool:
        return self.writer.is_closing()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self.writer.get_extra_info(name, default)

    async def drain(self) -> None:
        await self.flushed.wait()
        await self.writer.drain()

    def release(self) -> None:
        self.delay = None
        self.then(lambda: None)  # puts the real writer back once what is held has gone out

    def then(self, operation: Callable[[], Any], delay: float | None = None) -> None:
        self.pending.append((operation, delay))
        self.flushed.clear()
        if self.task is None:
            self.task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        try:
            while self.pending:
                operation, delay = self.pending.popleft()
                if delay is not None and not self.first:
                    await asyncio.sleep(delay)
                self.first = self.first and delay is None
                if self.writer.is_closing():
                    self.pending.clear()
                    break
                operation()
        finally:
            self.task = None
            self.flushed.set()
            if self.delay is None and self.io.writer is self:
                self.io.writer = self.writer


class MitmProxy:
    """mitmproxy in regular (forward) mode on our event loop, with the engine as its addon.

    mitmproxy keeps its options and master in module globals (`mitmproxy.ctx`): one per process.
    """

    def __init__(self, engine: Engine, hosts: HostPatterns, *, confdir: Path,
                 upstream_ca: Path | None = None) -> None:
        self.engine = engine
        self.hosts = hosts
        self.confdir = confdir
        self.upstream_ca = upstream_ca
        self.addon = ChaosAddon(engine, hosts)
        self._master: Master | None = None
        self._server: proxyserver.Proxyserver | None = None

    async def start(self, host: str, port: int) -> int:
        """Listen; returns the bound port. OSError when it cannot listen, ValueError for a bad option."""
        _forward_mitmproxy_log()
        master = self._master = Master(Options())
        server = self._server = self.addon.proxyserver = proxyserver.Proxyserver()
        # Only what forward-mode interception needs: no console, no flow store, no scripts, no replay.
        master.addons.add(core.Core(), block.Block(), disable_h2c.DisableH2C(), server, next_layer.NextLayer(),
                          tlsconfig.TlsConfig(), self.addon)
        try:
            master.options.update(
                mode=["regular"], listen_host=host, listen_port=port, confdir=str(self.confdir),
                allow_hosts=self.hosts.allow_hosts, ignore_hosts=self.hosts.ignore_hosts,
                # HTTP/1.1 to both sides: a reset or a truncation then hits one exchange, as under `run`
                http2=False,
                # a body of unknown length is buffered for rules up to this size, then streams on undecided
                stream_large_bodies=str(RULE_BODY_LIMIT),
                ssl_verify_upstream_trusted_ca=str(self.upstream_ca) if self.upstream_ca else None,
            )
        except OptionsError as exc:
            raise ValueError(str(exc)) from None
        mitm_log = logging.getLogger("mitmproxy")
        level, mitm_log.level = mitm_log.level, logging.CRITICAL  # its hint names mitmproxy's own flags
        try:
            started = await server.setup_servers()
        finally:
            mitm_log.setLevel(level)
        if not started:
            failed = next((s.last_exception for s in server.servers if s.last_exception), None)
            if isinstance(failed, OSError) and failed.errno:
                raise OSError(failed.errno, os.strerror(failed.errno))
            raise OSError(f"cannot listen on {host}:{port}: {failed}")
        await master.running()
        return server.listen_addrs()[0][1]

    async def stop(self) -> None:
        self.addon.release_all()
        if self._server is not None:
            if any(instance.is_running for instance in self._server.servers):
                await self._server.servers.update([])
            for handler in list(self._server.connections.values()):
                io = handler.transports.get(handler.client)
                if io is not None and io.writer is not None:
                    with contextlib.suppress(OSError):
                        io.writer.close()
        if self._master is not None:
            await self._master.done()


def _forward_mitmproxy_log() -> None:
    """mitmproxy's own warnings (a client that does not trust the CA, an upstream TLS failure) go to
    the operational log; its per-connection chatter only with --verbose."""
    logger = logging.getLogger("mitmproxy")
    if ops.handlers:
        logger.handlers[:] = ops.handlers
        logger.propagate = False
    logger.setLevel(logging.DEBUG if ops.level == logging.DEBUG else logging.WARNING)
