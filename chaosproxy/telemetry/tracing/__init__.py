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

The package, a module per concern: `tracer` (the interface adapters call, and NO_TRACING), `export`
(whether spans are exported, from the flag and the environment), `spans` (OtlpTracing: calls' spans and
their attributes), `context` (W3C traceparent and tracestate), `sampler` (OTEL_TRACES_SAMPLER).
May import: the engine's actions, protocols, and the rest of telemetry; the engine's message only for types.
"""

from __future__ import annotations

from chaosproxy.telemetry.tracing.context import (
    MAX_TRACESTATE,
    MAX_TRACESTATE_MEMBERS,
    TRACEPARENT,
    TRACESTATE_MEMBER,
    ZERO_SPAN,
    ZERO_TRACE,
    Parent,
    parse_traceparent,
    valid_tracestate,
)
from chaosproxy.telemetry.tracing.export import (
    ENDPOINT_VARIABLES,
    export_requested,
    exporting,
    from_environment,
    propagated,
)
from chaosproxy.telemetry.tracing.sampler import Sampler
from chaosproxy.telemetry.tracing.spans import (
    CLIENT,
    CONTEXT_HEADER_LENGTHS,
    FAILED_OUTCOMES,
    KIND,
    MAX_FAULTS,
    MAX_HEADS,
    MAX_HEADS_BYTES,
    MAX_ID64,
    MAX_NAME,
    MAX_SESSIONS,
    META_VERSION,
    NO_META,
    ROOT_IDS,
    OtlpTracing,
    SpanData,
)
from chaosproxy.telemetry.tracing.tracer import (
    NO_TRACING,
    CallTrace,
    RunSpan,
    Tracing,
)

__all__ = ["CLIENT", "CONTEXT_HEADER_LENGTHS", "CallTrace", "ENDPOINT_VARIABLES", "FAILED_OUTCOMES", "KIND",
           "MAX_FAULTS", "MAX_HEADS", "MAX_HEADS_BYTES", "MAX_ID64", "MAX_NAME", "MAX_SESSIONS",
           "MAX_TRACESTATE", "MAX_TRACESTATE_MEMBERS", "META_VERSION", "NO_META", "NO_TRACING", "OtlpTracing",
           "Parent", "ROOT_IDS", "RunSpan", "Sampler", "SpanData", "TRACEPARENT", "TRACESTATE_MEMBER",
           "Tracing", "ZERO_SPAN", "ZERO_TRACE", "export_requested", "exporting", "from_environment",
           "parse_traceparent", "propagated", "valid_tracestate"]
