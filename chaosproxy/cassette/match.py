"""Which recorded exchange a live request is: matched on what identifies it, with volatile parts left out.

A request's key is its method, its path and query, and what its body asks: for JSON-RPC the method and
params (each message of a batch), for a model API the conversation so far (the model, whether it
streams, the system text and the messages or input items), for other JSON the whole value, for other
bodies their digest. Left out as volatile: JSON-RPC ids, `_meta` (progress tokens, trace context), the
id of a cancelled request, legacy SSE session ids in the query, headers (MCP session ids, traceparent,
dates, user agents), and timestamps anywhere in a body. Secrets are redacted first, as they were when
recorded (chaosproxy.cassette.redact).

A key recorded several times is answered in the recorded order, then with its last answer again (a
retry meets the same answer), separately for each MCP session the replay has handed out.
"""

from __future__ import annotations

import difflib
import hashlib
import re
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import orjson

from chaosproxy.cassette.redact import Redactor
from chaosproxy.protocols.llm import ANTHROPIC, OPENAI_CHAT, OPENAI_RESPONSES, api_for_path

CONVERSATION = {OPENAI_CHAT: ("model", "stream", "messages"),
                ANTHROPIC: ("model", "stream", "system", "messages"),
                OPENAI_RESPONSES: ("model", "stream", "instructions", "input", "previous_response_id")}
VOLATILE_QUERY = frozenset({"sessionid", "session_id"})
TIMESTAMP = re.compile(r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d(:\d\d(\.\d+)?)?(Z|[+-]\d\d:?\d\d)?")
TRACEPARENT = re.compile(r"[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}")
MAX_SCOPES = 10_000  # sessions whose places in the cassette are kept (the least recently used go first)
SHOWN = 160  # characters of a key's body shown in an error


@dataclass(frozen=True, slots=True)
class Key:
    method: str
    target: str  # path and the query's lasting part
    what: str  # what the body asks, as canonical JSON (or a digest)

    def describe(self) -> str:
        what = self.what if len(self.what) <= SHOWN else self.what[:SHOWN] + "..."
        return f"{self.method} {self.target}" + (f" {what}" if what else "")


def request_key(method: str, target: str, body: bytes, redactor: Redactor) -> Key:
    found: list[str] = []
    path, _, query = redactor.target(target, "request", found).partition("?")
    pairs = sorted(pair for pair in query.split("&") if pair and pair.partition("=")[0].lower() not in VOLATILE_QUERY)
    lasting = path + ("?" + "&".join(pairs) if pairs else "")
    return Key(method.upper(), lasting, _what(path, redactor.json(body, "request", found)))


def frame_key(message: Any) -> Key:
    """The key of one JSON-RPC message on stdio (redacted already): its method and params, or its reply."""
    return Key("RPC", "stdio", _canonical(_rpc(message) if isinstance(message, dict) else _normal(message)))


def _what(path: str, body: bytes) -> str:
    if not body:
        return ""
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError:
        return f"sha256:{hashlib.sha256(body).hexdigest()[:16]} ({len(body)} bytes)"
    if is_rpc(value):
        return _canonical([_rpc(item) for item in value] if isinstance(value, list) else _rpc(value))
    api = api_for_path(path)
    if api is not None and isinstance(value, dict):
        return _canonical({name: _normal(value[name]) for name in CONVERSATION[api] if name in value})
    return _canonical(_normal(value))


def is_rpc(value: Any) -> bool:
    """A JSON-RPC message, or a batch of them."""
    items = value if isinstance(value, list) and value else [value]
    return all(isinstance(item, dict) and item.get("jsonrpc") == "2.0" for item in items)


def json_or_none(data: bytes) -> Any:
    """`data` as a JSON value, or None when it is empty or not JSON."""
    try:
        return orjson.loads(data) if data else None
    except orjson.JSONDecodeError:
        return None


def _rpc(message: dict[str, Any]) -> Any:
    if "method" not in message:
        return {"reply": _normal({key: message[key] for key in ("result", "error") if key in message})}
    params = message.get("params")
    if isinstance(params, dict):
        params = {key: value for key, value in params.items()
                  if key != "_meta" and not (key == "requestId" and message["method"] == "notifications/cancelled")}
    return {"method": message["method"], "params": _normal(params)}


def _normal(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _normal(item) for key, item in value.items() if key != "_meta"}
    if isinstance(value, list):
        return [_normal(item) for item in value]
    if isinstance(value, str):
        if TIMESTAMP.fullmatch(value):
            return "<timestamp>"
        if TRACEPARENT.fullmatch(value):
            return "<traceparent>"
    return value


def _canonical(value: Any) -> str:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


class Index[T]:
    """Recorded answers by key, handed out in the recorded order for each scope (an MCP session, or "")."""

    def __init__(self, items: list[tuple[Key, T]]) -> None:
        self.by_key: dict[Key, list[T]] = {}
        for key, item in items:
            self.by_key.setdefault(key, []).append(item)
        self._next: OrderedDict[str, dict[Key, int]] = OrderedDict()

    def take(self, key: Key, scope: str = "") -> T | None:
        answers = self.by_key.get(key)
        if answers is None:
            return None
        places = self._next.get(scope)
        if places is None:
            places = self._next[scope] = {}
            if len(self._next) > MAX_SCOPES:
                self._next.popitem(last=False)
        else:
            self._next.move_to_end(scope)
        place = places.get(key, 0)
        places[key] = place + 1
        return answers[min(place, len(answers) - 1)]

    def closest(self, key: Key) -> Key | None:
        """The recorded key most like `key`: same method and path first, then the most similar body."""
        def likeness(other: Key) -> tuple[bool, bool, float]:
            ratio = difflib.SequenceMatcher(None, key.what[:2000], other.what[:2000], autojunk=False).ratio()
            return other.target.partition("?")[0] == key.target.partition("?")[0], other.method == key.method, ratio

        return max(self.by_key, key=likeness, default=None)


def no_match_message(key: Key, closest: Key | None) -> str:
    said = f"chaosproxy replay: the cassette holds no exchange for {key.describe()}"
    return said + (f"; the closest recorded: {closest.describe()}" if closest is not None else "; it is empty")
