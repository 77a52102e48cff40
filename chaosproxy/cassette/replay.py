"""Replay: a cassette served as the upstream, over HTTP (on the data plane's own wire, h1) or stdio.

Each request is matched to a recorded one (chaosproxy.cassette.match) and gets its recorded answer, with
what was volatile put back as the live request has it: the JSON-RPC ids and progress tokens of its
messages, and the MCP session (a replayed `initialize` hands out a fresh session id, and each session
goes through the cassette on its own). Streams keep their recorded timing, scaled by `speed` (None: no
waits at all). A request the cassette does not hold gets a clear error naming the closest recorded
one: a JSON-RPC error for a JSON-RPC call, else a 404, never another exchange's answer.

MCP's legacy HTTP+SSE transport answers on another request than the one that asked: its GET stream first
names (`endpoint` event) where to POST, then carries the replies to those POSTs. Its replay hands out a
session of its own in the endpoint (a path on the replay server, whatever host was recorded), and sends
the recorded stream's messages when the live POST they answer comes, each reply with everything the
server sent before it (notifications, its own requests), the live ids put in: never ahead of the request,
and at once whatever `speed` says (the live POSTs set the pace). A request the cassette lacks gets its
error on the stream too. Sessions are taken to be alike (a POST may take its answer from another recorded
session of the same requests), and the session is read from the endpoint's query (`session_id`, `sessionId`).
"""

from __future__ import annotations

import asyncio
import socket
import sys
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import orjson
from yarl import URL

from chaosproxy.adapters.h1 import (
    NO_BODY_STATUSES,
    ClientConnection,
    ClientExchange,
    ClientLimits,
    Headers,
    Listener,
    stop_serving,
)
from chaosproxy.cassette.format import Cassette, Event, Exchange, Frame
from chaosproxy.cassette.match import Index, Key, frame_key, json_or_none, no_match_message, request_key
from chaosproxy.cassette.redact import Redactor
from chaosproxy.protocols.streams import sse_data, sse_field, sse_with_data
from chaosproxy.telemetry.log import ops

NO_MATCH = -32050  # the JSON-RPC error code of a request the cassette does not hold
MAX_BODY = 16 << 20  # a larger request body is answered 413: no recorded request is matched on it
FRAMING = frozenset({"content-length", "transfer-encoding", "connection", "keep-alive"})
KEPT_UNMATCHED = 100  # the newest unmatched requests kept for whoever asks (tests, the pytest fixture)
SESSION_HEADER = "mcp-session-id"
LEGACY_SESSION_QUERY = ("session_id", "sessionId")  # where legacy HTTP+SSE servers name the session


@dataclass(slots=True)
class Answer:
    """A recorded response, with the live request's ids and session put in."""

    status: int
    reason: bytes
    headers: Headers
    body: bytes
    events: list[Event] | None
    t_head: float
    t_end: float
    end: str
    length: int | None  # None: sent chunked (a stream, or as recorded)
    asked: Any  # the recorded request's JSON (what a legacy stream's replies answer), or None
    swaps: Swaps | None  # its ids as the live request has them


class Swaps:
    """What the live request calls what the recorded one called otherwise: JSON-RPC ids and progress tokens."""

    def __init__(self, recorded: Any, live: Any) -> None:
        self.ids: dict[Any, Any] = {}
        self.tokens: dict[Any, Any] = {}
        pairs = zip(recorded, live, strict=False) if isinstance(recorded, list) and isinstance(live, list) else \
            [(recorded, live)]
        for old, new in pairs:
            if not isinstance(old, dict) or not isinstance(new, dict):
                continue
            if "id" in old and "id" in new and old["id"] != new["id"]:
                self.ids[_hashable(old["id"])] = new["id"]
            old_token, new_token = _progress_token(old), _progress_token(new)
            if old_token is not None and new_token is not None and old_token != new_token:
                self.tokens[_hashable(old_token)] = new_token

    def __bool__(self) -> bool:
        return bool(self.ids or self.tokens)

    def message(self, message: Any) -> bool:
        """Put the live ids into one message; True when it changed."""
        if not isinstance(message, dict):
            return False
        if "method" not in message and "id" in message and (key := _hashable(message["id"])) in self.ids:
            message["id"] = self.ids[key]
            return True
        params = message.get("params")
        if message.get("method") == "notifications/progress" and isinstance(params, dict) and \
                (key := _hashable(params.get("progressToken"))) in self.tokens:
            params["progressToken"] = self.tokens[key]
            return True
        return False

    def json(self, data: bytes) -> bytes:
        """A JSON body or event data with the live ids in (as it was when nothing changed)."""
        try:
            value = orjson.loads(data)
        except orjson.JSONDecodeError:
            return data
        changed = any([self.message(item) for item in value]) if isinstance(value, list) else self.message(value)
        return orjson.dumps(value) if changed else data

    def event(self, event: bytes) -> bytes:
        data = sse_data(event)
        if data is None:
            return event
        swapped = self.json(data)
        return event if swapped is data else sse_with_data(event, swapped)


def _hashable(value: Any) -> Any:
    return value if isinstance(value, str | int | float | bool | None) else orjson.dumps(value)


def _progress_token(message: dict[str, Any]) -> Any:
    params = message.get("params")
    meta = params.get("_meta") if isinstance(params, dict) else None
    return meta.get("progressToken") if isinstance(meta, dict) else None


class HttpReplay:
    """The HTTP cassette's answers, whatever serves them: matching, sessions and what went unmatched."""

    def __init__(self, cassette: Cassette) -> None:
        self.cassette = cassette
        self.redactor = Redactor(cassette.extra_redactions)
        self.index: Index[Exchange] = Index([(self.key(exchange.request.method, exchange.request.target,
                                                       exchange.request.body), exchange)
                                             for exchange in cassette.exchanges])
        self.sessions: dict[str, None] = {}  # the session ids this replay handed out, newest last (bounded)
        self.unmatched: list[str] = []  # the newest KEPT_UNMATCHED
        self.unmatched_count = 0
        self.served = 0

    def key(self, method: str, target: str, body: bytes) -> Key:
        return request_key(method, target, body, self.redactor)

    def answer(self, method: str, target: str, session: str | None, body: bytes,
               headers: Sequence[tuple[str, str]] = ()) -> Answer | str:
        """The recorded answer to a live request, or the error message saying why there is none. Its
        `headers` are redacted first, as when it was recorded, so that their secrets are known in its body."""
        self.redactor.headers(headers, "request", [])
        key = self.key(method, target, body)
        scope = session if session is not None and session in self.sessions else ""
        exchange = self.index.take(key, scope)
        if exchange is None:
            message = no_match_message(key, self.index.closest(key))
            self.unmatched_count += 1
            self.unmatched = [*self.unmatched[-(KEPT_UNMATCHED - 1):], message]
            return message
        self.served += 1
        return self._fill(exchange, method, session, body)

    def _fill(self, exchange: Exchange, method: str, session: str | None, body: bytes) -> Answer:
        recorded = exchange.response
        swaps = Swaps(json_or_none(exchange.request.body), json_or_none(body)) \
            if body and exchange.request.body else None
        headers: Headers = []
        chunked = False
        length_header: str | None = None
        for name, value in recorded.headers:
            lower = name.lower()
            if lower in FRAMING:
                chunked = chunked or (lower == "transfer-encoding" and "chunked" in value.lower())
                length_header = value if lower == "content-length" else length_header
                continue
            if lower == SESSION_HEADER:
                value = session if session is not None else self._new_session()
            headers.append((name.encode("latin-1"), value.encode("latin-1")))
        events, payload = recorded.events, recorded.body
        if swaps:
            if events is not None:
                events = [Event(event.t, swaps.event(event.data)) for event in events]
            else:
                payload = swaps.json(payload)
        length: int | None = None
        if events is None and not chunked:  # the recorded length where the body is not all here (HEAD, cut)
            length = int(length_header) if (method == "HEAD" or recorded.end == "cut") and length_header and \
                length_header.isdigit() else len(payload)
        return Answer(recorded.status, recorded.reason.encode("latin-1"), headers, payload, events,
                      recorded.t_head, recorded.t_end, recorded.end, length,
                      json_or_none(exchange.request.body) if exchange.request.body else None, swaps)

    def _new_session(self) -> str:
        session = uuid.uuid4().hex
        self.sessions[session] = None
        if len(self.sessions) > 10_000:
            del self.sessions[next(iter(self.sessions))]
        return session


class ReplayServer:
    """A cassette served over HTTP as the upstream: the data plane's wire (h1) with the replay as its handler.

    Requests are answered by callbacks; a task runs only to keep a recorded timing (speed not None).
    """

    session_header = SESSION_HEADER.encode()

    def __init__(self, cassette: Cassette, *, speed: float | None = 1.0) -> None:
        self.replay = HttpReplay(cassette)
        self.speed = speed
        self.limits = ClientLimits()
        self.connections: set[ClientConnection] = set()
        self._listener: Listener | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.legacy: dict[str, _LegacyStream] = {}  # the live legacy HTTP+SSE sessions, by the id handed out
        self.sock: socket.socket | None = None

    def bind(self, host: str = "127.0.0.1", port: int = 0) -> int:
        """Take the listening socket now (its port known before the loop runs); `start` serves it."""
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.sock = socket.create_server((host, port), family=family, backlog=1024)
        return int(self.sock.getsockname()[1])

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        if self.sock is None:
            self.bind(host, port)
        assert self.sock is not None
        self._listener = Listener(self, self.sock)
        return int(self.sock.getsockname()[1])

    async def stop(self) -> None:
        await stop_serving(self._listener, self._tasks)
        for conn in list(self.connections):
            conn.transport.close()

    # h1.Handler
    def relay_plain(self, client: ClientConnection, target: bytes, headers: Headers,
                    piece: bytes) -> ClientExchange | None:
        return None  # every request is answered by `handle`

    def handle(self, exchange: ClientExchange) -> None:
        pieces: list[bytes] = []
        size = [0]

        def take(data: bytes) -> None:
            size[0] += len(data)
            if size[0] <= MAX_BODY:
                pieces.append(data)

        def ended(_: Headers) -> None:
            try:
                self._answer(exchange, b"".join(pieces), size[0])
            except Exception:  # fail open: never a request left unanswered, nor a 500 for the replay's failure
                ops.exception("replay: answering %s %s failed", exchange.head.method, exchange.head.target)
                self._error(exchange, 502, "chaosproxy replay: internal error (see its log)", None)

        exchange.body.pipe(take, ended)

    def _answer(self, exchange: ClientExchange, body: bytes, size: int) -> None:
        head = exchange.head
        if size > MAX_BODY:
            self._error(exchange, 413, f"chaosproxy replay: a request body over {MAX_BODY >> 20} MiB", None)
            return
        session = head.get(self.session_header)
        answer = self.replay.answer(head.method, head.target.decode("latin-1"),
                                    session.decode("latin-1") if session is not None else None, body,
                                    [(name.decode("latin-1"), value.decode("latin-1")) for name, value in head.headers])
        if isinstance(answer, str):
            ops.warning("%s", answer)
            self._error(exchange, 404, answer, body, self._legacy_stream(head.target))
        elif answer.events is not None and (at := _endpoint_at(answer.events)) is not None:
            self._open_legacy(exchange, answer, answer.events, at)
        elif (stream := self._legacy_stream(head.target)) is not None:
            self._send_now(exchange, answer)  # (the POST's 202), then what answers it on the stream
            stream.release(answer.asked, answer.swaps)
        elif self.speed is None:
            self._send_now(exchange, answer)
        else:
            task = asyncio.get_running_loop().create_task(self._send_timed(exchange, answer, self.speed))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            exchange.on_client_gone = task.cancel

    def _open_legacy(self, exchange: ClientExchange, answer: Answer, events: list[Event], at: int) -> None:
        """A legacy GET stream: its head and endpoint event (events[at], after any comments) now, naming a
        session of the replay's own; the recorded messages after it wait for the POSTs they answer."""
        endpoint, later = events[at], events[at + 1:]
        session = uuid.uuid4().hex
        exchange.start(answer.status, answer.reason, answer.headers, None)
        for comment in events[:at]:
            exchange.write(comment.data)
        exchange.write(sse_with_data(endpoint.data, _endpoint_path(sse_data(endpoint.data) or b"", session)))
        self.legacy[session] = _LegacyStream(exchange, [(event, json_or_none(sse_data(event.data) or b""))
                                                        for event in later])
        exchange.on_client_gone = lambda: self.legacy.pop(session, None)

    def _legacy_stream(self, target: bytes) -> _LegacyStream | None:
        """The live legacy session a POST names in its query, if any."""
        _, _, query = target.partition(b"?")
        if not query or not self.legacy:
            return None
        named = URL("/?" + query.decode("latin-1")).query
        return next((stream for key in LEGACY_SESSION_QUERY if (stream := self.legacy.get(named.get(key, "")))), None)

    def _send_now(self, exchange: ClientExchange, answer: Answer) -> None:
        conn = exchange.conn
        conn.cork()
        exchange.start(answer.status, answer.reason, answer.headers, answer.length)
        if answer.events is not None:
            for event in answer.events:
                exchange.write(event.data)
        else:
            exchange.write(answer.body)
        conn.uncork()
        self._end(exchange, answer)

    async def _send_timed(self, exchange: ClientExchange, answer: Answer, speed: float) -> None:
        loop = asyncio.get_running_loop()
        began = loop.time()

        async def at(t: float) -> None:
            if (wait := began + t / speed - loop.time()) > 0:
                await asyncio.sleep(wait)

        try:
            await at(answer.t_head)
            exchange.start(answer.status, answer.reason, answer.headers, answer.length)
            if answer.events is not None:
                for event in answer.events:
                    await at(event.t)
                    exchange.write(event.data)
                    await exchange.drain()
            else:
                await at(answer.t_end)
                exchange.write(answer.body)
            self._end(exchange, answer)
        except (asyncio.CancelledError, ConnectionError):
            exchange.abort()

    def _end(self, exchange: ClientExchange, answer: Answer) -> None:
        """As the recorded response ended: whole, cut by the upstream, or still open when recording stopped
        (held open until the client leaves)."""
        if answer.end == "complete" or answer.status in NO_BODY_STATUSES:
            exchange.end()
        elif answer.end == "cut":
            exchange.abort()

    def _error(self, exchange: ClientExchange, status: int, message: str, body: bytes | None,
               stream: _LegacyStream | None = None) -> None:
        """No recorded answer: a JSON-RPC error for a JSON-RPC call (on its legacy stream when it names one,
        the POST itself accepted), else `status` with a JSON error."""
        request = json_or_none(body) if body else None
        if isinstance(request, dict) and request.get("jsonrpc") == "2.0" and "method" in request:
            if "id" not in request:  # a notification has no answer to carry an error
                self._reply(exchange, 202, b"", b"")
                return
            payload = orjson.dumps({"jsonrpc": "2.0", "id": request["id"],
                                    "error": {"code": NO_MATCH, "message": message}})
            if stream is not None:
                self._reply(exchange, 202, b"", b"")
                stream.say(payload)
                return
            self._reply(exchange, 200, payload, b"application/json")
            return
        payload = orjson.dumps({"error": {"code": status, "message": message, "type": "chaosproxy_replay"}})
        self._reply(exchange, status, payload, b"application/json")

    @staticmethod
    def _reply(exchange: ClientExchange, status: int, payload: bytes, content_type: bytes) -> None:
        if exchange.gone:
            return
        headers: Headers = [(b"X-Chaosproxy-Error", b"replay-no-match")]
        if content_type:
            headers.append((b"Content-Type", content_type))
        exchange.start(status, _REASONS.get(status, b"Error"), headers, len(payload))
        exchange.write(payload)
        exchange.end()


@dataclass(slots=True)
class _LegacyStream:
    """A live legacy HTTP+SSE session: its GET stream, the recorded messages not yet sent on it (with their
    JSON), and every recorded reply by its request's id, sent or not (a request asked again, as a retry
    does, is answered again)."""

    exchange: ClientExchange
    pending: list[tuple[Event, Any]]
    replies: dict[Any, Event] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.replies = {_hashable(message["id"]): event for event, message in self.pending
                        if isinstance(message, dict) and "method" not in message and "id" in message}

    def release(self, asked: Any, swaps: Swaps | None) -> None:
        """Send the recorded messages up to the replies to the requests in `asked` (a message or a batch),
        the live ids put in; a notification is answered by nothing. A request whose reply went out already
        gets it again; one the recording never saw answered gets the replay's error."""
        ids = {_hashable(message["id"]) for message in (asked if isinstance(asked, list) else [asked])
               if isinstance(message, dict) and "method" in message and "id" in message}
        last = max((i for i, (_, message) in enumerate(self.pending) if isinstance(message, dict)
                    and "method" not in message and _hashable(message.get("id")) in ids), default=-1)
        if self.exchange.gone:
            return
        sent = self.pending[:last + 1]
        del self.pending[:last + 1]
        for event, _ in sent:
            self.exchange.write(swaps.event(event.data) if swaps else event.data)
        answered = {_hashable(message.get("id")) for _, message in sent
                    if isinstance(message, dict) and "method" not in message}
        for key in ids - answered:
            again = self.replies.get(key)
            if again is not None:
                self.exchange.write(swaps.event(again.data) if swaps else again.data)
            else:
                live = swaps.ids.get(key, key) if swaps else key
                self.say(orjson.dumps({"jsonrpc": "2.0", "id": live, "error": {
                    "code": NO_MATCH, "message": "chaosproxy replay: the recording holds no reply to this request"}}))

    def say(self, message: bytes) -> None:
        """A message of the replay's own on the stream (the error for a request the cassette lacks)."""
        if not self.exchange.gone:
            self.exchange.write(b"event: message\r\ndata: " + message + b"\r\n\r\n")


def _endpoint_at(events: list[Event]) -> int | None:
    """Where a recorded legacy GET stream names the endpoint to POST to: its first event but comments (None:
    the stream is no legacy one)."""
    at = next((i for i, event in enumerate(events)
               if sse_field(event.data, b"event") is not None or sse_data(event.data) is not None), None)
    return at if at is not None and sse_field(events[at].data, b"event") == b"endpoint" else None


def _endpoint_path(recorded: bytes, session: str) -> bytes:
    """The endpoint a legacy stream names, as a path on the replay server with the replay's own session."""
    url = urlsplit(recorded.decode("utf-8", "replace").strip())
    pairs = [(key, session if key in LEGACY_SESSION_QUERY else value) for key, _, value in
             (pair.partition("=") for pair in url.query.split("&") if pair)]
    return (url.path + "?" + "&".join(f"{key}={value}" for key, value in pairs)).encode()


_REASONS = {200: b"OK", 202: b"Accepted", 404: b"Not Found", 413: b"Content Too Large", 502: b"Bad Gateway"}


# stdio

@dataclass(slots=True)
class _Turn:
    """A client frame and the server frames that answered it, each `dt` seconds after it."""

    request: Any
    answers: list[tuple[float, Frame]]


class StdioReplay:
    """A stdio cassette served as the server: the client's lines in, the recorded server lines out.

    Server lines are attributed when the cassette is read: a reply to the request with its id, anything
    else (notifications, the server's own requests) to the request still open most recently, else to the
    last client line; lines before any client line are sent at start.
    """

    def __init__(self, cassette: Cassette, *, speed: float | None = 1.0) -> None:
        self.redactor = Redactor(cassette.extra_redactions)
        self.speed = speed
        self.startup: list[tuple[float, Frame]] = []
        self.unmatched: list[str] = []
        turns: list[tuple[Key, _Turn]] = []
        open_requests: dict[Any, _Turn] = {}
        began: dict[int, float] = {}
        last: _Turn | None = None
        for frame in cassette.frames:
            message = json_or_none(frame.data)
            if frame.side == "client":
                if not isinstance(message, dict) or "method" not in message:
                    continue  # a reply to the server's request: nothing answers it
                last = _Turn(message, [])
                began[id(last)] = frame.t
                turns.append((frame_key(message), last))
                if "id" in message:
                    open_requests[_hashable(message["id"])] = last
                continue
            is_reply = isinstance(message, dict) and "method" not in message and "id" in message
            turn = open_requests.pop(_hashable(message["id"]), None) if is_reply else None
            if turn is None:
                turn = next(reversed(open_requests.values()), None) or last
            if turn is None:
                self.startup.append((frame.t, frame))
            else:
                turn.answers.append((frame.t - began[id(turn)], frame))
        self.index: Index[_Turn] = Index(turns)
        self.longest = max((dt for _, turn in turns for dt, _ in turn.answers), default=0.0)

    async def serve(self, read_line: Callable[[], Any], write: Callable[[bytes], Any]) -> int:
        """Answer lines from `read_line` (b"" at the end) by `write`; returns once the client hangs up
        and what was due has gone out."""
        lock = asyncio.Lock()
        pending: set[asyncio.Task[None]] = set()

        async def send(answers: list[tuple[float, Frame]], swaps: Swaps | None) -> None:
            loop = asyncio.get_running_loop()
            began = loop.time()
            for dt, frame in answers:
                if self.speed is not None and (wait := began + dt / self.speed - loop.time()) > 0:
                    await asyncio.sleep(wait)
                data = swaps.json(frame.data) if swaps else frame.data
                async with lock:
                    await write(data + b"\n")

        def start(answers: list[tuple[float, Frame]], swaps: Swaps | None) -> None:
            task = asyncio.create_task(send(answers, swaps))
            pending.add(task)
            task.add_done_callback(pending.discard)

        start(self.startup, None)
        while line := await read_line():
            answers, swaps = self._answer(line.rstrip(b"\r\n"))
            if answers:
                start(answers, swaps)
        if pending:  # what is due still goes out, within the longest recorded wait (and a margin)
            await asyncio.wait(pending, timeout=self.longest / (self.speed or 1) + 5)
        return 0

    def _answer(self, line: bytes) -> tuple[list[tuple[float, Frame]], Swaps | None]:
        found: list[str] = []
        message = json_or_none(self.redactor.json(line, "client", found))
        live = json_or_none(line)
        if not isinstance(message, dict) or "method" not in message:
            return [], None  # a reply to one of the server's requests, or not JSON-RPC
        key = frame_key(message)
        turn = self.index.take(key)
        if turn is not None:
            return turn.answers, Swaps(turn.request, live)
        said = no_match_message(key, self.index.closest(key))
        self.unmatched.append(said)
        print(said, file=sys.stderr)
        if "id" not in message:
            return [], None
        error = orjson.dumps({"jsonrpc": "2.0", "id": live["id"], "error": {"code": NO_MATCH, "message": said}})
        return [(0.0, Frame(0, 0.0, "server", error))], None
