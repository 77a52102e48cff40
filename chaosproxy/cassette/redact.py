"""What never reaches a cassette: credentials in headers, in request targets and in bodies.

Redacted by default: the headers that carry credentials (Authorization, cookies, API-key headers and any
header named like one), the query values signed URLs and API keys travel in (chaosproxy.telemetry.redact
and the key names below), and, in JSON and form bodies, SSE events and stdio frames, the values of fields
named like a secret at any depth (api_key, access_token, client_secret, password, ...). `--redact NAME`
adds names, matched without regard to case against all three. A value becomes REDACTED and the place is
listed in the exchange's `redacted` (and counted in the header), so the cassette says what it lacks. A
secret value once seen is also taken out wherever else it turns up (an upstream echoing a header back, a
token repeated in a body): `value` in the list of places.

A live request is redacted the same way before it is matched against a cassette, so a recorded request
whose API key was taken out still matches the live one that carries it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any
from urllib.parse import parse_qsl, unquote, urlencode

import orjson

from chaosproxy.protocols.streams import sse_data, sse_with_data
from chaosproxy.telemetry.redact import redacted_url

REDACTED = "REDACTED"
HEADERS = frozenset({"authorization", "proxy-authorization", "cookie", "set-cookie", "x-api-key", "api-key",
                     "x-goog-api-key", "x-auth-token", "x-amz-security-token", "x-access-token"})
# a header named like a credential (x-openai-api-key, x-vault-token; not x-ratelimit-remaining-tokens)
SECRET_HEADER = re.compile(r"(?:^|-)(?:api-?key|token|secret|password|credentials?)$")
FIELDS = frozenset({"api_key", "apikey", "x_api_key", "access_token", "refresh_token", "id_token", "client_secret",
                    "secret", "secret_key", "password", "passwd", "token", "auth_token", "session_token",
                    "authorization", "private_key"})
# a field named like one, its words joined by _ once lower-cased (openai_api_key; not max_tokens, progressToken)
SECRET_FIELD = re.compile(r"(?:^|_)(?:api_?key|secret|secret_key|password|access_token|refresh_token|id_token|"
                          r"private_key|auth_token|session_token)$")
QUERY = frozenset({"key", "api_key", "apikey", "access_token", "token", "sig", "signature"})
# bodies are parsed only when one of these could be a field's name in them
_MAYBE_SECRET = re.compile(rb"(?i)key|secret|passw|token|authorization")
MIN_SECRET = 8  # a shorter value is not looked for elsewhere (it would match too much by chance)
_SCHEME = re.compile(r"(?i)^(?:bearer|basic|token|digest)\s+")


class Redactor:
    """Redacts headers, targets, bodies, events and frames; each call adds the places it redacted to `found`."""

    def __init__(self, extra: Iterable[str] = ()) -> None:
        self.extra = frozenset(name.lower() for name in extra)
        self._maybe = _MAYBE_SECRET if not self.extra else re.compile(
            _MAYBE_SECRET.pattern + b"|" + b"|".join(re.escape(name.encode()) for name in sorted(self.extra)))
        self.secrets: set[bytes] = set()  # the values redacted so far, taken out wherever else they appear
        self._seen: re.Pattern[bytes] | None = None

    def _learn(self, value: Any) -> None:
        if not isinstance(value, str):
            return
        for secret in {value, _SCHEME.sub("", value)}:
            if len(secret) >= MIN_SECRET and (raw := secret.encode("utf-8", "replace")) not in self.secrets:
                self.secrets.add(raw)
                self._seen = re.compile(b"|".join(map(re.escape, sorted(self.secrets, key=len, reverse=True))))

    def scrub(self, data: bytes, where: str, found: list[str]) -> bytes:
        """`data` with every secret value seen so far taken out."""
        if self._seen is None or not data:
            return data
        scrubbed = self._seen.sub(REDACTED.encode(), data)
        if scrubbed != data:
            found.append(f"{where}:value")
        return scrubbed

    def policy(self) -> dict[str, Any]:
        """What is redacted, for the cassette's header."""
        return {"headers": sorted(HEADERS) + [f"~{SECRET_HEADER.pattern}"],
                "fields": sorted(FIELDS) + [f"~{SECRET_FIELD.pattern}"],
                "query": sorted(QUERY) + ["signed-URL keys", "URL userinfo"], "extra": sorted(self.extra)}

    def secret_header(self, name: str) -> bool:
        lower = name.lower()
        return lower in HEADERS or lower in self.extra or SECRET_HEADER.search(lower) is not None

    def secret_field(self, name: str) -> bool:
        lower = name.lower()
        words = lower.replace("-", "_")
        return words in FIELDS or lower in self.extra or SECRET_FIELD.search(_snake(name)) is not None

    def headers(self, headers: Sequence[tuple[str, str]], where: str, found: list[str]) -> list[tuple[str, str]]:
        secret = [self.secret_header(name) and value != REDACTED for name, value in headers]
        for (name, value), hidden in zip(headers, secret, strict=True):
            if hidden:
                found.append(f"{where}.header:{name.lower()}")
                self._learn(value)
        return [(name, REDACTED if hidden else self.scrub(value.encode("latin-1"), f"{where}.header", found)
                 .decode("latin-1")) for (name, value), hidden in zip(headers, secret, strict=True)]

    def target(self, target: str, where: str, found: list[str]) -> str:
        """A request target (or URL) with its credentials out: userinfo, signed-URL and API-key query values."""
        safe = redacted_url(target)
        path, mark, query = safe.partition("?")
        if mark:
            pairs = [pair.partition("=") for pair in query.split("&")]
            for key, _, value in pairs:
                if self._secret_query(key):
                    self._learn(unquote(value))
            safe = f"{path}?{'&'.join(f'{key}={REDACTED}' if self._secret_query(key) else key + equals + value
                                      for key, equals, value in pairs)}"
        if safe != target:
            found.append(f"{where}.target")
        return self.scrub(safe.encode("latin-1"), f"{where}.target", found).decode("latin-1")

    def _secret_query(self, key: str) -> bool:
        name = unquote(key).lower()
        return name in QUERY or name in self.extra or self.secret_field(name)

    def body(self, data: bytes, content_type: str | None, where: str, found: list[str]) -> bytes:
        """A JSON or form body with its secret fields' values out; any other body with the secret values
        seen so far out."""
        if data and self._maybe.search(data) is not None:
            data = self._form(data, where, found) if content_type is not None and \
                "x-www-form-urlencoded" in content_type else self._fields(data, where, found)
        return self.scrub(data, f"{where}.body", found)

    def json(self, data: bytes, where: str, found: list[str]) -> bytes:
        """JSON text (a body, an event's data, a stdio frame) with its secret fields' values out, and any
        secret value seen so far."""
        return self.scrub(self._fields(data, where, found), f"{where}.body", found)

    def _fields(self, data: bytes, where: str, found: list[str]) -> bytes:
        if self._maybe.search(data) is None or data.lstrip()[:1] not in (b"{", b"["):
            return data
        try:
            value = orjson.loads(data)
        except orjson.JSONDecodeError:
            return data
        before = len(found)
        self._walk(value, f"{where}.body", found)
        return orjson.dumps(value) if len(found) > before else data

    def event(self, event: bytes, where: str, found: list[str]) -> bytes:
        """An SSE event with the JSON in its data redacted, and any secret value seen so far."""
        data = sse_data(event)
        if data is not None and self._maybe.search(data) is not None:
            redacted = self._fields(data, where, found)
            event = event if redacted is data else sse_with_data(event, redacted)
        return self.scrub(event, f"{where}.event", found)

    def _walk(self, value: Any, where: str, found: list[str]) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                if self.secret_field(key) and item not in (None, "", REDACTED):
                    self._learn(item)
                    value[key] = REDACTED
                    found.append(f"{where}:{key}")
                else:
                    self._walk(item, where, found)
        elif isinstance(value, list):
            for item in value:
                self._walk(item, where, found)

    def _form(self, data: bytes, where: str, found: list[str]) -> bytes:
        try:
            pairs = parse_qsl(data.decode("ascii"), keep_blank_values=True, strict_parsing=True)
        except (UnicodeDecodeError, ValueError):
            return data
        secret = [key for key, _ in pairs if self._secret_query(key)]
        if not secret:
            return data
        for key, value in pairs:
            if key in secret:
                self._learn(value)
        found.extend(f"{where}.body:{key}" for key in secret)
        return urlencode([(key, REDACTED if key in secret else value) for key, value in pairs]).encode("ascii")


def redacted_command(argv: list[str], redactor: Redactor) -> list[str]:
    """A server command line as a cassette may show it: the value of a flag named like a secret
    (`--api-key X`, `--token=X`) is REDACTED."""
    shown: list[str] = []
    for arg in argv:
        name, equals, _ = arg.partition("=")
        if shown and shown[-1].startswith("-") and "=" not in shown[-1] and _flag_secret(shown[-1], redactor):
            shown.append(REDACTED)
        elif equals and name.startswith("-") and _flag_secret(name, redactor):
            shown.append(f"{name}={REDACTED}")
        else:
            shown.append(arg)
    return shown


def _flag_secret(flag: str, redactor: Redactor) -> bool:
    return redactor.secret_field(flag.lstrip("-"))


def _snake(name: str) -> str:
    """openaiApiKey, OpenAI-Api-Key, openai_api_key: all openai_api_key."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower().replace("-", "_")
