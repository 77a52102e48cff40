"""HTTP/1.1 on asyncio Protocols with httptools: client connections, pooled upstream connections, bodies.

This is the wire layer of `chaosproxy run`. It knows framing (Content-Length, chunked, close-delimited,
HEAD, 1xx, 204/304, Upgrade) and flow control, and nothing about faults: each request is handed to a
`handler` (the proxy), which either pipes it straight through (callbacks only, no task) or inspects it
in a coroutine. A head goes on as it was written when nothing in it must change (it starts a piece of
input and holds no hop-by-hop header; a request's Host is set to the upstream's); any other is
re-serialised, hop-by-hop headers out. Bodies pass piece by piece as they arrive, re-framed only where
the framing must change (a re-serialised chunked body is re-chunked).

The package, a module per concern: `heads` (heads, framing, keep-alive lines), `bodies` (bodies and flow
control), `wire` (what both ends share), `client` (the agent's connection, its exchanges and limits),
`listener` (accepting and stopping), `upstream` (upstream connections, their pool, the byte tap). Its
modules are compiled with mypyc at install (setup.py); this file stays Python and names what they hold.
May import: adapters.errors, protocols.streams and telemetry.log; never the `http` package above it.
"""

from __future__ import annotations

from chaosproxy.adapters.h1.bodies import (
    HIGH_WATER,
    LOW_WATER,
    NO_BODY,
    SENT_BODY,
    Body,
    Producer,
    ignore,
)
from chaosproxy.adapters.h1.client import (
    BAD_REQUEST,
    HEAD_TOO_LARGE,
    INTERNAL_ERROR,
    LINGER_S,
    MAX_QUEUED_REQUESTS,
    REQUEST_TIMEOUT,
    ClientConnection,
    ClientExchange,
    ClientLimits,
    Handler,
    HeadTooLarge,
    refusal,
)
from chaosproxy.adapters.h1.heads import (
    HOP_BY_HOP,
    IDEMPOTENT,
    METHODS,
    NO_BODY_STATUSES,
    NO_NAMES,
    REQUEST_SPECIAL,
    RESPONSE_SPECIAL,
    Head,
    Headers,
    as_written,
    chunk,
    keeps_alive,
    last_chunk,
    method_name,
    serialize_head,
    without_keep_alive,
)
from chaosproxy.adapters.h1.listener import (
    ACCEPT_BATCH,
    ACCEPT_PAUSE_S,
    OUT_OF_FILES,
    OUT_OF_FILES_LOG_S,
    Listener,
    stop_serving,
)
from chaosproxy.adapters.h1.upstream import (
    AS_IS,
    AS_IS_NEVER,
    AS_IS_NO_EVENTS,
    UNKNOWN_LEFT,
    ByteTap,
    ResponseSink,
    UpstreamConnection,
    UpstreamPool,
)

__all__ = ["ACCEPT_BATCH", "ACCEPT_PAUSE_S", "AS_IS", "AS_IS_NEVER", "AS_IS_NO_EVENTS", "BAD_REQUEST", "Body",
           "ByteTap", "ClientConnection", "ClientExchange", "ClientLimits", "HEAD_TOO_LARGE", "HIGH_WATER",
           "HOP_BY_HOP", "Handler", "Head", "HeadTooLarge", "Headers", "IDEMPOTENT", "INTERNAL_ERROR",
           "LINGER_S", "LOW_WATER", "Listener", "MAX_QUEUED_REQUESTS", "METHODS", "NO_BODY",
           "NO_BODY_STATUSES", "NO_NAMES", "OUT_OF_FILES", "OUT_OF_FILES_LOG_S", "Producer",
           "REQUEST_SPECIAL", "REQUEST_TIMEOUT", "RESPONSE_SPECIAL", "ResponseSink", "SENT_BODY",
           "UNKNOWN_LEFT", "UpstreamConnection", "UpstreamPool", "as_written", "chunk", "ignore",
           "keeps_alive", "last_chunk", "method_name", "refusal", "serialize_head", "stop_serving",
           "without_keep_alive"]
