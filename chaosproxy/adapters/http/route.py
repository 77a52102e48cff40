"""A route: the upstream a path prefix goes to, its pool of connections and its body relays."""

from __future__ import annotations

import ssl
from typing import TYPE_CHECKING

from yarl import URL

from chaosproxy.adapters.a2a_relay import A2aRelay
from chaosproxy.adapters.h1 import (
    Head,
    Headers,
    UpstreamPool,
)
from chaosproxy.adapters.http.heads import HOST_AND_LENGTH, TRACE_CONTEXT, UPGRADE, without
from chaosproxy.adapters.jsonrpc import BodyRelay, JsonRpcRelay
from chaosproxy.adapters.llm_relay import LlmRelay
from chaosproxy.engine.core import Engine
from chaosproxy.telemetry.redact import redacted_url

if TYPE_CHECKING:
    from chaosproxy.adapters.http.calls import Call


class Route:
    """Requests under `prefix` go to `upstream` with the prefix taken off ("/" takes everything else)."""

    __slots__ = ("prefix", "name", "upstream", "base_path", "host_header", "pool", "relay", "llm", "a2a")

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
        self.a2a = A2aRelay(engine, self.prefix, url)  # A2A requests, and the agent card pointed back here

    def target(self, raw_target: str) -> str | None:
        """The upstream request target (path and query) for a request's, or None when not under the prefix."""
        if not self.prefix:
            return raw_target
        rest = raw_target[len(self.prefix):]
        if raw_target.startswith(self.prefix) and (not rest or rest[0] in "/?"):
            return rest if rest.startswith("/") else "/" + rest
        return None

    def url_of(self, target: bytes) -> str:
        """The upstream's URL for an upstream request target (its path and query)."""
        return f"{'https' if self.pool.tls else 'http'}://{self.host_header.decode()}{target.decode('latin-1')}"

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
        if call.upstream_headers:  # in place of the agent's (its trace context: the proxy's span is the parent now)
            names = TRACE_CONTEXT.union(name for name, _ in call.upstream_headers)  # lower case
            headers = [(name, value) for name, value in headers if name.lower() not in names] + call.upstream_headers
        return without(headers, b"expect") if body_read else headers
