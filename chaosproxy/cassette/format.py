"""The cassette on disk: what the proxy exchanged with an upstream, in order, with timing.

A cassette is a folder:

    DIR/cassette.jsonl   JSON lines: a header, then one line per HTTP exchange or stdio frame, by `seq`
    DIR/bodies/          bodies and events over INLINE_LIMIT bytes, named by their SHA-256

The header (line 1):

    {"chaosproxy_cassette": 1, "kind": "http" | "stdio", "recorded": ISO-8601 time, "chaosproxy": version,
     "upstreams": [URL, ...] (http) | "command": [ARG, ...] (stdio),
     "redaction": {"headers": [...], "fields": [...], "query": [...], "extra": [...]},  # what is redacted
     "redacted": {"request.header:authorization": 3, ...},                               # what was
     "unanswered": N}                                       # requests whose response never came (left out)

An HTTP exchange: the request as the upstream received it, the response as it sent it.

    {"seq": 1, "t": 0.0123, "upstream": "http://127.0.0.1:9001",
     "request": {"method": "POST", "target": "/mcp", "headers": [["Host", "..."], ...], "body": BLOB},
     "response": {"status": 200, "reason": "OK", "headers": [...], "t_head": 0.0021,
                  "body": BLOB | "events": [{"t": 0.0025, ...BLOB}, ...], "t_end": 0.0031,
                  "end": "complete" | "open" | "cut"},
     "redacted": ["request.header:authorization", ...]}

`t` is seconds from the start of the recording to the request's first byte; `t_head`, each event's `t`
and `t_end` are seconds from that first byte. An `events` response is a text/event-stream cut into its
events (each with its blank line). `end`: the upstream ended the response (complete), it was still
streaming when the agent or the recording stopped (open), or the connection broke mid-body (cut; also
a body over 64 MiB, kept up to there).

A stdio frame: one line (its newline off) either way, client to server or server to client.

    {"seq": 1, "t": 0.0123, "from": "client" | "server", ...BLOB, "redacted": [...]}

A BLOB is absent (empty), {"text": UTF-8 text}, {"base64": ...} (other bytes), or
{"file": "bodies/SHA256", "size": N} (over INLINE_LIMIT). Headers keep their order and case. Times are
rounded to microseconds. Lines are sorted by `seq` when the recording closes (a recording that was
killed may leave them in the order they completed: readers sort).
"""

from __future__ import annotations

import base64
import hashlib
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from chaosproxy.errors import ConfigError

FORMAT_VERSION = 1
CASSETTE_FILE = "cassette.jsonl"
BODIES = "bodies"
INLINE_LIMIT = 64 << 10  # a body or event larger than this goes to a file of its own
KINDS = ("http", "stdio")
ENDS = ("complete", "open", "cut")
SIDES = ("client", "server")

Headers = list[tuple[str, str]]


class CassetteError(ConfigError):
    """A cassette that cannot be read or written: the message names the file, the line and the reason."""


@dataclass(slots=True)
class Event:
    """One event of a response's event stream, `t` seconds after its request's first byte."""

    t: float
    data: bytes


@dataclass(slots=True)
class Request:
    method: str
    target: str  # path and query, as the upstream received them
    headers: Headers
    body: bytes = b""

    def header(self, name: str) -> str | None:
        return header(self.headers, name)


@dataclass(slots=True)
class Response:
    status: int
    reason: str
    headers: Headers
    t_head: float = 0.0
    body: bytes = b""
    events: list[Event] | None = None  # a text/event-stream, event by event
    t_end: float = 0.0
    end: str = "complete"

    def header(self, name: str) -> str | None:
        return header(self.headers, name)

    @property
    def whole_body(self) -> bytes:
        """The body, its events joined when it is a stream."""
        return b"".join(event.data for event in self.events) if self.events is not None else self.body


@dataclass(slots=True)
class Exchange:
    seq: int
    t: float
    upstream: str
    request: Request
    response: Response
    redacted: list[str] = field(default_factory=list)


@dataclass(slots=True)
class Frame:
    """A stdio line: `side` "client" went to the server, "server" came from it."""

    seq: int
    t: float
    side: str
    data: bytes
    redacted: list[str] = field(default_factory=list)


@dataclass(slots=True)
class Cassette:
    kind: str
    header: dict[str, Any]
    exchanges: list[Exchange] = field(default_factory=list)
    frames: list[Frame] = field(default_factory=list)
    source: str = "-"  # where it was read from, for messages

    @property
    def extra_redactions(self) -> list[str]:
        """The names `--redact` added when it was recorded: a live request is redacted alike before matching."""
        return list(self.header.get("redaction", {}).get("extra", []))


def header(headers: Headers, name: str) -> str | None:
    """The first value of header `name` (any case)."""
    name = name.lower()
    return next((value for key, value in headers if key.lower() == name), None)


def new_header(kind: str, redaction: dict[str, Any], **more: Any) -> dict[str, Any]:
    from chaosproxy import __version__

    return {"chaosproxy_cassette": FORMAT_VERSION, "kind": kind,
            "recorded": datetime.now(UTC).isoformat(timespec="seconds"), "chaosproxy": __version__,
            **more, "redaction": redaction}


# writing

def _seconds(value: float) -> float:
    return round(value, 6)


def _blob(data: bytes, folder: Path) -> dict[str, Any]:
    """How `data` is kept: inline as text or base64, or in a file of its own when large."""
    if not data:
        return {}
    if len(data) > INLINE_LIMIT:
        name = f"{BODIES}/{hashlib.sha256(data).hexdigest()}"
        path = folder / name
        if not path.exists():
            path.parent.mkdir(exist_ok=True)
            temporary = path.with_suffix(".part")
            temporary.write_bytes(data)
            os.replace(temporary, path)
        return {"file": name, "size": len(data)}
    try:
        return {"text": data.decode("utf-8")}
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(data).decode("ascii")}


def _headers_out(headers: Headers) -> list[list[str]]:
    return [[name, value] for name, value in headers]


def exchange_record(exchange: Exchange, folder: Path) -> dict[str, Any]:
    request, response = exchange.request, exchange.response
    answer: dict[str, Any] = {"status": response.status, "reason": response.reason,
                              "headers": _headers_out(response.headers), "t_head": _seconds(response.t_head)}
    if response.events is not None:
        answer["events"] = [{"t": _seconds(event.t), **_blob(event.data, folder)} for event in response.events]
    elif response.body:
        answer["body"] = _blob(response.body, folder)
    answer["t_end"] = _seconds(response.t_end)
    answer["end"] = response.end
    record: dict[str, Any] = {
        "seq": exchange.seq, "t": _seconds(exchange.t), "upstream": exchange.upstream,
        "request": {"method": request.method, "target": request.target, "headers": _headers_out(request.headers),
                    **({"body": _blob(request.body, folder)} if request.body else {})},
        "response": answer}
    if exchange.redacted:
        record["redacted"] = exchange.redacted
    return record


def frame_record(frame: Frame, folder: Path) -> dict[str, Any]:
    record: dict[str, Any] = {"seq": frame.seq, "t": _seconds(frame.t), "from": frame.side,
                              **_blob(frame.data, folder)}
    if frame.redacted:
        record["redacted"] = frame.redacted
    return record


def dumps(record: dict[str, Any]) -> bytes:
    return orjson.dumps(record) + b"\n"


class CassetteWriter:
    """Appends a cassette's lines as they complete (a killed recording keeps what was written), and on
    `close` writes it again sorted by seq with its final header."""

    def __init__(self, folder: Path, header: dict[str, Any]) -> None:
        self.folder = folder
        self.path = folder / CASSETTE_FILE
        try:
            folder.mkdir(parents=True, exist_ok=True)
            if self.path.exists():
                raise CassetteError(f"{self.path}: a cassette is there already; record into a new folder")
            self._file = open(self.path, "xb")  # noqa: SIM115  (open until close())
        except OSError as exc:
            raise CassetteError(f"{self.path}: cannot write the cassette: {exc.strerror or exc}") from None
        self.header = header
        self._file.write(dumps(header))
        self._file.flush()

    def write(self, item: Exchange | Frame) -> None:
        record = exchange_record(item, self.folder) if isinstance(item, Exchange) else frame_record(item, self.folder)
        self._file.write(dumps(record))
        self._file.flush()

    def close(self, **header: Any) -> None:
        """Sort the lines by seq and put the final header (`header` merged in) first."""
        if self._file.closed:
            return
        self._file.close()
        lines = self.path.read_bytes().splitlines()[1:]
        ordered = sorted(lines, key=lambda line: orjson.loads(line)["seq"])
        temporary = self.path.with_suffix(".part")
        temporary.write_bytes(dumps({**self.header, **header}) + b"".join(line + b"\n" for line in ordered))
        os.replace(temporary, self.path)


# reading

def cassette_kind(source: Path) -> str:
    """A cassette's kind (http or stdio) from its header alone. Raises CassetteError."""
    if is_vcr(source):
        return "http"  # VCR.py records HTTP only
    path = (source.parent if source.name == CASSETTE_FILE else source) / CASSETTE_FILE
    try:
        with open(path, "rb") as lines:
            head = orjson.loads(lines.readline())
    except (OSError, orjson.JSONDecodeError) as exc:
        raise CassetteError(f"{path}: not a readable cassette: {getattr(exc, 'strerror', None) or exc}") from None
    if not isinstance(head, dict) or head.get("kind") not in KINDS:
        raise CassetteError(f"{path}:1: not a chaosproxy cassette header")
    return str(head["kind"])


def is_vcr(source: Path) -> bool:
    """A VCR.py cassette file rather than a cassette folder."""
    return source.is_file() and source.suffix in (".yaml", ".yml", ".json")


def read_folder(source: Path) -> Cassette:
    """A cassette folder (or its cassette.jsonl). Raises CassetteError naming the file, line and reason."""
    folder = source.parent if source.name == CASSETTE_FILE else source
    path = folder / CASSETTE_FILE
    try:
        lines = path.read_bytes().splitlines()
    except OSError as exc:
        raise CassetteError(f"{path}: cannot read the cassette: {exc.strerror or exc}") from None
    records = list(_records(path, lines))
    if not records:
        raise CassetteError(f"{path}: empty; a cassette starts with its header line")
    _, head = records[0]
    if not isinstance(head, dict) or "chaosproxy_cassette" not in head:
        raise CassetteError(f"{path}:1: not a chaosproxy cassette header (no chaosproxy_cassette key)")
    if head["chaosproxy_cassette"] != FORMAT_VERSION:
        raise CassetteError(f"{path}:1: cassette format {head['chaosproxy_cassette']!r}; this chaosproxy reads "
                            f"{FORMAT_VERSION}")
    kind = head.get("kind")
    if kind not in KINDS:
        raise CassetteError(f"{path}:1: kind {kind!r}, expected one of {', '.join(KINDS)}")
    cassette = Cassette(kind, head, source=str(path))
    for number, record in records[1:]:
        where = f"{path}:{number}"
        try:
            if kind == "http":
                cassette.exchanges.append(_exchange(record, folder))
            else:
                cassette.frames.append(_frame(record, folder))
        except (KeyError, TypeError, ValueError) as exc:
            raise CassetteError(f"{where}: {_reason(exc)}") from None
    cassette.exchanges.sort(key=lambda exchange: exchange.seq)
    cassette.frames.sort(key=lambda frame: frame.seq)
    return cassette


def _reason(exc: Exception) -> str:
    if isinstance(exc, CassetteError):
        return str(exc)
    if isinstance(exc, KeyError):
        return f"missing {exc.args[0]!r}"
    return str(exc) or type(exc).__name__


def _records(path: Path, lines: list[bytes]) -> Iterator[tuple[int, Any]]:
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            yield number, orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            raise CassetteError(f"{path}:{number}: not JSON: {exc}") from None


def _unblob(record: dict[str, Any], folder: Path) -> bytes:
    if "text" in record:
        return str(record["text"]).encode("utf-8")
    if "base64" in record:
        return base64.b64decode(record["base64"], validate=True)
    if "file" in record:
        name = str(record["file"])
        path = (folder / name).resolve()
        if not name.startswith(f"{BODIES}/") or path.parent != (folder / BODIES).resolve():
            raise ValueError(f"body file {name!r} is not in {BODIES}/")
        try:
            return path.read_bytes()
        except OSError as exc:
            raise ValueError(f"body file {name}: {exc.strerror or exc}") from None
    return b""


def _headers_in(value: Any) -> Headers:
    if not isinstance(value, list) or not all(isinstance(pair, list) and len(pair) == 2 and
                                              all(isinstance(part, str) for part in pair) for pair in value):
        raise ValueError("headers must be a list of [name, value] string pairs")
    return [(name, text) for name, text in value]


def _exchange(record: dict[str, Any], folder: Path) -> Exchange:
    request, response = record["request"], record["response"]
    events = response.get("events")
    end = response.get("end", "complete")
    if end not in ENDS:
        raise ValueError(f"response end {end!r}, expected one of {', '.join(ENDS)}")
    return Exchange(
        seq=int(record["seq"]), t=float(record["t"]), upstream=str(record.get("upstream", "")),
        request=Request(str(request["method"]), str(request["target"]), _headers_in(request["headers"]),
                        _unblob(request.get("body") or {}, folder)),
        response=Response(int(response["status"]), str(response.get("reason", "")), _headers_in(response["headers"]),
                          float(response.get("t_head", 0)), _unblob(response.get("body") or {}, folder),
                          [Event(float(event["t"]), _unblob(event, folder)) for event in events]
                          if events is not None else None, float(response.get("t_end", 0)), end),
        redacted=list(record.get("redacted", [])))


def _frame(record: dict[str, Any], folder: Path) -> Frame:
    side = record["from"]
    if side not in SIDES:
        raise ValueError(f"from {side!r}, expected client or server")
    return Frame(int(record["seq"]), float(record["t"]), side, _unblob(record, folder),
                 list(record.get("redacted", [])))
