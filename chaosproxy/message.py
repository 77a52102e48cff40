"""The engine's view of one message crossing the proxy, whatever the transport."""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:
    from chaosproxy.otel import CallTrace


class Phase(StrEnum):
    """Which way a message travels: the agent's request, or the answer on its way back."""

    REQUEST = "request"
    RESPONSE = "response"


_UNPARSED: Any = object()


class Message:
    """One request or response. JSON-RPC fields are parsed from `body` only when first asked for.

    A response carries the request it answers (`request`), so rules can match a reply on the
    method and tool of the call that caused it.
    """

    __slots__ = ("transport", "phase", "session", "http_method", "path", "headers", "status",
                 "body", "request", "route", "api", "model", "turn", "trace", "_rpc")

    def __init__(self, transport: str, phase: Phase, *, session: str = "-",
                 http_method: str | None = None, path: str | None = None,
                 headers: Mapping[str, str] | None = None, status: int | None = None,
                 body: bytes | None = None, request: Message | None = None,
                 route: str | None = None) -> None:
        self.transport = transport
        self.phase = phase
        self.session = session
        self.http_method = http_method
        self.path = path
        self.headers: Mapping[str, str] = headers if headers is not None else {}
        self.status = status
        self.body = body
        self.request = request
        self.route = route
        # Model-API traffic (chaosproxy.llm): which API, which model, which turn of the conversation.
        self.api: str | None = None
        self.model: str | None = None
        self.turn: int | None = None
        self._rpc: Any = _UNPARSED
        self.trace: CallTrace | None = None  # the call's span when tracing is on (chaosproxy.otel)

    @property
    def rpc(self) -> dict[str, Any] | None:
        """The JSON-RPC message in the body, or None when the body is not one."""
        if self._rpc is _UNPARSED:
            self._rpc = None
            if self.body and b'"jsonrpc"' in self.body:  # a REST body is not parsed to find out
                try:
                    parsed = orjson.loads(self.body)
                except orjson.JSONDecodeError:
                    parsed = None
                if isinstance(parsed, dict) and parsed.get("jsonrpc") == "2.0":
                    self._rpc = parsed
        return self._rpc

    def replace(self, rpc: dict[str, Any]) -> None:
        """Make this message carry `rpc` instead (a fault rewrote it); `body` is re-serialized."""
        self._rpc = rpc
        self.body = orjson.dumps(rpc)

    def _call(self) -> dict[str, Any] | None:
        return self.request.rpc if self.request is not None else self.rpc

    @property
    def method(self) -> str | None:
        """JSON-RPC method of this message, or of the request a response answers."""
        call = self._call()
        method = call.get("method") if call else None
        return method if isinstance(method, str) else None

    @property
    def tool(self) -> str | None:
        """Tool name of a `tools/call`, for the request and for its response."""
        call = self._call()
        if not call or call.get("method") != "tools/call":
            return None
        params = call.get("params")
        name = params.get("name") if isinstance(params, dict) else None
        return name if isinstance(name, str) else None

    @property
    def rpc_id(self) -> str | int | None:
        rpc = self.rpc if self.rpc is not None else self._call()
        rpc_id = rpc.get("id") if rpc else None
        return rpc_id if isinstance(rpc_id, (str, int)) else None
