"""A call: one request through `chaosproxy run` from its head to its call line, whichever path it takes;
its span (tracing on) and its line in the perturbation log."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from mypy_extensions import mypyc_attr

from chaosproxy.adapters.h1 import (
    ClientExchange,
    Headers,
    method_name,
)
from chaosproxy.adapters.http.heads import session_and_path
from chaosproxy.engine.core import Engine
from chaosproxy.engine.message import Message, parse_rpc, rpc_call
from chaosproxy.protocols.llm import api_for_path
from chaosproxy.telemetry import log_schema
from chaosproxy.telemetry.log_schema import CallLine, Outcome

if TYPE_CHECKING:
    from chaosproxy.adapters.http.route import Route


_OK = Outcome.OK  # a global: a third of an enum attribute's cost, once a request


@mypyc_attr(allow_interpreted_subclasses=True)  # the mitm adapter's flows are exchanges too
class Exchange:
    """What the call log needs to know about one request, filled in as it goes (mitm's flows are these too)."""

    __slots__ = ("started", "status", "bytes_out", "outcome", "faults")

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.status: int | None = None
        self.bytes_out = 0
        self.outcome: str = _OK
        self.faults: list[str] = []


@mypyc_attr(allow_interpreted_subclasses=True)
class Call(Exchange):
    """One request through `chaosproxy run`, from its head being in to its call line being logged (once)."""

    __slots__ = ("msg", "logged", "upstream_headers")

    def __init__(self, msg: Message) -> None:  # Exchange's fields set here too: one call less per request
        self.started = time.perf_counter()
        self.status = None
        self.bytes_out = 0
        self.outcome = _OK
        self.faults = []
        self.msg = msg
        self.logged = False
        self.upstream_headers: Headers = []  # added to the request sent upstream (e.g. traceparent)

    def finish(self, engine: Engine) -> None:
        """Here a call ends: its call line (and its span, when tracing) is written, exactly once."""
        if not self.logged:
            self.logged = True
            msg = self.msg
            log_call(engine, msg.transport, msg, self)
            if msg.http_method == "DELETE" and self.status is not None and self.status < 300 and \
                    "Mcp-Session-Id" in msg.headers:  # the agent ended its MCP session: its state goes
                engine.end_session(msg.session)


def start_span(engine: Engine, exchange: ClientExchange, call: Call, route: Route, target: bytes) -> None:
    """Open the call's span (tracing on); the headers carrying the proxy's context go upstream with it."""
    call.upstream_headers = open_span(engine, call.msg, route, target, exchange.peer)


def open_span(engine: Engine, msg: Message, route: Route, target: bytes, peer: str, root: int = 0) -> Headers:
    """Open the span of a call to `target` on `route` (tracing on; `root`: see Tracing.start): the headers
    that carry the proxy's context upstream (lower-case names; none when the sampler leaves the call out)."""
    carrier = engine.tracing.start(msg, network="tcp", url=route.upstream + target.decode("latin-1").removeprefix(
        route.base_path.decode()), session_id=msg.session if msg.session != peer else None, root=root)
    return [(name.encode(), value.encode("latin-1")) for name, value in carrier.items()]


# A call's values as log_call and a PlainRelay keep them until its line is made (call_line): transport,
# session, route, HTTP method, path, status, outcome, bytes out, duration (s), the rules that fired, what
# was called (the request body not parsed yet, or its JSON-RPC method, tool and id; None) and the model
# call (api, model, turn; None).
CallRecord = tuple[str, str, str | None, str | None, str | None, int | None, str, int, float, tuple[str, ...],
                   bytes | tuple[str | None, str | None, Any] | None, tuple[str, str | None, int | None] | None]


def log_call(engine: Engine, transport: str, msg: Message, exchange: Exchange) -> None:
    """The `event: call` line for one request, whatever befell it (the agent's behaviour is scored on these).

    Only the values are taken here (`call_line` makes the line, at the log's next flush): an
    unparsed request body small enough is kept as it is, and read for its JSON-RPC fields then.
    """
    body = msg.body
    if type(body) is bytes and len(body) <= DEFERRED_BODY and not msg.parsed:
        called: Any = body
    else:
        called = rpc_call(msg.rpc) if body is not None else None
    record: CallRecord = (
        transport, msg.session, msg.route, msg.http_method, msg.path, exchange.status, exchange.outcome,
        exchange.bytes_out, time.perf_counter() - exchange.started, tuple(exchange.faults) if exchange.faults else (),
        called, (msg.api, msg.model, msg.turn) if msg.api is not None else None)
    engine.log.write_call(record, call_line)
    if msg.trace is not None:
        msg.trace.end(exchange.outcome, status=exchange.status)


DEFERRED_BODY = 64 << 10  # a request body up to this size is kept until the call line is made


def call_line(ts: str, run_id: str, seed: int, record: CallRecord) -> CallLine:
    """The `event: call` line of a record (made by log_schema, where its keys are)."""
    (transport, session, route, http_method, path, status, outcome, bytes_out, duration_s, faults, called,
     model_call) = record
    # the request body, not parsed on the way, or its JSON-RPC fields
    rpc = rpc_call(parse_rpc(called)) if isinstance(called, bytes) else called
    if rpc is None and model_call is None and http_method == "POST" and path and (api := api_for_path(path)):
        model_call = api, None, None  # a model-API call (named even when no rule acted and the body was never parsed)
    return log_schema.call_line(ts, run_id, seed, transport, session, route, http_method, path, status, outcome,
                                bytes_out, round(duration_s * 1e6) / 1000, faults, rpc, model_call)  # round(x, 3): slow


def plain_call_line(ts: str, run_id: str, seed: int, record: tuple[Any, ...]) -> CallLine:
    """A call line from a PlainRelay's record: its raw values decoded here, at the flush, into what
    `call_line` makes the line of (no fault, no model call, and the body not parsed yet)."""
    transport, watched, peer, route, method, target, status, outcome, bytes_out, duration_s, called = record
    raw = target.decode("latin-1")
    if watched is None and "?" not in raw and "%" not in raw:
        session, path = peer, raw
    else:
        session, path = session_and_path(raw, watched, peer)
    return call_line(ts, run_id, seed, (transport, session, route, method_name(method), path, status, outcome,
                                        bytes_out, duration_s, (), called, None))
