"""OTLP/HTTP export of the proxy's spans: a bounded queue, a batching thread, protobuf written by hand.

Why not the OpenTelemetry SDK: it costs ~50 µs of CPU for an empty span and its OTLP encoder as
much again, four times what the proxy may spend on a call's span (bench/otel_overhead.py). Here the
event loop appends a finished span (chaosproxy.telemetry.tracing's plain data, what repeats from call to call
encoded once already) to a deque; a daemon thread takes them in batches, writes the OTLP protobuf
(`Encoder`) and POSTs it. Encoding a batch in one go costs less CPU than a span at a time among the
loop's other work (its code and data stay in the CPU's caches). A full queue drops the span and
counts it: the loop never waits for the exporter.

The standard variables are honoured (read once, at start): the endpoint
(`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` as is, else `OTEL_EXPORTER_OTLP_ENDPOINT` + `/v1/traces`),
`OTEL_EXPORTER_OTLP[_TRACES]_HEADERS`, `_TIMEOUT` and `_COMPRESSION` (gzip), `OTEL_SERVICE_NAME`,
`OTEL_RESOURCE_ATTRIBUTES`, `OTEL_TRACES_SAMPLER`/`_ARG` (see `Sampler`) and `OTEL_BSP_SCHEDULE_DELAY`,
`OTEL_BSP_MAX_QUEUE_SIZE`, `OTEL_BSP_MAX_EXPORT_BATCH_SIZE`, `OTEL_BSP_EXPORT_TIMEOUT`, and the attribute
value length limit (`OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT`, else `OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT`): a
longer string value (of any attribute, an event's and a link's too) is cut to that many characters, its
last one `…`. Unlike the SDK's, the limit is never off (DEFAULT_VALUE_LIMIT): what agents and upstreams
send reaches these attributes, and a span must stay small whatever they send.
"""

from __future__ import annotations

import gzip
import http.client
import struct
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import unquote, urlsplit

from chaosproxy.telemetry.log import ops
from chaosproxy.telemetry.redact import redacted_url, truncated

if TYPE_CHECKING:
    from chaosproxy.telemetry.tracing import SpanData

DEFAULT_ENDPOINT = "http://localhost:4318"
SCOPE = "chaosproxy"
ERROR = 2  # Status.code
MAX_CACHED = 4096  # encoded attributes kept for reuse (they repeat: method, tool, address, session...)
MAX_CACHED_BYTES = 4 << 20  # and the bytes they may hold: all forgotten when either is reached
DEFAULT_VALUE_LIMIT = 4096  # characters of a string attribute value when no OTEL_*_VALUE_LENGTH_LIMIT says
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
    value_limit: int = DEFAULT_VALUE_LIMIT  # characters of a string attribute value

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
            schedule_delay_s=_number(environ.get("OTEL_BSP_SCHEDULE_DELAY", ""), 5000,
                                     "OTEL_BSP_SCHEDULE_DELAY") / 1000,
            max_queue=max(1, int(_number(environ.get("OTEL_BSP_MAX_QUEUE_SIZE", ""), 2048, "OTEL_BSP_MAX_QUEUE_SIZE"))),
            max_batch=max(1, int(_number(environ.get("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", ""), 512,
                                         "OTEL_BSP_MAX_EXPORT_BATCH_SIZE"))),
            value_limit=_value_limit(environ),
        )


class Finished(Protocol):
    """A finished span, as the exporter takes it: encoded by the exporter's thread."""

    def encoded(self, encoder: Encoder) -> bytes:
        """The span as a ScopeSpans.spans field (`Encoder.span`)."""
        ...


class Exporter:
    """Finished spans in, OTLP/HTTP out: `add` on the loop (never blocks), a thread batches and posts."""

    def __init__(self, settings: Settings, scope_version: str) -> None:
        self.settings = settings
        self.dropped = 0  # spans a full queue turned away
        self.failed = 0  # spans the collector did not take (unreachable, or an error status)
        self.exported = 0
        self._queue: deque[Finished] = deque()
        self._max_queue = settings.max_queue
        self._max_batch = settings.max_batch
        self._wake = threading.Event()
        self._stopping = False
        self.encoder = Encoder(settings.resource, scope_version, settings.value_limit)
        self._url = urlsplit(settings.endpoint)
        self._connection: http.client.HTTPConnection | None = None
        self._last_warning = -WARN_EVERY_S
        self._thread = threading.Thread(target=self._run, name="chaosproxy-otlp", daemon=True)
        self._thread.start()

    def add(self, span: Finished) -> None:
        """Queue a finished span; a full queue drops it (counted), never waits."""
        queue = self._queue
        if len(queue) >= self._max_queue:
            self.dropped += 1
            return
        queue.append(span)
        if len(queue) == self._max_batch:
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

    def _take(self) -> list[Finished]:
        queue, batch = self._queue, []
        for _ in range(min(len(queue), self._max_batch)):
            batch.append(queue.popleft())
        return batch

    def _export(self, batch: list[Finished]) -> None:
        encoder = self.encoder
        try:
            body = encoder.request([span.encoded(encoder) for span in batch])
        except Exception:  # fail open: a bug here must not end the thread (the queue would only fill)
            ops.exception("OpenTelemetry: %d spans could not be encoded", len(batch))
            self.failed += len(batch)
            return
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

    def _lost(self, batch: list[Finished], reason: str) -> None:
        self.failed += len(batch)
        now = time.monotonic()
        if now - self._last_warning >= WARN_EVERY_S:
            self._last_warning = now
            ops.warning("OpenTelemetry: %d spans not exported to %s (%s)", len(batch),
                        redacted_url(self.settings.endpoint), reason)


class Encoder:
    """OTLP protobuf: the few message types of opentelemetry/proto/trace/v1/trace.proto. A Span's
    fields go in any order (protobuf allows it), so a call's name, kind and the attributes that repeat
    from call to call can be one block encoded once (`head`, called on the loop); the rest is called
    by the exporter's thread alone (its caches are not shared)."""

    def __init__(self, resource: Mapping[str, Any], scope_version: str,
                 value_limit: int = DEFAULT_VALUE_LIMIT) -> None:
        self.value_limit = value_limit
        self._cache: dict[tuple[str, Any, type], bytes] = {}  # (key, value, its type) -> encoded
        self._cached_bytes = 0
        self._names: dict[tuple[str, int], bytes] = {}
        resource_message = b"".join(_field(1, self._key_value(key, value)) for key, value in resource.items()
                                    if value is not None)
        scope = _field(1, SCOPE.encode()) + _field(2, scope_version.encode())
        self._resource = _field(1, resource_message)  # ResourceSpans.resource
        self._scope = _field(1, scope)  # ScopeSpans.scope

    def request(self, spans: list[bytes]) -> bytes:
        """An ExportTraceServiceRequest for spans from `span` (each a ScopeSpans.spans field already)."""
        resource_spans = self._resource + _field(2, self._scope + b"".join(spans))
        return _field(1, resource_spans)  # ExportTraceServiceRequest.resource_spans

    def head(self, name: str, kind: int, attributes: Mapping[str, Any]) -> bytes:
        """Span.name, Span.kind and `attributes` (Span.attributes), for `span` to take as they are."""
        return _field(5, name.encode()) + b"\x30" + _varint(kind) + self._plain_attributes(9, attributes)

    def attributes(self, attributes: Mapping[str, Any]) -> bytes:
        """`attributes` as Span.attributes; an attribute seen before is not encoded again."""
        cache = self._cache
        parts = []
        for key, value in attributes.items():
            if isinstance(value, str) and len(value) > self.value_limit:  # cut before it keys the cache: a
                value = truncated(value, self.value_limit)  # hostile value is held no longer than it is sent
            item = (key, value, type(value))  # the type: True == 1 == 1.0, encoded three ways
            try:
                cached = cache.get(item)
            except TypeError:  # a structure: encoded as its str(), not kept
                cached = _field(9, self._key_value(key, value))
            if cached is None:
                if len(cache) >= MAX_CACHED or self._cached_bytes >= MAX_CACHED_BYTES:  # values that do not
                    cache.clear()  # repeat (request ids) fill it
                    self._cached_bytes = 0
                cached = cache[item] = _field(9, self._key_value(key, value))
                self._cached_bytes += len(cached)
            parts.append(cached)
        return b"".join(parts)

    def span(self, ids: bytes, head: bytes, start_ns: int, end_ns: int, attributes: bytes = b"",
             events: Sequence[tuple[int, str, Mapping[str, Any]]] | None = None,
             links: Sequence[tuple[bytes, bytes, Mapping[str, Any]]] | None = None, error: str | None = None) -> bytes:
        """A Span as a ScopeSpans.spans field: `ids` from `ids`, `head` from `head`, more `attributes`
        (encoded), events (time, name, attributes), links (trace id, span id, attributes) and the
        status message of a span that failed."""
        rare = self._rare(events, links, error) if events or links or error is not None else b""
        size = len(ids) + len(head) + TIMES.size + len(attributes) + len(rare)
        return b"".join((b"\x12", _varint(size), ids, head, TIMES.pack(0x39, start_ns, 0x41, end_ns), attributes, rare))

    def span_data(self, span: SpanData) -> bytes:
        """`span` as a ScopeSpans.spans field (a drill run's root span, a fault's child span)."""
        head = self._names.get((span.name, span.kind))
        if head is None:  # Span.name, Span.kind: a few of them, again and again
            if len(self._names) >= MAX_CACHED:
                self._names.clear()
            head = self._names[span.name, span.kind] = _field(5, span.name.encode()) + b"\x30" + _varint(span.kind)
        return self.span(ids(span.trace_id, span.span_id, span.parent_id, span.trace_state), head, span.start_ns,
                         span.end_ns, self.attributes(span.attributes), span.events, span.links, span.error)

    def _rare(self, events: Sequence[tuple[int, str, Mapping[str, Any]]] | None,
              links: Sequence[tuple[bytes, bytes, Mapping[str, Any]]] | None, error: str | None) -> bytes:
        parts = []
        for time_ns, name, attributes in events or ():  # Span.events
            parts.append(_field(11, b"\x09" + struct.pack("<Q", time_ns) + _field(2, name.encode())
                                + self._plain_attributes(3, attributes)))
        for trace_id, span_id, attributes in links or ():  # Span.links
            parts.append(_field(13, b"\x0a\x10" + trace_id + b"\x12\x08" + span_id
                                + self._plain_attributes(4, attributes)))
        if error is not None:  # Status{message, code=ERROR}
            parts.append(_field(15, _field(2, error.encode()) + b"\x18" + _varint(ERROR)))
        return b"".join(parts)

    def _plain_attributes(self, number: int, attributes: Mapping[str, Any]) -> bytes:
        """Attributes as repeated field `number` (a head's, an event's, a link's: not cached here)."""
        return b"".join(_field(number, self._key_value(key, value)) for key, value in attributes.items())

    def _key_value(self, key: str, value: Any) -> bytes:
        """KeyValue{key, AnyValue}: str, bool, int and float as themselves, anything else as its str(),
        a string cut to the value limit."""
        if isinstance(value, bool):
            any_value = b"\x10" + _varint(int(value))
        elif isinstance(value, int):
            any_value = b"\x18" + _varint(value)
        elif isinstance(value, float):
            any_value = b"\x21" + struct.pack("<d", value)
        else:
            any_value = _field(1, truncated(str(value), self.value_limit).encode())
        return _field(1, key.encode()) + _field(2, any_value)


def ids(trace_id: bytes, span_id: bytes, parent_id: bytes = b"", trace_state: str = "") -> bytes:
    """Span.trace_id, span_id, trace_state and parent_span_id (ids as 16 and 8 raw bytes; b"": no parent).
    chaosproxy.telemetry.tracing writes a root span's (no trace state, no parent) itself, from one random number."""
    encoded = b"\x0a\x10" + trace_id + b"\x12\x08" + span_id
    if trace_state:
        encoded += _field(3, trace_state.encode())
    return encoded + b"\x22\x08" + parent_id if parent_id else encoded


def _varint(number: int) -> bytes:
    if 0 <= number < 0x80:
        return SMALL[number]
    if 0 < number < 0x4000:  # a span's length, mostly
        return bytes((number & 0x7F | 0x80, number >> 7))
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


def _pairs(text: str, variable: str) -> dict[str, str]:
    """`key=value,key=value` (values percent-encoded), as OTEL_RESOURCE_ATTRIBUTES and _HEADERS are written."""
    pairs: dict[str, str] = {}
    for number, item in enumerate(text.split(","), 1):
        if not item.strip():
            continue
        key, sep, value = item.partition("=")
        if not sep or not key.strip():  # named by its place: a header's may be a secret
            ops.warning("%s: item %d is not key=value; ignored", variable, number)
            continue
        pairs[unquote(key.strip())] = unquote(value.strip())
    return pairs


def _value_limit(environ: Mapping[str, str]) -> int:
    """The attribute value length limit the OTEL_* variables set (the span's own first), else the default."""
    for variable in ("OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT", "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT"):
        text = (environ.get(variable) or "").strip()
        if text:
            if text.isdigit() and int(text) > 0:
                return int(text)
            ops.warning("%s=%r is not a positive number of characters; using %d", variable, text,
                        DEFAULT_VALUE_LIMIT)
    return DEFAULT_VALUE_LIMIT


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
