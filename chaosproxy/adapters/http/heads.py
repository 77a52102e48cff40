"""What the three paths share about heads and bodies: header lists and views, a request as written with
its Host changed, framing lines, sessions and paths read from a request, what may be mirrored."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import unquote

from yarl import URL

from chaosproxy.adapters.h1 import (
    Headers,
)
from chaosproxy.engine.interest import AGENT_HEADER_KEY
from chaosproxy.engine.message import Message, mirrored_headers
from chaosproxy.engine.sessions import agent_name

HOP_BY_HOP = frozenset(name.decode() for name in (
    b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"te", b"trailer", b"trailers",
    b"transfer-encoding", b"upgrade", b"proxy-connection", b"host"))


SMALL_BODY = 1 << 20  # request bodies up to this size are kept for the call line (JSON-RPC method, tool)


RULE_BODY_LIMIT = 16 << 20  # the largest body (or SSE event) a rule may look inside
# REQUEST_TRAILERS: trailers of a chunked request are not forwarded. Upstream connections are pooled
# across agents, and some servers (aiohttp's among them) read request trailers as headers of the
# *next* request on the connection: one agent's trailer would reach another agent's request.


CONTENT_LENGTH = frozenset({b"content-length"})  # re-framed by the proxy


HOST_AND_LENGTH = frozenset({b"host", b"content-length"})


UPGRADE = frozenset({b"upgrade"})


UPGRADE_AND_CONNECTION = frozenset({b"upgrade", b"connection"})


class HeaderView(Mapping[str, str]):
    """Raw header pairs read as a case-insensitive str mapping (first value wins), decoded on demand."""

    __slots__ = ("pairs",)

    def __init__(self, pairs: Headers) -> None:
        self.pairs = pairs

    def get(self, name: str, default: Any = None) -> Any:
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


# The agent's trace context, which the proxy's replaces whole when it opens a span: a tracestate goes upstream
# only as the proxy writes it (valid by the W3C grammar, under the agent's valid parent), never as the agent sent it.
TRACE_CONTEXT = frozenset({b"traceparent", b"tracestate"})


def head_with(head: bytes, headers: Headers, replaced: frozenset[bytes] = frozenset()) -> bytes:
    """`head` (as `as_sent` made it) with `headers` (lower-case names) in place of its own ones, and
    without those named in `replaced`."""
    names = {name for name, _ in headers} | replaced
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


def is_text(content_type: str) -> bool:
    return "json" in content_type or content_type.startswith("text/")


def mirror_rpc_headers(headers: Headers, msg: Message) -> Headers:
    """Keep the 2026-era mirrored headers consistent with a rewritten body (servers reject a mismatch)."""
    mirrored = mirrored_headers(msg)
    return [(name, value if (new := mirrored.get(name.lower().decode("latin-1"))) is None else new.encode())
            for name, value in headers]
