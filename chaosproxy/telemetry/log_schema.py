"""The perturbation log's schema, written once: each kind of line, its keys and their types, the call
outcomes and the stream endings. Every writer (the engine, the adapters, the model-API and A2A relays,
the control plane) and every reader (reports, metrics, the control API's journal and feed) takes the
names from here, so that a renamed key or outcome is found by mypy wherever it is written or read.

A line is one JSON object. Every line has `ts` (ISO-8601 UTC, microseconds), `event` (its kind),
`run_id` and `seed`; a line of a proxy made on demand or of a scope also names it (`proxy`, `scope`).
The run line says which version of this schema the lines after it follow (`schema`). A key that is
not here is not written; a key marked NotRequired is left out when it does not apply (an MCP call has
`method`, `tool` and `rpc_id`; a model-API call `api`, `model` and `turn`). Readers should ignore keys
they do not know: a later schema version may add keys, and changes `schema` when it renames or drops one.

Writers pass a line's fields as keyword arguments (PerturbationLog.fault(**fields) takes a FaultFields),
so mypy checks each write site's keys and values; a call line, written per request, is made here
(`call_line`). Readers take the keys from `Key`, so that no other module spells a call line's key: a
test greps the package for them.

Named `log_schema` rather than `schema`: faults/_schema (a tool's output schema) and
engine/editor_schema (the scenario's JSON Schema) are other schemas.
"""

# (no `from __future__ import annotations`: TypedDict reads NotRequired from the annotations at runtime)
from collections.abc import Mapping
from enum import StrEnum
from typing import Any, Final, NotRequired, TypedDict

SCHEMA_VERSION = 1  # the run line's `schema`: raised when a key is renamed or dropped, or changes meaning


class Event(StrEnum):
    """A line's kind (`event`)."""

    RUN = "run"  # the first line of a run: what was loaded, with which seed
    CALL = "call"  # one proxied request (an MCP message, a REST call, a model-API turn), whatever befell it
    FAULT = "fault"  # a fault fired: it changed what the agent received
    SKIP = "skip"  # a rule matched but its fault could not act on the payload, and says why
    ERROR = "error"  # the proxy's own failure (a fault or relay bug); the traffic went through as it came
    SESSION = "session"  # a session's state was dropped, or a dropped session came back
    CONTROL = "control"  # a change made at runtime (scenario, rule, reset, reload, proxies, scopes, toxics)
    DROPPED = "dropped"  # not in the file: the control API's live feed says how many lines a slow reader lost


class Outcome(StrEnum):
    """What became of a call (`outcome` of a call line)."""

    OK = "ok"  # answered as upstream answered (perhaps perturbed, slowed or cut short on purpose: see faults)
    FAULT_RESPONSE = "fault_response"  # a fault answered in upstream's place
    HANG = "hang"  # a fault held the call and never answered
    RESET = "reset"  # the connection was reset (a fault)
    TRUNCATED = "truncated"  # the body was cut short and the connection closed (a fault)
    STREAM_CUT = "stream_cut"  # an event stream was ended early (a fault)
    STREAM_IDLE = "stream_idle"  # an event stream went silent, kept open (a fault)
    CLIENT_DISCONNECTED = "client_disconnected"  # the agent hung up before it had the whole answer
    UPSTREAM_ERROR = "upstream_error"  # upstream could not be reached or broke off: the agent got a 502
    UPSTREAM_TIMEOUT = "upstream_timeout"  # upstream took too long to connect or answer: the agent got a 504
    NO_ROUTE = "no_route"  # no configured upstream for the path
    NOT_A_FORWARD_PROXY = "not_a_forward_proxy"  # an absolute-form request (the proxy is no open relay)
    PROXY_ERROR = "proxy_error"  # the proxy's own failure, answered with an error
    UNANSWERED = "unanswered"  # stdio: the server exited with the request still unanswered
    DROPPED = "dropped"  # stdio: a fault dropped the message, nothing was delivered in its place


# Outcomes that leave the agent without an answer: a report counts such a call as never completed.
INCOMPLETE = frozenset({Outcome.HANG, Outcome.CLIENT_DISCONNECTED, Outcome.STREAM_IDLE})


class StreamEnd(StrEnum):
    """How an adapter ends a response body it relays: as upstream did, or as a fault asked. Each gives
    its call an outcome (CUT: stream_cut, CLOSE: truncated, RESET: reset, IDLE: stream_idle)."""

    EOF = "eof"  # as the body ends (mitm, a cut stream: by closing the connection, as a server does)
    CLOSE = "close"  # FIN after the bytes sent (Truncate)
    RESET = "reset"  # a TCP reset (Reset)
    IDLE = "idle"  # nothing more, the connection kept open (CutStream idle)
    CUT = "cut"  # a clean end after the events kept (CutStream)


class Key:
    """The keys of the log's lines, by name, for readers (and writers that set a key alone): each is
    spelled here only, and mypy checks a use of one against the line's TypedDict."""

    # every line's
    TS: Final = "ts"
    EVENT: Final = "event"
    RUN_ID: Final = "run_id"
    SEED: Final = "seed"
    PROXY: Final = "proxy"
    SCOPE: Final = "scope"
    # a call line's (and, where they mean the same, other lines')
    TRANSPORT: Final = "transport"
    SESSION: Final = "session"
    ROUTE: Final = "route"
    HTTP_METHOD: Final = "http_method"
    PATH: Final = "path"
    STATUS: Final = "status"
    OUTCOME: Final = "outcome"
    BYTES_OUT: Final = "bytes_out"
    DURATION_MS: Final = "duration_ms"
    FAULTS: Final = "faults"
    METHOD: Final = "method"
    TOOL: Final = "tool"
    RPC_ID: Final = "rpc_id"
    API: Final = "api"
    MODEL: Final = "model"
    TURN: Final = "turn"
    # fault, skip, error, session and control lines'
    RULE: Final = "rule"
    FAULT: Final = "fault"
    COMPONENT: Final = "component"
    LEVEL: Final = "level"
    PHASE: Final = "phase"
    PARAMS: Final = "params"
    ACTION: Final = "action"
    EFFECT: Final = "effect"
    ROUTED_TO: Final = "routed_to"
    REASON: Final = "reason"
    ERROR: Final = "error"
    CHANGE: Final = "change"
    COUNT: Final = "count"


class Line(TypedDict):
    """What every line carries."""

    ts: str
    event: str
    run_id: str
    seed: int
    proxy: NotRequired[str]  # a proxy made on demand (control API) wrote it
    scope: NotRequired[str]  # a scope of a listener wrote it


class ProxyMark(TypedDict, total=False):
    proxy: str


class Marks(ProxyMark, total=False):
    """What the lines of a proxy made on demand, or of a scope of a listener, are marked with."""

    scope: str


class ModelCallFields(TypedDict, total=False):
    """A model-API message's: every line about one names its API, model and turn."""

    api: str
    model: str | None
    turn: int | None


class RunFields(TypedDict):
    version: str  # chaosproxy's
    scenario: str | None  # its file (None: no scenario file)
    rules: list[str]


class RunLine(Line, RunFields):
    schema: int  # SCHEMA_VERSION


class CallFields(TypedDict):
    """One call. Over HTTP every key but those of MCP or a model API; over stdio no HTTP key."""

    transport: str
    session: str
    route: NotRequired[str | None]
    http_method: NotRequired[str | None]
    path: NotRequired[str | None]
    status: NotRequired[int | None]
    outcome: str  # an Outcome
    bytes_out: NotRequired[int]
    duration_ms: float
    faults: list[str] | tuple[str, ...]  # the rules that fired on it
    method: NotRequired[str | None]  # JSON-RPC (MCP) calls
    tool: NotRequired[str | None]
    rpc_id: NotRequired[Any]
    api: NotRequired[str]  # model-API calls
    model: NotRequired[str | None]
    turn: NotRequired[int | None]


class CallLine(Line, CallFields):
    pass


_CALL = Event.CALL  # a global costs a third of the enum's attribute on the hot path


def call_line(ts: str, run_id: str, seed: int, transport: str, session: str, route: str | None,
              http_method: str | None, path: str | None, status: int | None, outcome: str, bytes_out: int,
              duration_ms: float, faults: list[str] | tuple[str, ...], rpc: tuple[str | None, str | None, Any] | None,
              model_call: tuple[str, str | None, int | None] | None) -> CallLine:
    """The line of a call over HTTP, made from its values (one dict display: this runs per request).
    `rpc` is a JSON-RPC call's method, tool and id; `model_call` a model-API call's api, model and turn."""
    line: CallLine = {
        "ts": ts, "event": _CALL, "run_id": run_id, "seed": seed, "transport": transport, "session": session,
        "route": route, "http_method": http_method, "path": path, "status": status, "outcome": outcome,
        "bytes_out": bytes_out, "duration_ms": duration_ms, "faults": faults}
    if rpc is not None:
        line["method"], line["tool"], line["rpc_id"] = rpc
    elif model_call is not None:
        line["api"], line["model"], line["turn"] = model_call
    return line


def line_of(event: str, ts: str, run_id: str, seed: int, fields: Mapping[str, object]) -> dict[str, Any]:
    """A line of kind `event`: the keys every line has, then `fields` (a writer's *Fields, checked where
    it was written)."""
    return {"ts": ts, "event": event, "run_id": run_id, "seed": seed, **fields}


class RoutedFields(TypedDict, total=False):
    routed_to: str | None  # a call routed back to the tool it was renamed from (None: its arguments only)


class DigestFields(TypedDict, total=False):
    perturbed_digest: str  # of what the fault made (a Rewrite's message, a Respond's body, ...)
    original_digest: str  # of the payload it changed


class FaultFields(RoutedFields, ModelCallFields, DigestFields):
    rule: str
    fault: str  # its type
    component: str
    level: str
    phase: str
    transport: str
    session: str
    route: str | None
    http_method: str | None
    path: str | None
    method: str | None
    tool: str | None
    rpc_id: Any
    match_index: int
    params: dict[str, Any]
    action: str  # the action's class name, lower-case
    effect: dict[str, Any]  # what it changed: small and bounded, never the payload


class FaultLine(Line, FaultFields):
    pass


class WhereFields(TypedDict, total=False):
    """Where a skip or an error happened, as far as it is known."""

    fault: str
    transport: str
    session: str
    path: str | None
    api: str | None
    model: str | None
    turn: int | None


class SkipFields(WhereFields):
    rule: str | None  # None: the adapter or relay passed the payload undecided
    reason: str
    phase: NotRequired[str]
    http_method: NotRequired[str | None]
    method: NotRequired[str | None]
    tool: NotRequired[str | None]
    rpc_id: NotRequired[Any]


class SkipLine(Line, SkipFields):
    pass


class ErrorFields(WhereFields):
    error: str
    rule: NotRequired[str | None]


class ErrorLine(Line, ErrorFields):
    pass


class SessionFields(TypedDict):
    session: NotRequired[str]  # none in a summary (`count`)
    change: str  # dropped or restarted
    reason: str  # ended, idle or evicted
    count: NotRequired[int]  # sessions dropped idle or evicted since the last summary (--session-lines summary)


class SessionLine(Line, SessionFields):
    pass


class ControlFields(TypedDict):
    change: str  # scenario, rule, reset, reload, proxy created/deleted, scope deleted, toxic added/updated/...
    rules: NotRequired[list[str]]  # the rules in force after it
    rule: NotRequired[str]
    enabled: NotRequired[bool]
    probability: NotRequired[float]
    scenario: NotRequired[str]
    listen: NotRequired[str]
    toxic: NotRequired[str]
    type: NotRequired[str]
    stream: NotRequired[str]
    toxicity: NotRequired[float]
    attributes: NotRequired[dict[str, Any]]
    proxy: NotRequired[str]  # the proxy (made on demand) or scope it was made in, or that it made or deleted
    scope: NotRequired[str]


class ControlLine(Line, ControlFields):
    pass


class DroppedLine(TypedDict):
    """The control API's live feed only: `count` lines this reader was too slow for."""

    event: str
    count: int


LINES: dict[Event, type[Line]] = {Event.RUN: RunLine, Event.CALL: CallLine, Event.FAULT: FaultLine,
                                  Event.SKIP: SkipLine, Event.ERROR: ErrorLine, Event.SESSION: SessionLine,
                                  Event.CONTROL: ControlLine}
