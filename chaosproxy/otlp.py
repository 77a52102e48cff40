"""OTLP/HTTP export of the proxy's spans: a bounded queue, a batching thread, protobuf written by hand.

Why not the OpenTelemetry SDK: it costs ~50 µs of CPU for an empty span and its OTLP encoder as
much again, four times what the proxy may spend on a call's span (bench/otel_overhead.py). Here
the event loop only appends a finished span (plain data, chaosproxy.otel.SpanData) to a deque; a daemon thread
takes them in batches, writes the OTLP protobuf (the few message types of
opentelemetry/proto/trace/v1/trace.proto, attributes that repeat from span to span encoded once)
and POSTs it. A full queue drops the span and counts it: the loop never waits for the exporter.

The standard variables are honoured (read once, at start): the endpoint
(`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` as is, else `OTEL_EXPORTER_OTLP_ENDPOINT` + `/v1/traces`),
`OTEL_EXPORTER_OTLP[_TRACES]_HEADERS`, `_TIMEOUT` and `_COMPRESSION` (gzip), `OTEL_SERVICE_NAME`,
`OTEL_RESOURCE_ATTRIBUTES`, `OTEL_TRACES_SAMPLER`/`_ARG` (see `Sampler`) and `OTEL_BSP_SCHEDULE_DELAY`,
`OTEL_BSP_MAX_QUEUE_SIZE`, `OTEL_BSP_MAX_EXPORT_BATCH_SIZE`, `OTEL_BSP_EXPORT_TIMEOUT`.
"""

from __future__ import annotations

import gzip
import http.client
import struct
import threading
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

from chaosproxy.log import ops

if TYPE_CHECKING:
    from chaosproxy.otel import SpanData

DEFAULT_ENDPOINT = "http://localhost:4318"
SCOPE = "chaosproxy"
ERROR = 2  # Status.code
MAX_CACHED = 4096  # encoded attributes kept for reuse (they repeat: method, tool, address, session...)
TIMES = struct.Struct("<BQBQ")  # Span.start_time_unix_nano, end_time_unix_nano: tags and fixed64 values
SMALL = [bytes((number,)) for number in range(0x80)]  # one-byte varints
WARN_EVERY_S = 60.0  # an unreachable collector is reported once a minute, not once a batch


@dataclass
class Settings:
    """What the OTEL_* variables say about where and how to export."""

    endpoint: str = DEFAULT_ENDPOINT + "/v1/traces"
    headers: dict[str, str] = field(default_factory=dict)
    timeout_s: float = 10.0
    gzip: bool = False
    resource: dict[str, Any] = field(default_factory=dict)
    schedule_delay_s: float = 5.0
    max_queue: int = 2048
    max_batch: int = 512

    @classmethod
    def from_environment(cls, environ: Mapping[str, str], resource: Mapping[str, Any]) -> Settings:
        """The settings `environ` gives; `resource` is what the proxy adds to the resource (run id, seed)."""
        def traces_or_all(suffix: str) -> str:
            return (environ.get(f"OTEL_EXPORTER_OTLP_TRACES_{suffix}") or environ.get(f"OTEL_EXPORTER_OTLP_{suffix}")
                    or "").strip()

        endpoint = (environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or "").strip()
        if not endpoint:
            endpoint = ((environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or "").strip() or DEFAULT_ENDPOINT).rstrip("/")
            endpoint += "/v1/traces"
        protocol = traces_or_all("PROTOCOL")
        if protocol not in ("", "http/protobuf"):
            ops.warning("OTLP protocol %r is not supported; exporting http/protobuf", protocol)
        attributes = {**_pairs(environ.get("OTEL_RESOURCE_ATTRIBUTES", ""), "OTEL_RESOURCE_ATTRIBUTES"), **resource}
        attributes["service.name"] = ((environ.get("OTEL_SERVICE_NAME") or "").strip()
                                      or attributes.get("service.name") or "chaosproxy")
        return cls(
            endpoint=endpoint,
            headers=_pairs(traces_or_all("HEADERS"), "OTEL_EXPORTER_OTLP_HEADERS"),
            timeout_s=_number(traces_or_all("TIMEOUT"), 10_000, "OTEL_EXPORTER_OTLP_TIMEOUT") / 1000,
            gzip=traces_or_all("COMPRESSION").lower() == "gzip",
            resource=attributes,
            schedule_delay_s=_number(environ.get("OTEL_BSP_SCHEDULE_DELAY", ""), 5000, "OTEL_BSP_SCHEDULE_DELAY") / 1000,
            max_queue=max(1, int(_number(environ.get("OTEL_BSP_MAX_QUEUE_SIZE", ""), 2048, "OTEL_BSP_MAX_QUEUE_SIZE"))),
            max_batch=max(1, int(_number(environ.get("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", ""), 512,
                                         "OTEL_BSP_MAX_EXPORT_BATCH_SIZE"))),
        )


class Exporter:
    """Finished spans in, OTLP/HTTP out: `add` on the loop (never blocks), a thread batches and posts."""

    def __init__(self, settings: Settings, scope_version: str) -> None:
        self.settings = settings
        self.dropped = 0  # spans a full queue turned away
        self.failed = 0  # spans the collector did not take (unreachable, or an error status)
        self.exported = 0
        self._queue: deque[SpanData] = deque()
        self._wake = threading.Event()
        self._stopping = False
        self._encoder = Encoder(settings.resource, scope_version)
        self._url = urlsplit(settings.endpoint)
        self._connection: http.client.HTTPConnection | None = None
        self._last_warning = -WARN_EVERY_S
        self._thread = threading.Thread(target=self._run, name="chaosproxy-otlp", daemon=True)
        self._thread.start()

    def add(self, span: SpanData) -> None:
        """Queue a finished span; when the queue is full it is dropped (and counted), never waited for."""
        queue = self._queue
        if len(queue) >= self.settings.max_queue:
            self.dropped += 1
            return
        queue.append(span)
        if len(queue) == self.settings.max_batch:
            self._wake.set()

    def shutdown(self) -> None:
        """Export what is queued (within the export timeout) and stop the thread."""
        self._stopping = True
        self._wake.set()
        self._thread.join(self.settings.timeout_s + 1)
        if self.dropped or self.failed:
            ops.warning("OpenTelemetry: %d spans exported, %d dropped (queue full), %d not taken by the collector",
                        self.exported, self.dropped, self.failed)

    def _run(self) -> None:
        while True:
            self._wake.wait(self.settings.schedule_delay_s)
            self._wake.clear()
            stopping = self._stopping
            while self._queue:
                self._export(self._take())
            if stopping:
                break
        if self._connection is not None:
            self._connection.close()

    def _take(self) -> list[SpanData]:
        queue, batch = self._queue, []
        for _ in range(min(len(queue), self.settings.max_batch)):
            batch.append(queue.popleft())
        return batch

    def _export(self, batch: list[SpanData]) -> None:
        body = self._encoder.request(batch)
        headers = {**self.settings.headers, "Content-Type": "application/x-protobuf"}
        if self.settings.gzip:
            body = gzip.compress(body, 6)
            headers["Content-Encoding"] = "gzip"
        for attempt in (1, 2):  # once more on a fresh connection: a kept-alive one the collector had closed
            try:
                status = self._post(body, headers)
            except (OSError, http.client.HTTPException) as exc:
                self._close()
                if attempt == 2:
                    return self._lost(batch, f"{type(exc).__name__}: {exc}")
                continue
            if 200 <= status < 300:
                self.exported += len(batch)
                return None
            return self._lost(batch, f"HTTP {status}")

    def _post(self, body: bytes, headers: dict[str, str]) -> int:
        if self._connection is None:
            url = self._url
            kind = http.client.HTTPSConnection if url.scheme == "https" else http.client.HTTPConnection
            self._connection = kind(url.hostname or "localhost", url.port, timeout=self.settings.timeout_s)
        path = self._url.path or "/"
        self._connection.request("POST", path + (f"?{self._url.query}" if self._url.query else ""), body, headers)
        response = self._connection.getresponse()
        response.read()
        if response.will_close:
            self._close()
        return response.status

    def _close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    def _lost(self, batch: list[SpanData], reason: str) -> None:
        self.failed += len(batch)
        now = time.monotonic()
        if now - self._last_warning >= WARN_EVERY_S:
            self._last_warning = now
            ops.warning("OpenTelemetry: %d spans not exported to %s (%s)", len(batch), self.settings.endpoint, reason)


class Encoder:
    """ExportTraceServiceRequest protobuf for a batch of spans, one resource and one scope."""

    def __init__(self, resource: Mapping[str, Any], scope_version: str) -> None:
        self._cache: dict[str, dict[Any, bytes]] = {}  # attribute key -> value -> encoded
        self._names: dict[tuple[str, int], bytes] = {}
        resource_message = b"".join(_attribute(key, value) for key, value in resource.items() if value is not None)
        scope = _field(1, SCOPE.encode()) + _field(2, scope_version.encode())
        self._resource = _field(1, resource_message)  # ResourceSpans.resource
        self._scope = _field(1, scope)  # ScopeSpans.scope

    def request(self, spans: list[SpanData]) -> bytes:
        encoded = b"".join([_field(2, self._span(span)) for span in spans])  # ScopeSpans.spans
        resource_spans = self._resource + _field(2, self._scope + encoded)
        return _field(1, resource_spans)  # ExportTraceServiceRequest.resource_spans

    def _attributes(self, number: int, attributes: Mapping[str, Any]) -> bytes:
        """The attributes as repeated field `number`; a key's values seen before are not encoded again."""
        parts = []
        for key, value in attributes.items():
            values = self._cache.get(key)
            if values is None:
                values = self._cache[key] = {}
            kind = type(value)  # in the key: True == 1 == 1.0, encoded three ways
            cached = values.get((kind, value) if kind is not str else value)
            if cached is None:
                cached = _field(number, _key_value(key, value))
                if len(values) >= MAX_CACHED:  # a key whose values do not repeat (a request id)
                    values.clear()
                values[(kind, value) if kind is not str else value] = cached
            parts.append(cached)
        return b"".join(parts)

    def _span(self, span: SpanData) -> bytes:
        parts = [b"\x0a\x10", bytes.fromhex(span.trace_id), b"\x12\x08", bytes.fromhex(span.span_id)]
        if span.trace_state:
            parts.append(_field(3, span.trace_state.encode()))
        if span.parent_id:
            parts += (b"\x22\x08", bytes.fromhex(span.parent_id))
        name_and_kind = self._names.get((span.name, span.kind))
        if name_and_kind is None:  # Span.name, Span.kind: a few of them, again and again
            name_and_kind = _field(5, span.name.encode()) + b"\x30" + _varint(span.kind)
            if len(self._names) >= MAX_CACHED:
                self._names.clear()
            self._names[span.name, span.kind] = name_and_kind
        parts += (name_and_kind, TIMES.pack(0x39, span.start_ns, 0x41, span.end_ns),
                  self._attributes(9, span.attributes))
        for time_ns, name, attributes in span.events or ():  # Span.events
            parts.append(_field(11, b"\x09" + struct.pack("<Q", time_ns) + _field(2, name.encode())
                                + self._attributes(3, attributes)))
        for trace_id, span_id, attributes in span.links or ():  # Span.links
            parts.append(_field(13, b"\x0a\x10" + bytes.fromhex(trace_id) + b"\x12\x08" + bytes.fromhex(span_id)
                                + self._attributes(4, attributes)))
        if span.error is not None:  # Status{message, code=ERROR}
            parts.append(_field(15, _field(2, span.error.encode()) + b"\x18" + _varint(ERROR)))
        return b"".join(parts)


def _varint(number: int) -> bytes:
    if 0 <= number < 0x80:
        return SMALL[number]
    number &= 0xFFFF_FFFF_FFFF_FFFF  # int64: negatives as two's complement, ten bytes
    out = bytearray()
    while number > 0x7F:
        out.append(number & 0x7F | 0x80)
        number >>= 7
    out.append(number)
    return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (string, bytes, message)."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _key_value(key: str, value: Any) -> bytes:
    """KeyValue{key, AnyValue}: str, bool, int and float as themselves, anything else as its str()."""
    if isinstance(value, bool):
        any_value = b"\x10" + _varint(int(value))
    elif isinstance(value, int):
        any_value = b"\x18" + _varint(value)
    elif isinstance(value, float):
        any_value = b"\x21" + struct.pack("<d", value)
    else:
        any_value = _field(1, str(value).encode())
    return _field(1, key.encode()) + _field(2, any_value)


def _attribute(key: str, value: Any) -> bytes:
    """A KeyValue as a repeated field 1 (Resource.attributes)."""
    return _field(1, _key_value(key, value))


def _pairs(text: str, variable: str) -> dict[str, str]:
    """`key=value,key=value` (values percent-encoded), as OTEL_RESOURCE_ATTRIBUTES and _HEADERS are written."""
    pairs: dict[str, str] = {}
    for item in text.split(","):
        if not item.strip():
            continue
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            ops.warning("%s: %r is not key=value; ignored", variable, item.strip())
            continue
        pairs[unquote(key.strip())] = unquote(value.strip())
    return pairs


def _number(text: str, default: float, variable: str) -> float:
    if not text.strip():
        return default
    try:
        number = float(text)
    except ValueError:
        number = -1
    if number < 0:
        ops.warning("%s=%r is not a number of milliseconds or items; using %g", variable, text, default)
        return default
    return number
