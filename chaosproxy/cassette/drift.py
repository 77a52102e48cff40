"""Drift: the recorded requests sent again to the live upstream, and what its answers changed.

Reported: tools added, removed or renamed (a removed tool and an added one with the same input schema), a
tool's input or output schema or description changed, a status changed, and the shape of a body changed
(keys added or removed, a value's type changed; values themselves are data and may differ freely). A
JSON-RPC reply is compared with the reply to the same request; notifications are left out (they come
when they come). MCP sessions are followed: the session the live server hands out replaces the recorded
one in the requests that follow. Redacted header values are not sent (give them with `--header`).
Event streams opened by a GET (an MCP session's standalone stream) are not read: they never end.
"""

from __future__ import annotations

import asyncio
import shlex
from dataclasses import asdict, dataclass, field
from typing import Any

import orjson

from chaosproxy.cassette.format import Cassette, Exchange, Frame
from chaosproxy.cassette.match import is_rpc, json_or_none, request_key
from chaosproxy.cassette.redact import REDACTED, Redactor
from chaosproxy.protocols.streams import SseSplitter, decode_whole, sse_data

SKIPPED_HEADERS = frozenset({"host", "content-length", "transfer-encoding", "connection", "keep-alive"})
MAX_BODY = 64 << 20
SHOWN_PATHS = 5  # schema paths named per changed schema


@dataclass(slots=True)
class Change:
    kind: str  # status, tool_added, tool_removed, tool_renamed, schema, description, shape
    where: str  # the request, as a cassette's error messages name it
    detail: str

    def line(self) -> str:
        return f"{self.kind}: {self.detail}  ({self.where})"


@dataclass(slots=True)
class DriftReport:
    upstream: str
    sent: int = 0
    skipped: int = 0
    failed: int = 0  # requests the upstream did not answer
    changes: list[Change] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


# comparing

def messages(body: bytes, content_type: str | None) -> list[Any] | None:
    """The JSON values in a body (one, or one per SSE event), or None when it holds none."""
    if content_type is not None and "text/event-stream" in content_type:
        splitter = SseSplitter()
        events = [*splitter.feed(body), splitter.rest()]
        values = [json_or_none(data) for event in events if event and (data := sse_data(event)) is not None]
        return [value for value in values if value is not None] or None
    value = json_or_none(body)
    return None if value is None else value if isinstance(value, list) and is_rpc(value) else [value]


def replies(values: list[Any]) -> list[Any]:
    """The JSON-RPC replies among `values` (or the values themselves when they are not JSON-RPC)."""
    if not all(is_rpc(value) for value in values):
        return values
    return [value for value in values if isinstance(value, dict) and "method" not in value]


def shape(value: Any) -> Any:
    """What a value looks like, without its data: keys and the types of their values."""
    if isinstance(value, dict):
        return {key: shape(item) for key, item in value.items()}
    if isinstance(value, list):
        shapes: list[Any] = []
        for item in value:
            if (item_shape := shape(item)) not in shapes:
                shapes.append(item_shape)
        return shapes
    return "null" if value is None else "boolean" if isinstance(value, bool) else \
        "number" if isinstance(value, int | float) else "string"


def shape_changes(old: Any, new: Any, path: str = "$") -> list[str]:
    if isinstance(old, dict) and isinstance(new, dict):
        said = [f"{path}.{key} removed" for key in old if key not in new]
        said += [f"{path}.{key} added" for key in new if key not in old]
        for key in old.keys() & new.keys():
            said += shape_changes(old[key], new[key], f"{path}.{key}")
        return said
    if isinstance(old, list) and isinstance(new, list):
        if len(old) == len(new) == 1:
            return shape_changes(old[0], new[0], f"{path}[]")
        if old and new and old != new and not (set(map(_key, old)) & set(map(_key, new))):
            return [f"{path}[] items changed shape"]
        return []
    kind_old, kind_new = _kind(old), _kind(new)
    return [f"{path}: {kind_old} -> {kind_new}"] if kind_old != kind_new else []


def _kind(shape_of: Any) -> str:
    return "object" if isinstance(shape_of, dict) else "array" if isinstance(shape_of, list) else str(shape_of)


def _key(value: Any) -> bytes:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


def tool_changes(old: list[Any], new: list[Any]) -> list[tuple[str, str]]:
    """(kind, detail) for tools added, removed, renamed, or changed in schema or description."""
    before = {tool["name"]: tool for tool in old if isinstance(tool, dict) and "name" in tool}
    after = {tool["name"]: tool for tool in new if isinstance(tool, dict) and "name" in tool}
    removed = [name for name in before if name not in after]
    added = [name for name in after if name not in before]
    changes: list[tuple[str, str]] = []
    for name in list(removed):
        twin = next((other for other in added if _key(after[other].get("inputSchema")) ==
                     _key(before[name].get("inputSchema")) and (len(removed) == 1 or
                     after[other].get("description") == before[name].get("description"))), None)
        if twin is not None:
            changes.append(("tool_renamed", f"{name} -> {twin}"))
            removed.remove(name)
            added.remove(twin)
    changes += [("tool_removed", name) for name in removed] + [("tool_added", name) for name in added]
    for name in before.keys() & after.keys():
        for schema in ("inputSchema", "outputSchema"):
            if _key(before[name].get(schema)) != _key(after[name].get(schema)):
                paths = value_changes(before[name].get(schema), after[name].get(schema), schema)
                changes.append(("schema", f"tool {name}: " + "; ".join(paths[:SHOWN_PATHS]) +
                                (f"; {len(paths) - SHOWN_PATHS} more" if len(paths) > SHOWN_PATHS else "")))
        if before[name].get("description") != after[name].get("description"):
            changes.append(("description", f"tool {name}: its description changed"))
    return sorted(changes)


def value_changes(old: Any, new: Any, path: str) -> list[str]:
    """Where two JSON values differ (for schemas, where every value counts)."""
    if isinstance(old, dict) and isinstance(new, dict):
        said = [f"{path}.{key} removed" for key in old if key not in new]
        said += [f"{path}.{key} added" for key in new if key not in old]
        for key in old.keys() & new.keys():
            said += value_changes(old[key], new[key], f"{path}.{key}")
        return said
    return [] if _key(old) == _key(new) else [f"{path}: {_short(old)} -> {_short(new)}"]


def _short(value: Any) -> str:
    text = orjson.dumps(value).decode()
    return text if len(text) <= 60 else text[:57] + "..."


def compare(where: str, request: Any, old_values: list[Any] | None, new_values: list[Any] | None) -> list[Change]:
    """What changed between a recorded and a live answer to one request (their JSON values)."""
    if old_values is None or new_values is None:
        return [] if old_values is new_values else [Change("shape", where, "the body is JSON no more" if new_values
                                                           is None else "the body became JSON")]
    old_replies, new_replies = replies(old_values), replies(new_values)
    method = request.get("method") if isinstance(request, dict) else None
    if method == "tools/list" and old_replies and new_replies:
        old_tools = _tools(old_replies[0])
        new_tools = _tools(new_replies[0])
        if old_tools is not None and new_tools is not None:
            return [Change(kind, where, detail) for kind, detail in tool_changes(old_tools, new_tools)]
    paths = shape_changes(shape(old_replies), shape(new_replies))
    return [Change("shape", where, "; ".join(paths[:SHOWN_PATHS]))] if paths else []


def _tools(reply: Any) -> list[Any] | None:
    result = reply.get("result") if isinstance(reply, dict) else None
    tools = result.get("tools") if isinstance(result, dict) else None
    return tools if isinstance(tools, list) else None


# HTTP

async def diff_http(cassette: Cassette, upstream: str, *, headers: dict[str, str], skip_calls: bool,
                    timeout: float) -> DriftReport:
    import aiohttp

    report = DriftReport(upstream)
    redactor = Redactor(cassette.extra_redactions)
    sessions: dict[str, str] = {}
    base = upstream.rstrip("/")
    client_timeout = aiohttp.ClientTimeout(total=timeout)
    async with aiohttp.ClientSession(timeout=client_timeout, auto_decompress=True) as session:
        for exchange in cassette.exchanges:
            request = exchange.request
            body_value = json_or_none(request.body)
            where = request_key(request.method, request.target, request.body, redactor).describe()
            if _skipped(exchange, body_value, skip_calls):
                report.skipped += 1
                continue
            sent_headers = _headers_to_send(request.headers, sessions, headers)
            try:
                async with session.request(request.method, base + request.target, headers=sent_headers,
                                           data=request.body or None, allow_redirects=False) as live:
                    live_body = await live.content.read(MAX_BODY)
                    status, content_type = live.status, live.headers.get("Content-Type")
                    live_session = live.headers.get("Mcp-Session-Id")
            except (aiohttp.ClientError, TimeoutError) as exc:
                report.failed += 1
                report.changes.append(Change("status", where, f"{exchange.response.status} -> no answer "
                                                              f"({exc or type(exc).__name__})"))
                continue
            report.sent += 1
            recorded_session = exchange.response.header("mcp-session-id")
            if recorded_session and live_session:
                sessions[recorded_session] = live_session
            report.changes += _compare_http(where, exchange, body_value, status, live_body, content_type)
    return report


def _skipped(exchange: Exchange, body: Any, skip_calls: bool) -> bool:
    response = exchange.response
    if exchange.request.method == "GET" and response.events is not None:
        return True  # a standalone event stream: it never ends
    return skip_calls and isinstance(body, dict) and body.get("method") == "tools/call"


def _headers_to_send(recorded: list[tuple[str, str]], sessions: dict[str, str],
                     given: dict[str, str]) -> dict[str, str]:
    sent: dict[str, str] = {}
    for name, value in recorded:
        lower = name.lower()
        if lower in SKIPPED_HEADERS or value == REDACTED or lower in (key.lower() for key in given):
            continue
        sent[name] = sessions.get(value, value) if lower == "mcp-session-id" else value
    return {**sent, **given}


def _compare_http(where: str, exchange: Exchange, request: Any, status: int, live_body: bytes,
                  content_type: str | None) -> list[Change]:
    recorded = exchange.response
    changes = [Change("status", where, f"{recorded.status} -> {status}")] if recorded.status != status else []
    body = recorded.whole_body
    encoding = (recorded.header("content-encoding") or "identity").lower()
    if encoding in ("gzip", "deflate"):
        body = decode_whole(body, encoding, MAX_BODY) or b""
    old_values = messages(body, recorded.header("content-type"))
    new_values = messages(live_body, content_type)
    if recorded.status == status:
        changes += compare(where, request, old_values, new_values)
    return changes


# stdio

async def diff_stdio(cassette: Cassette, command: list[str], *, skip_calls: bool, timeout: float) -> DriftReport:
    """The recorded client lines sent to a fresh server process, its replies compared with the recorded ones."""
    report = DriftReport(shlex.join(command))
    recorded = _recorded_replies(cassette.frames)
    process = await asyncio.create_subprocess_exec(*command, stdin=asyncio.subprocess.PIPE,
                                                   stdout=asyncio.subprocess.PIPE, start_new_session=True)
    assert process.stdin is not None and process.stdout is not None
    live: dict[Any, Any] = {}
    reader = asyncio.create_task(_read_replies(process.stdout, live))
    try:
        for frame in cassette.frames:
            message = json_or_none(frame.data)
            if frame.side != "client" or not isinstance(message, dict):
                continue
            if skip_calls and message.get("method") == "tools/call":
                report.skipped += 1
                continue
            process.stdin.write(frame.data + b"\n")
            await process.stdin.drain()
            if "method" not in message:
                continue  # the client's reply to the server's own request: nothing comes back for it
            report.sent += 1
            if "id" not in message:
                continue
            key = orjson.dumps(message["id"])
            if not await _wait_for(live, key, timeout):
                report.failed += 1
                report.changes.append(Change("status", f"{message['method']}", "no reply"))
                continue
            report.changes += compare(str(message["method"]), message, [recorded.get(key)] if key in recorded
                                      else None, [live[key]])
    finally:
        process.stdin.close()
        reader.cancel()
        try:
            await asyncio.wait_for(process.wait(), 5)
        except TimeoutError:
            process.kill()
            await process.wait()
    return report


def _recorded_replies(frames: list[Frame]) -> dict[bytes, Any]:
    replied: dict[bytes, Any] = {}
    for frame in frames:
        message = json_or_none(frame.data)
        if frame.side == "server" and isinstance(message, dict) and "method" not in message and "id" in message:
            replied.setdefault(orjson.dumps(message["id"]), message)
    return replied


async def _read_replies(stdout: asyncio.StreamReader, live: dict[bytes, Any]) -> None:
    while line := await stdout.readline():
        message = json_or_none(line.strip())
        if isinstance(message, dict) and "method" not in message and "id" in message:
            live[orjson.dumps(message["id"])] = message


async def _wait_for(live: dict[bytes, Any], key: bytes, timeout: float) -> bool:
    deadline = asyncio.get_running_loop().time() + timeout
    while key not in live:
        if asyncio.get_running_loop().time() > deadline:
            return False
        await asyncio.sleep(0.01)
    return True
