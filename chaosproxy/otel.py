"""Faults inside the agent's own traces: one OpenTelemetry span per proxied call, faults on it.

Optional (`pip install 'chaosproxy[otel]'`). Nothing here imports OpenTelemetry until export is
switched on, by `--otel` or by the standard variables (`OTEL_EXPORTER_OTLP_ENDPOINT`,
`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`); every other `OTEL_*` variable (service name, resource
attributes, headers, sampler, batch settings) is read by the SDK itself. Switched off, the proxy
holds `NO_TRACING` and its adapters pay one attribute check (`tracing.on`) per call.

Spans follow the OpenTelemetry MCP conventions (`tools/call search`, kind CLIENT, `mcp.method.name`,
`gen_ai.tool.name`, ...) for JSON-RPC requests and the HTTP client conventions for other HTTP calls.
The parent is the agent's context: `params._meta.traceparent` (the MCP carrier, the only one on
stdio), else the HTTP `traceparent` header, else `$TRACEPARENT` (a drill's run); when the header
names another context than `_meta`, it becomes a link. The proxy's own context goes upstream in
both carriers, so the tool server's spans nest under the proxy's.

A fired fault shows three ways, because viewers differ (Langfuse ignores span events): attributes
on the call's span (`chaosproxy.fault.*`, status ERROR when the fault failed the call), a child span
`chaosproxy.fault {type}` lasting as long as the delay or hang it injected, and a span event with
the fields of the fault's log line.
"""

from __future__ import annotations

import functools
import os
import time
from collections import OrderedDict
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import orjson

from chaosproxy import __version__
from chaosproxy.actions import Action, CutStream, Delay, Garble, Hang, Reply, Reset, Respond, Rewrite, Truncate
from chaosproxy.llm import ANTHROPIC
from chaosproxy.log import ops

if TYPE_CHECKING:
    from chaosproxy.message import Message

ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
META_VERSION = "io.modelcontextprotocol/protocolVersion"  # 2026-era requests carry their version here
# call outcomes that fail a call on their own: not "fault_response" (it may be a stub result), nor
# "client_disconnected" (an agent may hang up on a stream once it has read its answer)
FAILED_OUTCOMES = frozenset({"upstream_error", "hang", "reset", "truncated", "stream_cut", "stream_idle",
                             "no_route", "unanswered"})
MAX_SESSIONS = 10_000  # protocol versions remembered from `initialize`, oldest forgotten first


class OtelUnavailable(RuntimeError):
    """Export was asked for but the OpenTelemetry SDK is not installed."""


class CallTrace:
    """The span of one proxied call. The switched-off tracer never makes one."""

    def fault(self, fields: Mapping[str, Any], action: Action) -> None:
        """A fault fired on this call; `fields` are its log line's."""

    def end(self, outcome: str = "ok", *, status: int | None = None, reply: Mapping[str, Any] | None = None) -> None:
        """The call is over: `outcome` as in the call log, the HTTP `status`, the JSON-RPC `reply`."""


class Tracing:
    """No tracing: what the proxy holds unless export is on. Adapters check `on` and go no further."""

    on = False

    def start(self, msg: Message, *, network: str, url: str | None = None,
              session_id: str | None = None) -> dict[str, str]:
        """Open the span of the call `msg` starts and put the proxy's context into its `_meta`.

        Returns the HTTP headers to forward in place of the agent's `traceparent`/`tracestate`.
        `network` is `tcp` or `pipe`; `url` the upstream URL of an HTTP call (the real server's
        address); `session_id` the MCP session (the `Mcp-Session-Id`, or a legacy `sessionId`).
        """
        return {}

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
    """The tracer a run uses: OTLP export when asked for, else NO_TRACING.

    Raises OtelUnavailable when `--otel` was given without the `[otel]` extra; an endpoint variable
    alone (often set for the whole machine) only warns, and the proxy runs without tracing.
    """
    if not export_requested(flag):
        return NO_TRACING
    try:
        return OtlpTracing(run_id=run_id, seed=seed)
    except ImportError as exc:
        message = f"OpenTelemetry export needs the [otel] extra ({exc}): pip install 'chaosproxy[otel]'"
        if flag:
            raise OtelUnavailable(message) from None
        ops.warning("%s; running without tracing", message)
        return NO_TRACING


class OtlpTracing(Tracing):
    """Spans exported over OTLP/HTTP with the SDK's batch span processor, on a provider of its own.

    A provider of its own, not the global one: an agent that embeds the proxy keeps its tracing.
    """

    on = True

    def __init__(self, *, run_id: str, seed: int) -> None:
        from opentelemetry import trace
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import SERVICE_NAME, SERVICE_VERSION, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        protocol = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        if protocol not in (None, "", "http/protobuf"):
            ops.warning("OTLP protocol %r is not supported; exporting http/protobuf", protocol)
        # the run's id and seed on the resource: sent once per batch, not once per span
        resource = Resource.create({SERVICE_VERSION: __version__, "chaosproxy.run_id": run_id, "chaosproxy.seed": seed})
        if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
            resource = resource.merge(Resource({SERVICE_NAME: "chaosproxy"}))
        resource = _resource_hashed_once(Resource)(resource.attributes, resource.schema_url)
        self.provider = TracerProvider(resource=resource, shutdown_on_exit=False)  # sampler: OTEL_TRACES_SAMPLER
        self.provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))  # both read OTEL_* themselves
        self.tracer = self.provider.get_tracer("chaosproxy", __version__)
        self.run_id = run_id
        self.seed = seed
        self._trace = trace
        self._propagator = TraceContextTextMapPropagator()
        self._default_parent = self._context(os.environ.get("TRACEPARENT"), os.environ.get("TRACESTATE"))
        self._versions: OrderedDict[str, str] = OrderedDict()  # session -> protocol version from initialize
        ops.info("exporting OpenTelemetry spans over OTLP/HTTP (service %s)", resource.attributes.get(SERVICE_NAME))

    def start(self, msg: Message, *, network: str, url: str | None = None,
              session_id: str | None = None) -> dict[str, str]:
        trace = self._trace
        rpc = msg.rpc if msg.body else None
        method = rpc.get("method") if rpc is not None else None
        params = rpc.get("params") if rpc is not None else None
        meta = params.get("_meta") if isinstance(params, dict) else None
        meta = meta if isinstance(meta, dict) else {}
        from_meta = self._context(meta.get("traceparent"), meta.get("tracestate"))
        from_header = self._context(msg.headers.get("traceparent"), msg.headers.get("tracestate"))
        parent = from_meta or from_header or self._default_parent
        links = None
        if from_meta is not None and from_header is not None:
            header_span = trace.get_current_span(from_header).get_span_context()
            if header_span != trace.get_current_span(from_meta).get_span_context():
                links = [trace.Link(header_span, {"chaosproxy.link": "http.traceparent"})]
        attributes: dict[str, Any] = {"network.transport": network}
        if url is not None:
            server = urlsplit(url)
            attributes["server.address"] = server.hostname
            attributes["server.port"] = server.port or (443 if server.scheme == "https" else 80)
        if isinstance(method, str):
            name = self._mcp_attributes(attributes, msg, rpc, params, meta, session_id)
        elif msg.api is not None:
            name = _genai_attributes(attributes, msg)
        else:
            name = msg.http_method or "call"
            attributes["http.request.method"] = msg.http_method
            if url is not None:
                attributes["url.full"] = url
        span = self.tracer.start_span(name, context=parent, kind=trace.SpanKind.CLIENT, attributes=attributes,
                                      links=links)
        msg.trace = _Span(self, span)
        context = span.get_span_context()
        carrier = {"traceparent": f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"}
        if context.trace_state:
            carrier["tracestate"] = context.trace_state.to_header()
        if isinstance(method, str) and (params is None or isinstance(params, dict)):
            meta = {key: value for key, value in meta.items() if key not in ("traceparent", "tracestate")}
            msg.replace({**rpc, "params": {**(params or {}), "_meta": {**meta, **carrier}}})
        return carrier if msg.http_method is not None else {}

    def _mcp_attributes(self, attributes: dict[str, Any], msg: Message, rpc: dict[str, Any],
                        params: Any, meta: dict[str, Any], session_id: str | None) -> str:
        """The MCP conventions' attributes for a JSON-RPC request; returns the span's name."""
        method = rpc["method"]
        attributes["mcp.method.name"] = method
        target = params.get("name") if isinstance(params, dict) else None
        target = target if isinstance(target, str) else None
        if method == "tools/call":
            attributes["gen_ai.operation.name"] = "execute_tool"
            if target is not None:
                attributes["gen_ai.tool.name"] = target
        elif method == "prompts/get" and target is not None:
            attributes["gen_ai.prompt.name"] = target
        else:
            target = None
        if "id" in rpc:
            attributes["jsonrpc.request.id"] = str(rpc["id"])
        if session_id is not None:
            attributes["mcp.session.id"] = session_id
        version = msg.headers.get("MCP-Protocol-Version") or meta.get(META_VERSION)
        if method == "initialize" and isinstance(params, dict) and isinstance(params.get("protocolVersion"), str):
            version = self._versions[msg.session] = params["protocolVersion"]
            if len(self._versions) > MAX_SESSIONS:
                self._versions.popitem(last=False)
        version = version or self._versions.get(msg.session)
        if isinstance(version, str):
            attributes["mcp.protocol.version"] = version
        return f"{method} {target}" if target is not None else method

    def _context(self, traceparent: Any, tracestate: Any) -> Any:
        """The context a W3C traceparent names, or None when there is none (or it is malformed)."""
        if not isinstance(traceparent, str):
            return None
        carrier = {"traceparent": traceparent}
        if isinstance(tracestate, str):
            carrier["tracestate"] = tracestate
        context = self._propagator.extract(carrier)
        return context if self._trace.get_current_span(context).get_span_context().is_valid else None

    def run_span(self, name: str, attributes: Mapping[str, Any]) -> RunSpan:
        span = self.tracer.start_span(name, context=self._default_parent, kind=self._trace.SpanKind.INTERNAL,
                                      attributes={key: value for key, value in attributes.items() if value is not None})
        return _RunSpan(self, span)

    def shutdown(self) -> None:
        self.provider.shutdown()  # flushes the batch processor


class _Span(CallTrace):
    """One call's span, its fault child spans and events."""

    __slots__ = ("tracing", "span", "faults", "failure", "failed_by", "open_children")

    def __init__(self, tracing: OtlpTracing, span: Any) -> None:
        self.tracing = tracing
        self.span = span
        self.faults: list[Mapping[str, Any]] = []
        self.failure: str | None = None  # error.type of a fault that failed the call
        self.failed_by = ""  # and which fault it was
        self.open_children: list[Any] = []  # hangs with no release end with the call

    def fault(self, fields: Mapping[str, Any], action: Action) -> None:
        trace = self.tracing._trace
        fault_type = str(fields.get("fault"))
        self.faults.append(fields)
        for key, field in (("type", "fault"), ("rule", "rule"), ("component", "component"), ("level", "level")):
            # one string, comma-separated when several fired: trace viewers search strings, not arrays
            self.span.set_attribute(f"chaosproxy.fault.{key}", ",".join(str(f.get(field)) for f in self.faults))
        self.span.add_event("chaosproxy.fault", _event_attributes(fields))
        if len(self.faults) == 1:
            self.span.set_attributes({"chaosproxy.seed": self.tracing.seed, "chaosproxy.run_id": self.tracing.run_id})
        failure = _failure(action)
        if failure is not None:
            self.failure = failure
            self.failed_by = f"chaosproxy fault {fault_type} (rule {fields.get('rule')})"
            if isinstance(action, Reply | Rewrite):
                self.span.set_attribute("rpc.response.status_code", failure)
        attributes = {"chaosproxy.fault.type": fault_type, "chaosproxy.fault.rule": str(fields.get("rule")),
                      "chaosproxy.fault.component": str(fields.get("component")),
                      "chaosproxy.fault.level": str(fields.get("level")),
                      "chaosproxy.fault.action": str(fields.get("action")),
                      "chaosproxy.seed": self.tracing.seed, "chaosproxy.run_id": self.tracing.run_id}
        now = time.time_ns()
        child = self.tracing.tracer.start_span(f"chaosproxy.fault {fault_type}", kind=trace.SpanKind.INTERNAL,
                                               context=trace.set_span_in_context(self.span),
                                               attributes=attributes, start_time=now)
        if failure is not None:
            child.set_status(trace.Status(trace.StatusCode.ERROR, self.failed_by))
        waited = _injected_wait(action)
        if waited is None:
            self.open_children.append(child)
        else:
            child.end(end_time=now + int(waited * 1e9))

    def end(self, outcome: str = "ok", *, status: int | None = None, reply: Mapping[str, Any] | None = None) -> None:
        trace = self.tracing._trace
        span = self.span
        if outcome != "ok":
            span.set_attribute("chaosproxy.outcome", outcome)
        error_type: str | None = None
        if status is not None:
            span.set_attribute("http.response.status_code", status)
            if status >= 400:
                error_type = str(status)
        error = reply.get("error") if reply is not None else None
        if isinstance(error, dict) and "code" in error:
            error_type = str(error["code"])
            span.set_attribute("rpc.response.status_code", error_type)
        elif reply is not None and isinstance(result := reply.get("result"), dict) and result.get("isError") is True:
            error_type = error_type or "tool_error"
        error_type = error_type or self.failure or (outcome if outcome in FAILED_OUTCOMES else None)
        if error_type is not None:
            span.set_attribute("error.type", error_type)
            span.set_status(trace.Status(trace.StatusCode.ERROR, self.failed_by or outcome))
        now = time.time_ns()
        for child in self.open_children:
            child.end(end_time=now)
        span.end(end_time=now)


class _RunSpan(RunSpan):
    def __init__(self, tracing: OtlpTracing, span: Any) -> None:
        self.tracing = tracing
        self.span = span
        context = span.get_span_context()
        self.trace_id = f"{context.trace_id:032x}" if context.is_valid else None
        self.traceparent = f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"

    def environment(self, baggage: Mapping[str, Any]) -> dict[str, str]:
        """TRACEPARENT and BAGGAGE (W3C formats) for the run's agent and proxy."""
        from urllib.parse import quote

        entries = ",".join(f"{key}={quote(str(value), safe='')}" for key, value in baggage.items()
                           if value is not None)
        return {"TRACEPARENT": self.traceparent, "BAGGAGE": entries}

    def end(self, status: str) -> None:
        trace = self.tracing._trace
        self.span.set_attribute("chaosproxy.run.status", status)
        if status != "passed":
            self.span.set_status(trace.Status(trace.StatusCode.ERROR, f"the run {status}"))
        self.span.end()


def _resource_hashed_once(base: type) -> type:
    """A Resource that computes its hash once. The OTLP encoder groups every span of a batch by its
    resource, and Resource.__hash__ serialises all the attributes to JSON each time (~10 µs a span)."""
    class Resource(base):  # type: ignore[misc,valid-type]
        @functools.cached_property
        def _hash(self) -> int:
            return super().__hash__()

        def __hash__(self) -> int:
            return self._hash
    return Resource


def _genai_attributes(attributes: dict[str, Any], msg: Message) -> str:
    """The GenAI conventions' attributes for a model-API call (LLM-gateway mode); returns the span's name."""
    attributes["gen_ai.operation.name"] = "chat"
    attributes["gen_ai.provider.name"] = "anthropic" if msg.api == ANTHROPIC else "openai"
    attributes["chaosproxy.llm.api"] = msg.api
    attributes["http.request.method"] = msg.http_method
    if msg.model is not None:
        attributes["gen_ai.request.model"] = msg.model
        return f"chat {msg.model}"
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
    """A log line's fields as span event attributes: scalars as they are, structures as JSON text."""
    attributes: dict[str, Any] = {}
    for key, value in fields.items():
        if value is None:
            continue
        if isinstance(value, bool | int | float | str):
            attributes[key] = value
        else:
            attributes[key] = orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS, default=str).decode()
    return attributes
