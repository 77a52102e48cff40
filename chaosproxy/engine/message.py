"""The engine's view of one message crossing the proxy, whatever the transport."""

from __future__ import annotations

import re
from collections.abc import Mapping
from enum import StrEnum
from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:
    from chaosproxy.protocols.a2a.wire import A2aCall
    from chaosproxy.telemetry.tracing import CallTrace


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
                 "body", "request", "route", "api", "model", "turn", "trace", "mirrored", "a2a", "_rpc")

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
        # Model-API traffic (chaosproxy.protocols.llm): which API, which model, which turn of the conversation.
        self.api: str | None = None
        self.model: str | None = None
        self.turn: int | None = None
        # A2A traffic (chaosproxy.protocols.a2a): the method, task, skill and agent, as the A2A relay read them.
        self.a2a: A2aCall | None = None
        self._rpc: Any = _UNPARSED
        self.trace: CallTrace | None = None  # the call's span when tracing is on (chaosproxy.telemetry.tracing)
        # mirrored headers a fault set apart from the body (Rewrite.headers)
        self.mirrored: dict[str, str] | None = None

    @property
    def rpc(self) -> dict[str, Any] | None:
        """The JSON-RPC message in the body, or None when the body is not one."""
        if self._rpc is _UNPARSED:
            self._rpc = parse_rpc(self.body) if self.body else None
        rpc: dict[str, Any] | None = self._rpc
        return rpc

    def replace(self, rpc: dict[str, Any], mirrored: Mapping[str, str] | None = None) -> None:
        """Make this message carry `rpc` instead (a fault rewrote it); `body` is re-serialized. `mirrored`:
        headers that are to say something else than the body (see `mirrored_headers`)."""
        self._rpc = rpc
        self.body = orjson.dumps(rpc)
        if mirrored:
            self.mirrored = {**(self.mirrored or {}), **mirrored}

    @property
    def parsed(self) -> bool:
        """Whether `rpc` was asked for (or set) already."""
        return self._rpc is not _UNPARSED

    def _call(self) -> dict[str, Any] | None:
        return self.request.rpc if self.request is not None else self.rpc

    @property
    def method(self) -> str | None:
        """JSON-RPC method of this message, or of the request a response answers."""
        return rpc_method(self._call())

    @property
    def tool(self) -> str | None:
        """Tool name of a `tools/call`, for the request and for its response."""
        return rpc_tool(self._call())

    @property
    def rpc_id(self) -> str | int | None:
        rpc = self.rpc if self.rpc is not None else self._call()
        rpc_id = rpc.get("id") if rpc else None
        return rpc_id if isinstance(rpc_id, (str, int)) else None


def parse_rpc(body: bytes) -> dict[str, Any] | None:
    """The JSON-RPC message `body` holds, or None."""
    if b'"jsonrpc"' not in body:  # a REST body is not parsed to find out
        return None
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    return parsed if isinstance(parsed, dict) and parsed.get("jsonrpc") == "2.0" else None


def rpc_call(rpc: dict[str, Any] | None) -> tuple[str | None, str | None, Any] | None:
    """A call line's JSON-RPC fields of a message: its method, tool and id (None when it is not one).
    `rpc_method` and `rpc_tool` in one: it runs for every call line."""
    if rpc is None:
        return None
    method = rpc.get("method")
    if type(method) is not str:
        return None, None, rpc.get("id")
    tool = None
    if method == "tools/call" and type(params := rpc.get("params")) is dict and type(name := params.get("name")) is str:
        tool = name
    return method, tool, rpc.get("id")


def rpc_method(rpc: dict[str, Any] | None) -> str | None:
    method = rpc.get("method") if rpc else None
    return method if isinstance(method, str) else None


def rpc_tool(rpc: dict[str, Any] | None) -> str | None:
    """The tool a `tools/call` names."""
    if not rpc or rpc.get("method") != "tools/call":
        return None
    params = rpc.get("params")
    name = params.get("name") if isinstance(params, dict) else None
    return name if isinstance(name, str) else None


_HEADER_VALUE = re.compile(r"[\x20-\x7e]*")


def mirrored_headers(msg: Message) -> dict[str, str]:
    """The 2026-era headers that mirror a JSON-RPC request's body (`Mcp-Name`, `Mcp-Method`), by lower-case
    name, as the body now says. What the body says is the agent's: only a valid header value (printable
    ASCII) is given, so that no header line of the agent's making is written upstream. A fault that made
    them disagree with the body (`msg.mirrored`) has the last word."""
    mirrored = {"mcp-name": msg.tool, "mcp-method": msg.method} | (msg.mirrored or {})
    return {name: value for name, value in mirrored.items() if value is not None and _HEADER_VALUE.fullmatch(value)}
