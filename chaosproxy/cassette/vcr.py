"""VCR.py cassettes (version 1, YAML or JSON, as vcrpy and pytest-recording write them) read and written.

Read: each interaction becomes an HTTP exchange, redacted as a recording is (chaosproxy.cassette.redact),
and an event-stream body is cut into its events, so `chaosproxy replay cassette.yaml` serves it.

What a VCR.py cassette cannot carry, so writing one leaves it out (and says so): timing (of the response
head, the body, each SSE event; a replay of an imported cassette answers at once), how a response ended
(still streaming, or cut), the order of headers of different names, trailers, what was redacted, and
stdio sessions (VCR.py records HTTP only).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import orjson
import yaml

from chaosproxy.cassette.format import Cassette, CassetteError, Event, Exchange, Request, Response, new_header
from chaosproxy.cassette.redact import Redactor
from chaosproxy.protocols.streams import SseSplitter

VCR_VERSION = 1


def read_vcr(path: Path) -> Cassette:
    try:
        text = path.read_text(encoding="utf-8")
        data = orjson.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (OSError, UnicodeDecodeError, orjson.JSONDecodeError, yaml.YAMLError) as exc:
        raise CassetteError(f"{path}: cannot read the VCR.py cassette: {getattr(exc, 'strerror', None) or exc}") \
            from None
    if not isinstance(data, dict) or not isinstance(data.get("interactions"), list):
        raise CassetteError(f"{path}: not a VCR.py cassette (no interactions: list)")
    if data.get("version") != VCR_VERSION:
        raise CassetteError(f"{path}: VCR.py cassette version {data.get('version')!r}; version {VCR_VERSION} is read")
    redactor = Redactor()
    cassette = Cassette("http", new_header("http", redactor.policy(), imported=f"VCR.py {path.name}"),
                        source=str(path))
    for number, interaction in enumerate(data["interactions"], 1):
        try:
            cassette.exchanges.append(_exchange(number, interaction, redactor))
        except (KeyError, TypeError, ValueError) as exc:
            what = f"missing {exc.args[0]!r}" if isinstance(exc, KeyError) else str(exc)
            raise CassetteError(f"{path}: interaction {number}: {what}") from None
    return cassette


def _bytes(value: Any) -> bytes:
    if value is None:
        return b""
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    raise TypeError(f"a body of type {type(value).__name__}")


def _headers(value: Any) -> list[tuple[str, str]]:
    if value is None:
        return []
    if not isinstance(value, dict):
        raise TypeError("headers must be a mapping of names to lists of values")
    return [(str(name), str(item)) for name, values in value.items()
            for item in (values if isinstance(values, list) else [values])]


def _exchange(number: int, interaction: dict[str, Any], redactor: Redactor) -> Exchange:
    request, response = interaction["request"], interaction["response"]
    url = urlsplit(str(request["uri"]))
    found: list[str] = []
    headers = _headers(request.get("headers"))
    content_type = next((value for name, value in headers if name.lower() == "content-type"), None)
    target = (url.path or "/") + (f"?{url.query}" if url.query else "")
    recorded = Request(str(request["method"]).upper(), redactor.target(target, "request", found),
                       redactor.headers(headers, "request", found),
                       redactor.body(_bytes(request.get("body")), content_type, "request", found))
    body = response.get("body")
    payload = _bytes(body.get("string") if isinstance(body, dict) else body)
    answer_headers = redactor.headers(_headers(response.get("headers")), "response", found)
    status = response.get("status") or {}
    answer = Response(int(status["code"]), str(status.get("message", "")), answer_headers, body=payload)
    if "text/event-stream" in (answer.header("content-type") or "") and not answer.header("content-encoding"):
        splitter = SseSplitter()
        events = [*splitter.feed(payload), *([rest] if (rest := splitter.rest()) else [])]
        answer.events, answer.body = [Event(0.0, bytes(event)) for event in events], b""
    return Exchange(number, 0.0, f"{url.scheme}://{url.netloc}", recorded, answer, found)


def write_vcr(cassette: Cassette, path: Path) -> list[str]:
    """Write `cassette` as a VCR.py cassette; returns what it could not carry (for the user to read)."""
    if cassette.kind != "http":
        raise CassetteError(f"{cassette.source}: a stdio cassette cannot be a VCR.py cassette (it records HTTP only)")
    lost: set[str] = set()
    interactions = []
    for exchange in cassette.exchanges:
        request, response = exchange.request, exchange.response
        if response.events is not None or response.t_head or response.t_end:
            lost.add("timing (response heads, bodies and SSE events are answered at once)")
        if response.end != "complete":
            lost.add("how streams ended (still open, or cut): they end whole")
        interactions.append({
            "request": {"body": _text(request.body), "headers": _grouped(request.headers, lost),
                        "method": request.method, "uri": exchange.upstream + request.target},
            "response": {"body": {"string": _text(response.whole_body) or ""},
                         "headers": _grouped(response.headers, lost),
                         "status": {"code": response.status, "message": response.reason}}})
    if cassette.header.get("redacted"):
        lost.add("the record of what was redacted (the values stay REDACTED)")
    text = orjson.dumps({"interactions": interactions, "version": VCR_VERSION}).decode() \
        if path.suffix == ".json" else yaml.safe_dump({"interactions": interactions, "version": VCR_VERSION},
                                                      sort_keys=False, allow_unicode=True)
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise CassetteError(f"{path}: cannot write: {exc.strerror or exc}") from None
    return sorted(lost)


def _text(data: bytes) -> str | bytes | None:
    if not data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return data  # YAML keeps it as !!binary, as vcrpy does


def _grouped(headers: list[tuple[str, str]], lost: set[str]) -> dict[str, list[str]]:
    """Headers as VCR.py keeps them: each name's values in a list, in the order the name first came."""
    grouped: dict[str, list[str]] = {}
    previous = None
    for name, value in headers:
        if name in grouped and name != previous:  # a name again after another: that order cannot be kept
            lost.add("the order of headers of different names (each name's values keep theirs)")
        grouped.setdefault(name, []).append(value)
        previous = name
    return grouped
