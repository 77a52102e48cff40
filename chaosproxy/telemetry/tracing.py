"""Faults inside the agent's own traces: one OpenTelemetry span per proxied call, faults on it.

Export is switched on by `--otel` or by the standard variables (`OTEL_EXPORTER_OTLP_ENDPOINT`,
`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`); chaosproxy.telemetry.otlp reads the other `OTEL_*` variables (service
name, resource attributes, headers, batching) and exports; `Sampler` reads the sampler's. Switched
off, the proxy holds `NO_TRACING` and its adapters pay one attribute check (`tracing.on`) per call.

A span is recorded on the event loop with as little as it takes (one `random.getrandbits` for its
ids; its name, kind and the attributes that repeat from call to call encoded once and cached) and
queued when the call ends, for chaosproxy.telemetry.otlp's thread to encode and send: no OpenTelemetry SDK,
whose spans cost several times the 30 µs a call's span may cost (bench/otel_overhead.py). A call
the sampler leaves out costs a random number and a comparison.

Spans follow the OpenTelemetry MCP conventions (`tools/call search`, kind CLIENT, `mcp.method.name`,
`gen_ai.tool.name`, ...) for JSON-RPC requests and the HTTP client conventions for other HTTP calls.
The parent is the agent's context: `params._meta.traceparent` (the MCP carrier, the only one on
stdio), else the HTTP `traceparent` header, else `$TRACEPARENT` (a drill's run); when the header
names another context than `_meta`, it becomes a link. The proxy's own context goes upstream in
both carriers, so the tool server's spans nest under the proxy's.

What agents and upstreams send is hostile: a name that reaches a span (a tool's, a prompt's, a method's,
a model's, a session's, a request id) is cut to MAX_NAME characters, its last one `…`, before it names a
span or keys a cache, and chaosproxy.telemetry.otlp cuts every other string value to the attribute value
length limit. The caches of encoded span heads are bounded in bytes as well as in entries.

A fired fault shows three ways, because viewers differ (Langfuse ignores span events): attributes
on the call's span (`chaosproxy.fault.*`, status ERROR when the fault failed the call), a child span
`chaosproxy.fault {type}` lasting as long as the delay or hang it injected, and a span event with
the fields of the fault's log line.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import time
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping
from random import getrandbits
from typing import TYPE_CHECKING, Any, NamedTuple
from urllib.parse import urlsplit

import orjson

from chaosproxy import __version__
from chaosproxy.engine.actions import (
    Action,
    CutStream,
    Delay,
    Garble,
    Hang,
    Reply,
    Reset,
    Respond,
    Rewrite,
    Truncate,
)
from chaosproxy.protocols import a2a
from chaosproxy.protocols.llm import ANTHROPIC
from chaosproxy.telemetry.log import ops
from chaosproxy.telemetry.log_schema import Key, Outcome
from chaosproxy.telemetry.redact import redacted_url, truncated

if TYPE_CHECKING:
    from chaosproxy.engine.message import Message
    from chaosproxy.telemetry.otlp import Encoder

ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
META_VERSION = "io.modelcontextprotocol/protocolVersion"  # 2026-era requests carry their version here
# call outcomes that fail a call on their own: not "fault_response" (it may be a stub result), nor
# "client_disconnected" (an agent may hang up on a stream once it has read its answer)
FAILED_OUTCOMES = frozenset({Outcome.UPSTREAM_ERROR, Outcome.HANG, Outcome.RESET, Outcome.TRUNCATED,
                             Outcome.STREAM_CUT, Outcome.STREAM_IDLE, Outcome.NO_ROUTE, Outcome.UNANSWERED})
MAX_SESSIONS = 10_000  # protocol versions remembered from `initialize`, oldest forgotten first
TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?")
ZERO_TRACE, ZERO_SPAN = "0" * 32, "0" * 16
# W3C Trace Context: `tracestate` is up to 32 list-members `key=value` (a key of lower-case letters, digits
# and _-*/@; a value of printable ASCII but `,` and `=`, not ending in a space), with spaces or tabs around
# each. One longer than 512 characters or breaking the grammar anywhere is dropped whole (a part kept would
# be a list nobody sent), as a malformed traceparent is: what goes upstream is a valid header value.
TRACESTATE_MEMBER = re.compile(r"[a-z0-9][a-z0-9_\-*/@]{0,255}=[\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}"
                               r"[\x21-\x2b\x2d-\x3c\x3e-\x7e]")
MAX_TRACESTATE = 512
MAX_TRACESTATE_MEMBERS = 32
KIND = {"INTERNAL": 1, "SERVER": 2, "CLIENT": 3}  # OTLP SpanKind
MAX_ID64 = (1 << 64) - 1
CLIENT = KIND["CLIENT"]
MAX_HEADS = 4096  # encoded span heads kept (one per method, tool, session, upstream...), all forgotten when full
MAX_HEADS_BYTES = 4 << 20  # or when they hold this many bytes
MAX_NAME = 256  # characters of a name from an agent or upstream in a span (a tool's, a method's...)
MAX_FAULTS = 128  # faults a call's span lists (attributes, events: the SDK's default event count limit)
ROOT_IDS = 0x0A10 << 208 | 0x1208 << 64  # Span.trace_id and span_id's tags around a root span's 192 random bits
NO_META: Mapping[str, Any] = {}  # a request without params._meta (never written to)
CONTEXT_HEADER_LENGTHS = frozenset(map(len, ("traceparent", "tracestate", "mcp-protocol-version")))


class SpanData:
    """A span other than a call's (a drill run's root, a fault's child), for chaosproxy.telemetry.otlp to encode:
    plain fields, ids as raw bytes (b"": no parent), times in ns since the epoch."""

    __slots__ = ("name", "kind", "trace_id", "span_id", "parent_id", "trace_state", "start_ns", "end_ns",
                 "attributes", "events", "links", "error")

    def __init__(self, name: str, kind: int, trace_id: bytes, span_id: bytes, parent_id: bytes, trace_state: str,
                 start_ns: int, attributes: dict[str, Any]) -> None:
        self.name = name
        self.kind = kind
        self.trace_id = trace_id
        self.span_id = span_id
        self.parent_id = parent_id
        self.trace_state = trace_state
        self.start_ns = start_ns
        self.end_ns = start_ns
        self.attributes = attributes
        self.events: list[tuple[int, str, dict[str, Any]]] | None = None  # made when one is added
        self.links: list[tuple[bytes, bytes, dict[str, Any]]] | None = None  # (trace id, span id, attributes)
        self.error: str | None = None  # the status message when the span's status is ERROR

    def encoded(self, encoder: Encoder) -> bytes:
        return encoder.span_data(self)


class CallTrace:
    """The span of one proxied call. The switched-off tracer never makes one."""

    __slots__ = ()

    def fault(self, fields: Mapping[str, Any], action: Action) -> None:
        """A fault fired on this call; `fields` are its log line's."""

    def end(self, outcome: str = Outcome.OK, *, status: int | None = None,
            reply: Mapping[str, Any] | None = None) -> None:
        """The call is over: `outcome` as in the call log, the HTTP `status`, the JSON-RPC `reply`."""

    def task(self, task_id: str | None, state: str | None) -> None:
        """The A2A task the call is about (`a2a.task.id`), and its state as the agent got it (`a2a.task.state`)."""


class Tracing:
    """No tracing: what the proxy holds unless export is on. Adapters check `on` and go no further."""

    on = False

    def start(self, msg: Message, *, network: str, url: str | None = None,
              session_id: str | None = None, root: int = 0) -> dict[str, str]:
        """Open the span of the call `msg` starts and put the proxy's context into its `_meta`.

        Returns the HTTP headers to forward in place of the agent's `traceparent`/`tracestate`.
        `network` is `tcp` or `pipe`; `url` the upstream URL of an HTTP call (the real server's
        address); `session_id` the MCP session (the `Mcp-Session-Id`, or a legacy `sessionId`);
        `root` what `root_draw` drew for it, if it was asked.
        """
        return {}

    def root_draw(self, headers: Iterable[tuple[bytes, bytes]], body: bytes) -> int | None:
        """The sampler's decision for an HTTP call, taken before a Message is made for it, when the
        call cannot name a parent: 0 when it is left out, else the random bits of its ids (for
        `start(root=...)`). None when it may name a parent or every call is kept: `start` decides."""
        return None

    def run_span(self, name: str, attributes: Mapping[str, Any]) -> RunSpan:
        """A root span for a drill run (see `RunSpan`)."""
        return RunSpan()

    def shutdown(self) -> None:
        """Export what is left; called once when the proxy stops."""


class RunSpan:
    """A drill run's root span; `environment()` gives its agent TRACEPARENT and BAGGAGE."""

    trace_id: str | None = None

    def environment(self, baggage: Mapping[str, Any]) -> dict[str, str]:
        return {}

    def end(self, status: str) -> None:
        """The run is over with `status` (passed, failed, timeout, error)."""


NO_TRACING = Tracing()


def export_requested(flag: bool = False, environ: Mapping[str, str] = os.environ) -> bool:
    """True with `--otel`, or when an OTLP endpoint for traces is set (and the SDK is not disabled)."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if environ.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "none":
        return False
    return flag or any(environ.get(name) for name in ENDPOINT_VARIABLES)


def from_environment(flag: bool, *, run_id: str, seed: int) -> Tracing:
    """The tracer a run uses: OTLP export when asked for, else NO_TRACING (chaosproxy.telemetry.otlp not
    even imported)."""
    if not export_requested(flag):
        return NO_TRACING
    return OtlpTracing(run_id=run_id, seed=seed)


@contextlib.contextmanager
def exporting(*, run_id: str, seed: int) -> Iterator[Tracing]:
    """The tracer for a drill's runs (a root span each) when OTEL_* asks for export; flushed at the end."""
    tracing = from_environment(False, run_id=run_id, seed=seed)
    try:
        yield tracing
    finally:
        tracing.shutdown()


def propagated(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The variables that switch export on and shape it (OTEL_*, TRACEPARENT, TRACESTATE), for a
    process elsewhere (a Ray task) to export as this one would."""
    return {name: value for name, value in environ.items()
            if name.startswith("OTEL_") or name in ("TRACEPARENT", "TRACESTATE")}


class OtlpTracing(Tracing):
    """Spans recorded as plain data on the loop and exported over OTLP/HTTP by chaosproxy.telemetry.otlp's thread.

    Tracing of its own, not the global OpenTelemetry provider: an agent that embeds the proxy keeps its tracing.
    """

    on = True

    def __init__(self, *, run_id: str, seed: int, environ: Mapping[str, str] = os.environ) -> None:
        from chaosproxy.telemetry.otlp import Exporter, Settings, ids  # imported only when export is on

        # the run's id and seed on the resource: sent once per batch, not once per span
        self.settings = Settings.from_environment(environ, {"service.version": __version__, "chaosproxy.run_id": run_id,
                                                            "chaosproxy.seed": seed})
        self.sampler = Sampler.from_environment(environ)
        self.exporter = Exporter(self.settings, __version__)
        self.encoder = self.exporter.encoder
        self._ids = ids
        self._root_bound = self.sampler.bound
        self._records_roots = self.sampler.bound > MAX_ID64  # every call without a context
        self.run_id = run_id
        self.seed = seed
        self._default_parent = parse_traceparent(environ.get("TRACEPARENT"), environ.get("TRACESTATE"))
        self._versions: OrderedDict[str, str] = OrderedDict()  # session -> protocol version from initialize
        self._heads: dict[tuple[Any, ...], bytes] = {}  # what names a call's span -> its encoded head
        self._heads_bytes = 0
        ops.info("exporting OpenTelemetry spans over OTLP/HTTP to %s (service %s, sampler %s)",
                 redacted_url(self.settings.endpoint), self.settings.resource["service.name"],
                 self.sampler.description)

    def root_draw(self, headers: Iterable[tuple[bytes, bytes]], body: bytes) -> int | None:
        # no context in the environment, none in params._meta (a key may be written with \u escapes)
        if self._records_roots or self._default_parent is not None or body.find(b'"traceparent"') >= 0 or \
                body.find(b"\\u") >= 0:
            return None
        for name, _ in headers:
            if len(name) == 11 and name.lower() == b"traceparent":
                return None
        bits = getrandbits(192)
        return bits if bits >> 64 & MAX_ID64 < self._root_bound else 0

    def start(self, msg: Message, *, network: str, url: str | None = None,
              session_id: str | None = None, root: int = 0) -> dict[str, str]:
        try:
            return self._start(msg, network, url, session_id, root)
        except Exception:  # fail open: a bug in tracing leaves the call untraced, as the agent sent it
            ops.exception("OpenTelemetry: the span of a call over %s could not be opened; the call goes on "
                          "without it", network)
            msg.trace = None
            return {}

    def _start(self, msg: Message, network: str, url: str | None, session_id: str | None,
               root: int) -> dict[str, str]:
        """`start`'s work. What may fail is done before the body's `_meta` is changed (after it, only ids
        the grammar checked are read), so a failure leaves the call as the agent sent it."""
        header, header_state, version = _context_headers(msg.headers)
        body = msg.body
        # when the sampler may leave calls out, a body that cannot name a context in params._meta is parsed
        # only for a span the sampler keeps (a key may be written with \u escapes: a body with any is parsed)
        rpc = msg.rpc if body and (self._records_roots or msg.parsed or body.find(b'"traceparent"') >= 0
                                   or body.find(b"\\u") >= 0) else None
        meta = NO_META
        if rpc is not None and type(params := rpc.get("params")) is dict and type(found := params.get("_meta")) is dict:
            meta = found
        from_meta = parse_traceparent(meta["traceparent"], meta.get("tracestate")) if "traceparent" in meta else None
        from_header = parse_traceparent(header, header_state) if header is not None else None
        parent = from_meta or from_header or self._default_parent
        if parent is None:
            bits = root or getrandbits(192)  # the trace id, then the span id
            if bits >> 64 & MAX_ID64 >= self._root_bound:  # Sampler.records, inlined: most calls may end here
                return {}  # not recorded: the call goes on untouched
            if bits < 1 << 64 or not bits & MAX_ID64:  # all zeros is no id (one chance in 2**64)
                bits |= 1 << 64 | 1
            span_ids = (ROOT_IDS | bits >> 64 << 80 | bits & MAX_ID64).to_bytes(28, "big")  # chaosproxy.otlp.ids
            hexed = span_ids.hex()
            carrier = {"traceparent": f"00-{hexed[4:36]}-{hexed[40:]}-01"}
            trace_state = ""
        else:
            if not self.sampler.records_child(parent):
                return {}  # not recorded: the call goes on untouched, the agent's context (and decision) with it
            span_id = (getrandbits(64) or 1).to_bytes(8, "big")
            trace_state = parent.trace_state
            span_ids = self._ids(bytes.fromhex(parent.trace_id), span_id, bytes.fromhex(parent.span_id), trace_state)
            carrier = {"traceparent": f"00-{parent.trace_id}-{span_id.hex()}-01"}
            if trace_state:
                carrier["tracestate"] = trace_state
        if rpc is None and body:
            rpc = msg.rpc
        called = msg.a2a.method if msg.a2a is not None else a2a.jsonrpc_method(rpc) if rpc is not None else None
        if called is not None:  # A2A: its context goes in the traceparent header alone (no _meta in A2A)
            head = self._heads.get(a2a_key := ("a2a", network, url, called)) or \
                self._head(a2a_key, *_a2a_attributes(called, network, url))
            span = msg.trace = _Call(self, trace_state, span_ids, head,
                                     _request_id(rpc) if rpc is not None else {})
            if msg.a2a is not None:
                span.task(msg.a2a.task_id, None)
        elif rpc is not None and type(method := rpc.get("method")) is str:
            params = rpc.get("params")
            head = self._mcp_head(msg, method, params, meta, version, network, url, session_id)
            span = msg.trace = _Call(self, trace_state, span_ids, head, _request_id(rpc))
            if params is None or type(params) is dict:  # the MCP carrier: params._meta
                if params is None:
                    params = rpc["params"] = {}
                if meta:  # the agent's context, if any, is replaced by ours
                    params["_meta"] = {**{key: value for key, value in meta.items()
                                          if key not in ("traceparent", "tracestate")}, **carrier}
                else:
                    params["_meta"] = carrier  # shared with the caller, who only reads it
                msg.replace(rpc)
        else:
            head = self._heads.get(key := (network, url, _name(msg.http_method), msg.api, _name(msg.model))) or \
                self._head(key, *_other_attributes(msg, network, url))
            span = msg.trace = _Call(self, trace_state, span_ids, head, {})
        if from_meta is not None and from_header is not None and from_header[:2] != from_meta[:2]:
            span.rare().links = [(bytes.fromhex(from_header.trace_id), bytes.fromhex(from_header.span_id),
                                  {"chaosproxy.link": "http.traceparent"})]
        return carrier if msg.http_method is not None else {}

    def _mcp_head(self, msg: Message, method: str, params: Any, meta: Mapping[str, Any], version: str | None,
                  network: str, url: str | None, session_id: str | None) -> bytes:
        """The encoded name, kind and MCP attributes of a JSON-RPC request's span, made once for each
        method, tool, session, protocol version and upstream."""
        target = params.get("name") if type(params) is dict and method in ("tools/call", "prompts/get") else None
        target = _name(target)
        method = truncated(method, MAX_NAME)
        version = version or meta.get(META_VERSION)
        if method == "initialize" and type(params) is dict and isinstance(params.get("protocolVersion"), str):
            version = self._versions[truncated(msg.session, MAX_NAME)] = truncated(params["protocolVersion"], MAX_NAME)
            if len(self._versions) > MAX_SESSIONS:
                self._versions.popitem(last=False)
        if not version and self._versions:
            version = self._versions.get(truncated(msg.session, MAX_NAME))
        version, session_id = _name(version), _name(session_id)
        key = (network, url, method, target, session_id, version)
        head = self._heads.get(key)
        if head is None:
            head = self._head(key, *_mcp_attributes(network, url, method, target, session_id, version))
        return head

    def _head(self, key: tuple[Any, ...], name: str, attributes: dict[str, Any]) -> bytes:
        if len(self._heads) >= MAX_HEADS or self._heads_bytes >= MAX_HEADS_BYTES:
            self._heads.clear()
            self._heads_bytes = 0
        head = self._heads[key] = self.encoder.head(name, CLIENT, attributes)
        # its key counts too: the URL in it holds the agent's path
        self._heads_bytes += len(head) + sum(len(part) for part in key if type(part) is str)
        return head

    def run_span(self, name: str, attributes: Mapping[str, Any]) -> RunSpan:
        parent = self._default_parent
        trace_id = bytes.fromhex(parent.trace_id) if parent is not None else _new_id(16)
        span = SpanData(name, KIND["INTERNAL"], trace_id, _new_id(8),
                        bytes.fromhex(parent.span_id) if parent is not None else b"",
                        parent.trace_state if parent is not None else "", time.time_ns(),
                        {key: value for key, value in attributes.items() if value is not None})
        sampled = self.sampler.records(int.from_bytes(trace_id[8:])) if parent is None else \
            self.sampler.records_child(parent)
        return _RunSpan(self, span, sampled=sampled)

    def shutdown(self) -> None:
        self.exporter.shutdown()  # exports what is queued


class Parent(NamedTuple):
    """A W3C trace context the agent (or a drill) gave: the parent of the proxy's span."""

    trace_id: str
    span_id: str
    sampled: bool
    trace_state: str


def parse_traceparent(traceparent: Any, tracestate: Any) -> Parent | None:
    """The context a W3C `traceparent` names, or None when there is none (or it is malformed)."""
    if not isinstance(traceparent, str):
        return None
    match = TRACEPARENT.fullmatch(traceparent.strip())
    if match is None:
        return None
    version, trace_id, span_id, flags, rest = match.groups()
    if version == "ff" or (version == "00" and rest) or trace_id == ZERO_TRACE or span_id == ZERO_SPAN:
        return None
    return Parent(trace_id, span_id, int(flags, 16) & 1 == 1, valid_tracestate(tracestate))


def valid_tracestate(tracestate: Any) -> str:
    """A `tracestate` (the agent's, or $TRACESTATE) as it may go upstream in a header line: its members,
    comma-separated, or "" when it breaks the W3C grammar or limits (TRACESTATE_MEMBER)."""
    if type(tracestate) is not str or not tracestate or len(tracestate) > MAX_TRACESTATE:
        return ""
    members = [member for item in tracestate.split(",") if (member := item.strip(" \t"))]
    if len(members) > MAX_TRACESTATE_MEMBERS or not all(map(TRACESTATE_MEMBER.fullmatch, members)):
        return ""
    return ",".join(members)


class Sampler:
    """OTEL_TRACES_SAMPLER as the SDK reads it: always_on, always_off, traceidratio (OTEL_TRACES_SAMPLER_ARG,
    by the trace id's low 64 bits, so every hop of a trace decides alike), and parentbased_* (the default,
    parentbased_always_on: a call with a parent context follows its sampled flag)."""

    def __init__(self, name: str = "parentbased_always_on", ratio: float = 1.0) -> None:
        self.parent_based = name.startswith("parentbased_")
        root = name.removeprefix("parentbased_")
        self.ratio = 1.0 if root == "always_on" else 0.0 if root == "always_off" else ratio
        self.bound = round(self.ratio * (1 << 64))
        self.description = name if root != "traceidratio" else f"{name}({self.ratio:g})"

    @classmethod
    def from_environment(cls, environ: Mapping[str, str]) -> Sampler:
        name = (environ.get("OTEL_TRACES_SAMPLER") or "parentbased_always_on").strip().lower()
        if name.removeprefix("parentbased_") not in ("always_on", "always_off", "traceidratio"):
            ops.warning("OTEL_TRACES_SAMPLER=%r is not one of always_on, always_off, traceidratio, "
                        "parentbased_{always_on,always_off,traceidratio}; using parentbased_always_on", name)
            return cls()
        argument = (environ.get("OTEL_TRACES_SAMPLER_ARG") or "").strip()
        try:
            ratio = float(argument) if argument else 1.0
        except ValueError:
            ratio = -1.0
        if not 0.0 <= ratio <= 1.0:
            ops.warning("OTEL_TRACES_SAMPLER_ARG=%r is not a ratio between 0 and 1; using 1.0", argument)
            ratio = 1.0
        return cls(name, ratio)

    def records(self, low_bits: int) -> bool:
        """Whether a span with no parent is recorded, given the low 64 bits of its trace id."""
        return low_bits < self.bound

    def records_child(self, parent: Parent) -> bool:
        """Whether a span under `parent` (the agent's context) is recorded."""
        return parent.sampled if self.parent_based else self.records(int(parent.trace_id[16:], 16))


class _Call(CallTrace):
    """One call's span: what it needs to be encoded when it ends (its ids and head already are), the
    attributes that vary from call to call, and, made on demand, its faults, child spans, events and links."""

    __slots__ = ("tracing", "trace_state", "ids", "head", "start_ns", "end_ns", "attributes", "more", "error")

    def __init__(self, tracing: OtlpTracing, trace_state: str, span_ids: bytes, head: bytes,
                 attributes: dict[str, Any]) -> None:
        self.tracing = tracing
        self.trace_state = trace_state
        self.ids = span_ids  # encoded (chaosproxy.otlp.ids): the trace id at [2:18], the span id at [20:28]
        self.head = head  # encoded name, kind and the attributes the call shares with others like it
        self.start_ns = time.time_ns()
        self.end_ns = 0  # set when the call ends: then the exporter's thread has it, nothing changes
        self.attributes = attributes  # the others
        self.more: _Faulted | None = None
        self.error: str | None = None  # the status message when the span's status is ERROR

    def rare(self) -> _Faulted:
        if self.more is None:
            self.more = _Faulted()
        return self.more

    def fault(self, fields: Mapping[str, Any], action: Action) -> None:
        if self.end_ns:
            return  # too late for this span: it is the exporter's
        attributes = self.attributes
        more = self.rare()
        failure = _failure(action)
        if failure is not None:  # (recorded however many faults were listed before)
            more.failure = failure
            more.failed_by = f"chaosproxy fault {fields.get(Key.FAULT)} (rule {fields.get(Key.RULE)})"
        if len(more.faults) >= MAX_FAULTS:  # (a stream whose every event a fault hit: its span stays small)
            return
        fault_type = str(fields.get(Key.FAULT))
        faults = more.faults = [*more.faults, fields]
        for key, field in (("type", Key.FAULT), ("rule", Key.RULE), ("component", Key.COMPONENT),
                           ("level", Key.LEVEL)):
            # one string, comma-separated when several fired: trace viewers search strings, not arrays
            attributes[f"chaosproxy.fault.{key}"] = ",".join(str(f.get(field)) for f in faults)
        now = time.time_ns()
        more.events = [*(more.events or ()), (now, "chaosproxy.fault", _event_attributes(fields))]
        tracing = self.tracing
        attributes["chaosproxy.seed"] = tracing.seed
        attributes["chaosproxy.run_id"] = tracing.run_id
        if failure is not None and isinstance(action, Reply | Rewrite):
            attributes["rpc.response.status_code"] = failure
        child = SpanData(f"chaosproxy.fault {fault_type}", KIND["INTERNAL"], self.ids[2:18], _new_id(8),
                         self.ids[20:28], self.trace_state, now, {
                             "chaosproxy.fault.type": fault_type, "chaosproxy.fault.rule": str(fields.get(Key.RULE)),
                             "chaosproxy.fault.component": str(fields.get(Key.COMPONENT)),
                             "chaosproxy.fault.level": str(fields.get(Key.LEVEL)),
                             "chaosproxy.fault.action": str(fields.get(Key.ACTION)),
                             "chaosproxy.seed": tracing.seed, "chaosproxy.run_id": tracing.run_id})
        if failure is not None:
            child.error = more.failed_by
        waited = _injected_wait(action)
        if waited is None:
            more.open_children.append(child)
        else:
            child.end_ns = now + int(waited * 1e9)
            tracing.exporter.add(child)

    def task(self, task_id: str | None, state: str | None) -> None:
        if self.end_ns:
            return
        if task_id is not None and _TASK_ID.fullmatch(task_id):  # the remote agent's: checked before it goes out
            self.attributes["a2a.task.id"] = task_id
        if state is not None:
            self.attributes["a2a.task.state"] = state

    def end(self, outcome: str = Outcome.OK, *, status: int | None = None,
            reply: Mapping[str, Any] | None = None) -> None:
        if self.end_ns:
            return
        attributes = self.attributes
        more = self.more
        if outcome != Outcome.OK:
            attributes["chaosproxy.outcome"] = outcome
        error_type: str | None = None
        if status is not None:
            attributes["http.response.status_code"] = status
            if status >= 400:
                error_type = str(status)
        if reply is not None:
            error = reply.get("error")
            if isinstance(error, dict) and "code" in error:
                error_type = truncated(str(error["code"]), MAX_NAME)  # upstream's: bounded as a name is
                attributes["rpc.response.status_code"] = error_type
            elif isinstance(result := reply.get("result"), dict) and result.get("isError") is True:
                error_type = error_type or "tool_error"
        if more is not None:
            error_type = error_type or more.failure
        error_type = error_type or (outcome if outcome in FAILED_OUTCOMES else None)
        if error_type is not None:
            attributes["error.type"] = error_type
            self.error = (more.failed_by if more is not None else "") or outcome
        self.end_ns = now = time.time_ns()
        exporter = self.tracing.exporter
        if more is not None:
            for child in more.open_children:
                child.end_ns = now
                exporter.add(child)
        exporter.add(self)

    def encoded(self, encoder: Encoder) -> bytes:
        more = self.more
        return encoder.span(self.ids, self.head, self.start_ns, self.end_ns, encoder.attributes(self.attributes),
                            more.events if more is not None else None, more.links if more is not None else None,
                            self.error)


class _Faulted:
    """What few calls have: faults that fired on it (their log fields), the events and child spans they
    made, the link to a second context the agent gave."""

    __slots__ = ("faults", "failure", "failed_by", "open_children", "events", "links")

    def __init__(self) -> None:
        self.faults: list[Mapping[str, Any]] = []
        self.failure: str | None = None  # error.type of a fault that failed the call
        self.failed_by = ""  # and which fault it was
        self.open_children: list[SpanData] = []  # hangs with no release end with the call
        self.events: list[tuple[int, str, Mapping[str, Any]]] | None = None
        self.links: list[tuple[bytes, bytes, Mapping[str, Any]]] | None = None


class _RunSpan(RunSpan):
    def __init__(self, tracing: OtlpTracing, span: SpanData, *, sampled: bool) -> None:
        self.tracing = tracing
        self.span = span
        self.sampled = sampled
        self.trace_id = span.trace_id.hex()
        self.traceparent = f"00-{self.trace_id}-{span.span_id.hex()}-{'01' if sampled else '00'}"

    def environment(self, baggage: Mapping[str, Any]) -> dict[str, str]:
        """TRACEPARENT and BAGGAGE (W3C formats) for the run's agent and proxy."""
        from urllib.parse import quote

        entries = ",".join(f"{key}={quote(str(value), safe='')}" for key, value in baggage.items()
                           if value is not None)
        return {"TRACEPARENT": self.traceparent, "BAGGAGE": entries}

    def end(self, status: str) -> None:
        span = self.span
        span.attributes["chaosproxy.run.status"] = status
        if status != "passed":
            span.error = f"the run {status}"
        span.end_ns = time.time_ns()
        if self.sampled:
            self.tracing.exporter.add(span)


@functools.lru_cache(maxsize=256)
def _server(url: str) -> tuple[str | None, int]:
    """The address and port of an upstream URL (a few URLs, each seen again and again)."""
    server = urlsplit(url)
    return server.hostname, server.port or (443 if server.scheme == "https" else 80)


def _new_id(size: int) -> bytes:
    """A random trace (16 bytes) or span (8 bytes) id, never all zeros."""
    return (getrandbits(size * 8) or 1).to_bytes(size, "big")


def _context_headers(headers: Mapping[str, str]) -> tuple[str | None, str | None, str | None]:
    """The `traceparent`, `tracestate` and `MCP-Protocol-Version` headers (the first of each, but every
    `tracestate` line, combined as W3C says), in one pass over the raw pairs when the adapter's headers
    have them (adapters.http.HeaderView)."""
    pairs = getattr(headers, "pairs", None)
    if pairs is None:
        return headers.get("traceparent"), headers.get("tracestate"), headers.get("MCP-Protocol-Version")
    traceparent = tracestate = version = None
    for key, value in pairs:
        if len(key) in CONTEXT_HEADER_LENGTHS:
            key = key.lower()
            if key == b"traceparent":
                traceparent = traceparent or value.decode("latin-1")
            elif key == b"tracestate":
                state = value.decode("latin-1")
                tracestate = state if tracestate is None else f"{tracestate},{state}"
            elif key == b"mcp-protocol-version":
                version = version or value.decode("latin-1")
    return traceparent, tracestate, version


def _mcp_attributes(network: str, url: str | None, method: str, target: str | None, session_id: str | None,
                    version: str | None) -> tuple[str, dict[str, Any]]:
    """The MCP conventions' name and attributes of a JSON-RPC request's span (but its request id)."""
    attributes: dict[str, Any] = {"network.transport": network}
    if url is not None:
        attributes["server.address"], attributes["server.port"] = _server(url)
    attributes["mcp.method.name"] = method
    if method == "tools/call":
        attributes["gen_ai.operation.name"] = "execute_tool"
        if target is not None:
            attributes["gen_ai.tool.name"] = target
    elif method == "prompts/get" and target is not None:
        attributes["gen_ai.prompt.name"] = target
    if session_id is not None:
        attributes["mcp.session.id"] = session_id
    if version is not None:
        attributes["mcp.protocol.version"] = version
    return (f"{method} {target}" if target is not None else method), attributes


def _a2a_attributes(method: str, network: str, url: str | None) -> tuple[str, dict[str, Any]]:
    """The name and attributes of an A2A call's span (`a2a.method.name`, as v1.0 names the method)."""
    attributes: dict[str, Any] = {"network.transport": network, "a2a.method.name": method}
    if url is not None:
        attributes["server.address"], attributes["server.port"] = _server(url)
    return method, attributes


def _name(value: Any) -> str | None:
    """A name an agent or upstream gave (a tool's, a model's, a session's...), bounded; None when it is no string."""
    return truncated(value, MAX_NAME) if type(value) is str else None


def _request_id(rpc: Mapping[str, Any]) -> dict[str, Any]:
    """The span attribute of a JSON-RPC request's id (the agent's: bounded), if it has one."""
    return {"jsonrpc.request.id": truncated(str(rpc["id"]), MAX_NAME)} if "id" in rpc else {}


_TASK_ID = re.compile(r"[\x21-\x7e]{1,128}")  # what a task id may be in a span: printable, bounded


def _other_attributes(msg: Message, network: str, url: str | None) -> tuple[str, dict[str, Any]]:
    """The name and attributes of a model-API call's span (GenAI conventions) or a plain HTTP call's."""
    attributes: dict[str, Any] = {"network.transport": network}
    if url is not None:
        attributes["server.address"], attributes["server.port"] = _server(url)
    if msg.api is not None:
        return _genai_attributes(attributes, msg), attributes
    method = attributes["http.request.method"] = _name(msg.http_method)
    if url is not None:
        attributes["url.full"] = redacted_url(url)
    return method or "call", attributes


def _genai_attributes(attributes: dict[str, Any], msg: Message) -> str:
    """The GenAI conventions' attributes for a model-API call (LLM-gateway mode); returns the span's name."""
    attributes["gen_ai.operation.name"] = "chat"
    attributes["gen_ai.provider.name"] = "anthropic" if msg.api == ANTHROPIC else "openai"
    attributes["chaosproxy.protocols.llm.api"] = msg.api
    attributes["http.request.method"] = _name(msg.http_method)
    model = _name(msg.model)
    if model is not None:
        attributes["gen_ai.request.model"] = model
        return f"chat {model}"
    return "chat"


def _failure(action: Action) -> str | None:
    """The error.type of a call this action fails (None when it does not: a stub result, a delay)."""
    match action:
        case Respond(status=status) if status >= 400:
            return str(status)
        case Reply(message={"error": {"code": code}}) | Rewrite(message={"error": {"code": code}}):
            return str(code)
        case Reply(message={"error": _}) | Rewrite(message={"error": _}):
            return "error"
        case Hang(release_after=None):
            return "hang"
        case Reset():
            return "reset"
        case Truncate():
            return "truncated"
        case CutStream():
            return "stream_cut"
        case Garble():
            return "malformed"
    return None


def _injected_wait(action: Action) -> float | None:
    """How long the fault held the call (None: until the call ends, a hang with no release)."""
    match action:
        case Delay(seconds=seconds) | Reply(delay=seconds):
            return seconds
        case Hang(release_after=release_after):
            return release_after
    return 0.0


def _event_attributes(fields: Mapping[str, Any]) -> dict[str, Any]:
    """A log line's fields as span event attributes: scalars as they are (a string, a name the agent or
    upstream may have given, bounded), structures as JSON text (cut by the exporter's value limit)."""
    attributes: dict[str, Any] = {}
    for key, value in fields.items():
        if value is None:
            continue
        if isinstance(value, str):
            attributes[key] = truncated(value, MAX_NAME)
        elif isinstance(value, bool | int | float):
            attributes[key] = value
        else:
            attributes[key] = orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS, default=str).decode()
    return attributes
