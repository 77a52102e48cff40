"""JSON-RPC awareness for the HTTP transports (MCP streamable HTTP and legacy HTTP+SSE).

One HTTP response may carry many JSON-RPC messages (an SSE stream), and on legacy HTTP+SSE the
reply to a POST arrives on another connection (the GET stream). This relay correlates replies with
their requests per session, asks the engine about each message, and keeps the legacy `endpoint`
event pointing back through the proxy.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import AsyncIterator, Mapping, MutableMapping
from typing import Any, Protocol

import orjson
from yarl import URL

from chaosproxy.engine.actions import Drop, Garble, Notify, Reply, Respond
from chaosproxy.engine.core import Engine
from chaosproxy.engine.message import Message, Phase
from chaosproxy.protocols import streams
from chaosproxy.telemetry.log import ops

MAX_PENDING = 10_000  # requests awaiting a reply that are remembered, oldest forgotten first
MAX_EVENT = 16 << 20  # the largest SSE event that is inspected; larger ones pass as they are
LEGACY_QUEUE = 64  # upstream events a legacy stream holds for a slow agent before it stops reading upstream
_END = object()


class BodyRelay(Protocol):
    """What the HTTP adapters' inspecting path asks of a route's body-aware relay, chosen per request
    by route and path (`Route.relay_for`): JSON-RPC (MCP) today, model APIs (chat completions,
    messages, responses) next.

    `request` is the agent's request as a Message (its `body` set when it was read whole); `faults`
    is that call's list of fired rule names: append the name of every rule a relay fires, so the
    call line (and the report) attaches each fault to exactly the call it hit.
    """

    @property
    def watching(self) -> bool:
        """True when some rule acts on response bodies (the adapter then reads them for `relay_*`)."""

    def expect(self, request: Message) -> None:
        """A request whose reply may come on another channel (a legacy GET stream) is on its way."""

    def answers_on_stream(self, request: Message) -> bool:
        """True when replies to `request`'s session come on another channel (a legacy GET stream)."""

    def reply(self, request: Message, message: dict[str, Any]) -> Respond:
        """The HTTP answer for a fault's Reply to `request`, given in the proxy's place."""

    def relay_body(self, payload: bytes, request: Message, headers: Mapping[str, str],
                   replaced: MutableMapping[str, str], faults: list[str] | None = None) -> bytes:
        """A whole response body (JSON, text), decided on; header changes it needs go to `replaced`."""

    def relay_events(self, chunks: AsyncIterator[bytes], request: Message, faults: list[str] | None = None,
                     max_event: int = MAX_EVENT) -> AsyncIterator[bytes]:
        """An event-stream response, decided on event by event as it arrives (never buffered whole)."""


class _Own(bytes):
    """An event the proxy made itself (a fault's reply) on a legacy stream: it is not decided on again."""


class JsonRpcRelay:
    """The BodyRelay of MCP and other JSON-RPC over HTTP (streamable HTTP, legacy HTTP+SSE)."""

    def __init__(self, engine: Engine, transport: str, upstream: URL, prefix: str = "") -> None:
        self.engine = engine
        self.transport = transport
        self.upstream = upstream
        self.prefix = prefix  # the route's path prefix, put back in front of endpoint paths
        self._pending: OrderedDict[tuple[str, Any], Message] = OrderedDict()
        self._legacy_streams: dict[str, asyncio.Queue[Any]] = {}

    @property
    def watching(self) -> bool:
        """True when some rule acts on replies, so requests must be remembered to correlate them."""
        return self.engine.interest.acts(Phase.RESPONSE, wire=False)

    def expect(self, request: Message) -> None:
        """Only the legacy GET stream needs this table: a reply on a POST's own response belongs to that POST."""
        rpc = request.rpc
        if rpc is not None and "method" in rpc and "id" in rpc and request.session in self._legacy_streams:
            self._pending[request.session, rpc_key(rpc["id"])] = request
            if len(self._pending) > MAX_PENDING:
                self._pending.popitem(last=False)

    def answers_on_stream(self, request: Message) -> bool:
        return request.session in self._legacy_streams

    def forget(self, request: Message) -> None:
        """Upstream failed `request`: no reply to it will come, so it is not kept waiting for one."""
        rpc = request.rpc if request.body is not None else None
        if rpc is not None and "id" in rpc:
            self._pending.pop((request.session, rpc_key(rpc["id"])), None)

    def reply(self, request: Message, message: dict[str, Any]) -> Respond:
        """Answer a request in the proxy's place, on whichever channel the agent expects the answer."""
        body = orjson.dumps(message)
        stream = self._legacy_streams.get(request.session)
        if stream is not None:  # legacy HTTP+SSE: the POST is accepted, the answer goes down the stream
            stream.put_nowait(_Own(b"event: message\ndata: " + body + b"\n\n"))
            return Respond(202, b"Accepted", {"Content-Type": "text/plain; charset=utf-8"})
        return Respond(200, body, {"Content-Type": "application/json"})

    def relay_message(self, payload: bytes, request: Message, session: str | None = None,
                      headers: Mapping[str, str] | None = None,
                      faults: list[str] | None = None) -> tuple[list[bytes], bytes | None]:
        """Decide on one JSON-RPC message (or plain body) from upstream; returns what to send: the
        notifications a fault sends the agent first, then the payload in the message's place (None
        when a fault dropped the message).

        `request` is the HTTP request whose response carries the message; `session` overrides its
        session (a legacy GET stream learns its session from the endpoint event). A reply on a POST's
        own response answers that POST; only on a GET stream is it looked up among pending requests.
        """
        if not self.watching:
            return [], payload
        session = session or request.session
        msg = Message(self.transport, Phase.RESPONSE, session=session, http_method=request.http_method,
                      path=request.path, headers=headers, body=payload, route=request.route)
        rpc = msg.rpc
        if rpc is not None and "method" not in rpc and "id" in rpc:
            if request.rpc is not None:
                msg.request = request
            else:
                msg.request = self._pending.pop((session, rpc_key(rpc["id"])), None)
        before: list[bytes] = []
        fired_all = self.engine.decide(msg, wire=False)
        if faults is not None:
            faults.extend(fired.rule.name for fired in fired_all)
        for fired in fired_all:
            match fired.action:
                case Garble(raw):
                    return before, raw
                case Reply(message):
                    return before, orjson.dumps(message)
                case Notify(message):
                    before.append(orjson.dumps(message))
                case Drop():
                    return before, None
        return before, msg.body or payload

    def relay_body(self, payload: bytes, request: Message, headers: Mapping[str, str],
                   replaced: MutableMapping[str, str] | None = None, faults: list[str] | None = None) -> bytes:
        """A whole JSON (or plain) body through relay_message. Notifications a fault adds turn a JSON
        reply into an SSE stream, as a streamable HTTP server may answer any POST: the new
        Content-Type goes to `replaced` (to `headers` itself when `replaced` is None)."""
        before, body = self.relay_message(payload, request, headers=headers, faults=faults)
        if not before:
            return body or b""  # (a dropped body: nothing in its place)
        if "text/event-stream" not in request.headers.get("Accept", ""):
            ops.warning("a notification for %s was dropped: the client accepts no event stream", request.path)
            return body or b""
        (replaced if replaced is not None else headers)["Content-Type"] = "text/event-stream"  # type: ignore[index]
        frames = [*before, body] if body is not None else before
        return b"".join(b"event: message\ndata: " + frame + b"\n\n" for frame in frames)

    async def relay_events(self, chunks: AsyncIterator[bytes], request: Message, faults: list[str] | None = None,
                           max_event: int = MAX_EVENT) -> AsyncIterator[bytes]:
        """An SSE response, event by event; on a legacy GET stream, with the proxy's own replies mixed in.

        The legacy `endpoint` event is looked for past leading comment-only frames (`: connected`).
        """
        frames = streams.sse_frames(chunks, max_event)
        session = request.session
        first = await _next(frames)
        while first is not None and request.http_method == "GET" and _comment_only(first):
            yield first
            first = await _next(frames)
        if first is None:
            return
        if request.http_method == "GET" and streams.sse_field(first, b"event") == b"endpoint":
            first, session = self.endpoint(first, session)
            yield first
            queue: asyncio.Queue[Any] = asyncio.Queue()  # bounded for upstream's events by `room`
            room = asyncio.Semaphore(LEGACY_QUEUE)
            self._legacy_streams[session] = queue
            pump = asyncio.create_task(_pump(frames, queue, room))
            try:
                while (frame := await queue.get()) is not _END:  # its replies' faults are their POSTs'
                    if isinstance(frame, _Own):
                        yield bytes(frame)
                        continue
                    room.release()
                    yield self.relay_frame(frame, request, session)
            finally:
                pump.cancel()
                self._legacy_streams.pop(session, None)
            return
        yield self.relay_frame(first, request, session, faults)
        async for frame in frames:
            yield self.relay_frame(frame, request, session, faults)

    def relay_frame(self, frame: bytes, request: Message, session: str, faults: list[str] | None = None) -> bytes:
        """One SSE event from upstream, with its JSON-RPC message decided on."""
        if isinstance(frame, streams.Unframed) or not self.watching:
            return frame
        data = streams.sse_data(frame)
        if data is None:
            return frame
        before, new = self.relay_message(data, request, session, faults=faults)
        frame = frame if new is data else b"" if new is None else streams.sse_with_data(frame, new)
        return b"".join(b"event: message\ndata: " + note + b"\n\n" for note in before) + frame

    def endpoint(self, frame: bytes, session: str) -> tuple[bytes, str]:
        """Point the legacy `endpoint` event back through the proxy; learn the session it names."""
        data = (streams.sse_data(frame) or b"").decode("utf-8", "replace").strip()
        target = URL(data)
        session = target.query.get("sessionId") or target.query.get("session_id") or session
        if target.is_absolute() and target.origin() == self.upstream.origin():
            return streams.sse_with_data(frame, (self.prefix + target.raw_path_qs).encode()), session
        if self.prefix and data.startswith("/"):
            return streams.sse_with_data(frame, (self.prefix + data).encode()), session
        return frame, session


async def _next(frames: AsyncIterator[bytes]) -> bytes | None:
    """The next frame, None at the end. Not `anext(frames, None)`: when the call is cancelled, the
    awaitable that makes passes the cancellation on with the three-argument throw() Python 3.12 warns
    about, once per cancelled stream (and into users' own test runs through the pytest plugin)."""
    try:
        return await frames.__anext__()
    except StopAsyncIteration:
        return None


def _comment_only(frame: bytes) -> bool:
    """True for an SSE frame of comments (lines starting with ':') and blank lines only."""
    return all(not line or line.startswith(b":") for line in frame.splitlines())


async def _pump(frames: AsyncIterator[bytes], queue: asyncio.Queue[Any], room: asyncio.Semaphore) -> None:
    """Upstream's events into the stream's queue, at most LEGACY_QUEUE ahead of the agent: past that,
    upstream is not read (TCP pushes back on it) rather than its events held in memory."""
    try:
        async for frame in frames:
            await room.acquire()
            queue.put_nowait(frame)
    finally:
        queue.put_nowait(_END)


def rpc_key(rpc_id: Any) -> Any:
    """A JSON-RPC id as a dict key (ids are strings or numbers; anything else is keyed by its JSON)."""
    return rpc_id if isinstance(rpc_id, str | int) else orjson.dumps(rpc_id)
