"""Tracing with export on (`OtlpTracing`): a call's span recorded as plain data on the event loop,
its name, kind and repeating attributes encoded once and cached (bounded in entries and bytes), named by
the OpenTelemetry MCP, GenAI and HTTP conventions, with the faults that fired on it; queued when the call
ends for chaosproxy.telemetry.otlp's thread to encode and send. `SpanData` is a span other than a call's."""

from __future__ import annotations

import functools
import os
import re
import time
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from random import getrandbits
from typing import TYPE_CHECKING, Any
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
from chaosproxy.telemetry.tracing.context import parse_traceparent
from chaosproxy.telemetry.tracing.sampler import Sampler
from chaosproxy.telemetry.tracing.tracer import CallTrace, RunSpan, Tracing

if TYPE_CHECKING:
    from chaosproxy.engine.message import Message
    from chaosproxy.telemetry.otlp import Encoder

META_VERSION = "io.modelcontextprotocol/protocolVersion"  # 2026-era requests carry their version here
# call outcomes that fail a call on their own: not "fault_response" (it may be a stub result), nor
# "client_disconnected" (an agent may hang up on a stream once it has read its answer)
FAILED_OUTCOMES = frozenset({Outcome.UPSTREAM_ERROR, Outcome.HANG, Outcome.RESET, Outcome.TRUNCATED,
                             Outcome.STREAM_CUT, Outcome.STREAM_IDLE, Outcome.NO_ROUTE, Outcome.UNANSWERED})
MAX_SESSIONS = 10_000  # protocol versions remembered from `initialize`, oldest forgotten first
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
