"""HTTP/1.1 heads: a parsed head and what its framing needs (`Head`), whether a head may go on as it
was written (`as_written`, the keep-alive lines Node's server adds), a head serialised, and chunked framing.

Headers, hop-by-hop ones and the statuses without a body are named here for the whole data plane.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

Headers = list[tuple[bytes, bytes]]

HOP_BY_HOP = frozenset({b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"te",
                        b"trailer", b"trailers", b"transfer-encoding", b"upgrade", b"proxy-connection"})
NO_BODY_STATUSES = frozenset({204, 304})
IDEMPOTENT = frozenset({"GET", "HEAD", "PUT", "DELETE", "OPTIONS", "TRACE"})


NO_NAMES: frozenset[bytes] = frozenset()
# the names Head's one pass over the headers stops at: hop-by-hop, framing, Expect (and Host in a request)
RESPONSE_SPECIAL = HOP_BY_HOP | {b"content-length", b"expect"}
REQUEST_SPECIAL = RESPONSE_SPECIAL | {b"host"}
METHODS = {method.encode(): method for method in ("GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS", "PATCH")}


def method_name(method: bytes) -> str:
    return METHODS.get(method) or method.decode("ascii", "replace")


class Head:
    """A request or response head as parsed: the raw header pairs plus what framing needs.

    One pass over the headers finds the framing and sorts out `forward`: the end-to-end headers, bar
    Content-Length (the proxy frames what it sends) and, in a request, Host (the upstream's is sent).
    `special` names the headers the pass stops at: RESPONSE_SPECIAL, or REQUEST_SPECIAL plus `watch`,
    a header whose first value is kept as `watched` (the agent's session).
    """

    __slots__ = ("method", "target", "status", "reason", "version", "headers", "length", "chunked",
                 "keep_alive", "upgrade", "expect_continue", "hop", "forward", "watched", "plain")

    def __init__(self, headers: Headers, version: str, keep_alive: bool,
                 special: frozenset[bytes] = RESPONSE_SPECIAL, watch: bytes = b"\0") -> None:
        self.method = ""
        self.target = b""
        self.status = 0
        self.reason = b""
        self.version = version
        self.headers = headers
        self.keep_alive = keep_alive
        self.upgrade = False
        self.expect_continue = False
        self.length: int | None = None
        self.chunked = False
        self.watched: bytes | None = None
        hop = HOP_BY_HOP
        forward: Headers = []
        plain = 0  # counts what keeps the head from going on as written: hop-by-hop headers, repeats
        for pair in headers:
            lower = pair[0].lower()
            if lower not in special:
                forward.append(pair)
                continue
            value = pair[1]
            if lower == b"content-length":
                plain += 2 if self.length is not None else 0
                self.length = int(value) if value.strip().isdigit() else None
            elif lower == b"host":
                plain += 1  # the first is free (see below)
            elif lower == b"transfer-encoding":
                self.chunked = b"chunked" in value.lower()
                plain += 2
            elif lower == b"connection":
                plain += 2
                named = {token.strip().lower() for token in value.split(b",")}
                if not named <= hop:  # Connection: keep-alive names nothing new (the set stays shared)
                    hop = hop | named
            elif lower == b"expect":
                self.expect_continue = value.strip().lower() == b"100-continue"
                forward.append(pair)
            elif lower == watch:
                if self.watched is None:
                    self.watched = value
                forward.append(pair)
            elif lower in hop:
                plain += 2
        if self.chunked:
            self.length = None
        if hop is not HOP_BY_HOP:  # Connection named more hop-by-hop headers, maybe ones already passed
            forward = [pair for pair in forward if pair[0].lower() not in hop]
        self.hop = hop
        self.forward = forward
        self.plain = plain <= 1  # no hop-by-hop header, no repeated Content-Length, one Host at most

    @property
    def has_body(self) -> bool:
        return self.chunked or bool(self.length)

    def get(self, name: bytes) -> bytes | None:
        """The first value of a header (`name` in lower case)."""
        for key, value in self.headers:
            if key.lower() == name:
                return value
        return None

    def end_to_end(self, *, keep: frozenset[bytes] = NO_NAMES, drop: frozenset[bytes] = NO_NAMES) -> Headers:
        """The headers without hop-by-hop ones (including those Connection names), bar `keep`, and `drop`."""
        if self.hop is HOP_BY_HOP:  # no Connection header naming others: the set is one of a few, kept
            hop = _HOPS.get((keep, drop))
            if hop is None:
                hop = _HOPS[keep, drop] = (HOP_BY_HOP - keep) | drop
        else:
            hop = (self.hop - keep) | drop
        return [pair for pair in self.headers if pair[0].lower() not in hop]


_HOPS: dict[tuple[frozenset[bytes], frozenset[bytes]], frozenset[bytes]] = {}
_NOT_AS_IS = HOP_BY_HOP - {b"transfer-encoding"}
_AS_IS_CHECKED = HOP_BY_HOP | {b"content-type"}  # the names `as_written` looks at
_KEEP_ALIVE_LINE = re.compile(rb"\r\n(?:connection|keep-alive):[^\r]*", re.IGNORECASE)


def as_written(piece: bytes, headers: Headers, events: bool) -> tuple[bytes, int] | None:
    """`piece`, which starts with a whole response head (`headers`), as it may reach the client: as the
    upstream wrote it when the head has no hop-by-hop header bar `Transfer-Encoding: chunked` and
    (unless `events`) is not an event stream's; without its `Connection: keep-alive` and `Keep-Alive`
    lines when those are its only others, as Node's server sends them (they say how the upstream keeps
    its connection, not how the proxy keeps the agent's), with the body's Content-Length found on the
    way (-1: none, or chunked). None: the head must be re-serialised."""
    keep_alive_lines = 0
    length = -1
    chunked = False
    for name, value in headers:
        lower = name.lower()
        if lower in _AS_IS_CHECKED:
            if keeps_alive(lower, value):
                keep_alive_lines += 1
            elif lower in _NOT_AS_IS or (lower == b"transfer-encoding" and value.strip().lower() != b"chunked") or \
                    (lower == b"content-type" and not events and b"event-stream" in value):
                return None
            elif lower == b"transfer-encoding":
                chunked = True
        elif lower == b"content-length" and value.strip().isdigit():
            length = int(value)
    relayed = without_keep_alive(piece, keep_alive_lines) if keep_alive_lines else piece
    return None if relayed is None else (relayed, -1 if chunked else length)


def keeps_alive(lower: bytes, value: bytes) -> bool:
    """Whether a header (its name in lower case) only says the connection it came on is kept alive."""
    return lower == b"keep-alive" or (lower == b"connection" and value.strip().lower() == b"keep-alive")


def without_keep_alive(piece: bytes, lines: int) -> bytes | None:
    """`piece`, which starts with a whole message head holding `lines` Connection and Keep-Alive header
    lines, without those lines (None if they are not all found in the head)."""
    blank = piece.find(b"\r\n\r\n")
    head, found = _KEEP_ALIVE_LINE.subn(b"", piece[:blank])
    return head + piece[blank:] if blank > 0 and found == lines else None


def serialize_head(first_line: bytes, headers: Headers, framing: bytes = b"") -> bytes:
    """A head on the wire: the first line, the headers as given, then `framing` (ready-made header lines)."""
    if not headers:
        return first_line + framing + b"\r\n"
    return b"".join((first_line, b"\r\n".join(map(_name_value, headers)), b"\r\n", framing, b"\r\n"))


_name_value = b": ".join  # one header line, without its CRLF, from a (name, value) pair


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(data), data)


def last_chunk(trailers: Iterable[tuple[bytes, bytes]]) -> bytes:
    return b"0\r\n" + b"".join(name + b": " + value + b"\r\n" for name, value in trailers) + b"\r\n"
