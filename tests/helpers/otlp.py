"""A real OTLP/HTTP trace receiver on 127.0.0.1 that decodes opentelemetry-proto messages, and the
bundled MCP tool server exporting its own spans to it (run as `python -m tests.helpers.otlp server ...`)."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

KINDS = {1: "INTERNAL", 2: "SERVER", 3: "CLIENT", 4: "PRODUCER", 5: "CONSUMER"}


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in value.kvlist_value.values}
    return getattr(value, kind) if kind else None


@dataclass
class Span:
    service: str
    name: str
    kind: str
    trace_id: str
    span_id: str
    parent_id: str
    start_ns: int
    end_ns: int
    status: str  # UNSET, OK, ERROR
    status_message: str
    attributes: dict[str, Any]
    events: list[tuple[str, dict[str, Any]]]
    links: list[tuple[str, str]]  # (trace id, span id)
    resource: dict[str, Any] = field(default_factory=dict)

    @property
    def seconds(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9


class Receiver:
    """POST /v1/traces, as an OpenTelemetry collector serves it; the spans it got, decoded."""

    def __init__(self) -> None:
        self.spans: list[Span] = []
        self.requests = 0
        self.headers: list[dict[str, str]] = []  # each export's request headers
        self.stall = 0.0  # seconds to wait before answering an export (a slow collector)
        self._runner: web.AppRunner | None = None
        self.endpoint = ""

    async def start(self) -> str:
        app = web.Application()
        app.router.add_post("/v1/traces", self._traces)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.endpoint = f"http://127.0.0.1:{port}"
        return self.endpoint

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _traces(self, request: web.Request) -> web.Response:
        body = await request.read()  # aiohttp undoes a Content-Encoding (gzip) itself
        self.headers.append(dict(request.headers))
        if self.stall:
            await asyncio.sleep(self.stall)
        assert request.headers.get("Content-Type") == "application/x-protobuf", request.headers
        export = ExportTraceServiceRequest.FromString(body)
        self.requests += 1
        for resource_spans in export.resource_spans:
            resource = {kv.key: _value(kv.value) for kv in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    self.spans.append(Span(
                        service=str(resource.get("service.name")), name=span.name, kind=KINDS.get(span.kind, "?"),
                        trace_id=span.trace_id.hex(), span_id=span.span_id.hex(), parent_id=span.parent_span_id.hex(),
                        start_ns=span.start_time_unix_nano, end_ns=span.end_time_unix_nano,
                        status={0: "UNSET", 1: "OK", 2: "ERROR"}[span.status.code], status_message=span.status.message,
                        attributes={kv.key: _value(kv.value) for kv in span.attributes},
                        events=[(e.name, {kv.key: _value(kv.value) for kv in e.attributes}) for e in span.events],
                        links=[(link.trace_id.hex(), link.span_id.hex()) for link in span.links],
                        resource=resource))
        return web.Response(body=ExportTraceServiceResponse().SerializeToString(),
                            content_type="application/x-protobuf")

    def wait_for(self, found: Callable[[list[Span]], bool], timeout: float = 20) -> list[Span]:
        """The spans, once `found` says they are all there (bounded; fails with what did arrive)."""
        deadline = time.monotonic() + timeout
        while not found(list(self.spans)):
            if time.monotonic() > deadline:
                names = [(span.service, span.name) for span in self.spans]
                raise AssertionError(f"spans did not arrive in {timeout} s; got {names}")
            time.sleep(0.05)
        return list(self.spans)

    def named(self, name: str, service: str = "chaosproxy") -> list[Span]:
        return [span for span in self.spans if span.name == name and span.service == service]


def _serve_tools() -> None:
    """The bundled MCP tool server, its spans (MCP server spans, parented by `_meta`) exported to
    $OTEL_EXPORTER_OTLP_ENDPOINT; each HTTP request's `traceparent` header is recorded as a span
    `http.traceparent` parented by it, so a test sees what the proxy forwarded in both carriers."""
    from opentelemetry import propagate, trace
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    from chaosproxy.demo import mcp_server

    provider = TracerProvider(resource=Resource({"service.name": "demo-tools"}))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    tracer = provider.get_tracer("tests.helpers.otlp")

    def recording(app: Any) -> Any:
        async def asgi(scope: dict[str, Any], receive: Any, send: Any) -> None:
            if scope["type"] == "http":
                headers = {key.decode("latin-1"): value.decode("latin-1") for key, value in scope["headers"]}
                if "traceparent" in headers:
                    tracer.start_span("http.traceparent", context=propagate.extract(headers),
                                      kind=trace.SpanKind.SERVER).end()
            await app(scope, receive, send)
        return asgi

    server = mcp_server.server
    for factory in ("streamable_http_app", "sse_app"):
        made = getattr(server, factory)
        setattr(server, factory, lambda *args, _made=made, **kwargs: recording(_made(*args, **kwargs)))
    sys.argv = [sys.argv[0], *sys.argv[2:]]
    try:
        mcp_server.main()
    finally:
        provider.shutdown()


if __name__ == "__main__" and sys.argv[1:2] == ["server"]:
    _serve_tools()
