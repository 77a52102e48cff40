"""Paraphrases of users' prompts from a model, kept in a file keyed by the text's hash.

Not a fault itself: `prompt_paraphrase` with `by: model` uses it. The endpoint (any OpenAI-compatible
`/chat/completions`: a hosted API, vLLM, Ollama's `/v1`, LiteLLM) is the operator's, read from
CHAOSPROXY_PARAPHRASE_ENDPOINT and never from a scenario: a scenario can come over the control API,
and it must not be able to send the users' prompts somewhere else. The cache file is the scenario's,
so a rerun reads the same paraphrases with no endpoint at all (offline, reproducible).

A model's answer is kept only when it is a paraphrase in the sense the templates keep: what a prompt
is precise about (numbers, dates, URLs, code spans, quoted text, identifiers) must all still be in it.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import urllib.error
import urllib.request
from pathlib import Path

from chaosproxy.faults._rewording import PROTECTED
from chaosproxy.telemetry.log import ops

ENDPOINT_ENV = "CHAOSPROXY_PARAPHRASE_ENDPOINT"
API_KEY_ENV = "CHAOSPROXY_PARAPHRASE_API_KEY"
INSTRUCTION = (
    "Paraphrase the user's message: the same request in other words, in the same language. Keep its meaning, "
    "and keep every number, date, name, URL, quoted text, code span and identifier exactly as written. "
    "Reply with the paraphrase only.")
_PRECISE = re.compile("|".join(PROTECTED))
_MAX_ANSWER = 1 << 20


def _key(model: str, text: str) -> str:
    return hashlib.sha256(f"{model}\0{text}".encode()).hexdigest()


class ParaphraseCache:
    """One cache file: JSON lines of {"key", "model", "paraphrase"}; read once, appended to as it grows."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._entries: dict[str, str] | None = None
        self._asking: dict[str, asyncio.Future[str | None]] = {}  # one request per text, however many wait
        self._told: set[str] = set()

    def get(self, model: str, text: str) -> str | None:
        return self._loaded().get(_key(model, text))

    async def fill(self, model: str, text: str, timeout_s: float) -> None:
        """Ask the operator's endpoint for `text`'s paraphrase, unless it is cached or nobody set one."""
        key = _key(model, text)
        endpoint = os.environ.get(ENDPOINT_ENV)
        if key in self._loaded() or not endpoint:
            return
        asking = self._asking.get(key)
        if asking is None:
            asking = self._asking[key] = asyncio.ensure_future(
                asyncio.to_thread(_ask, endpoint, model, text, timeout_s))
            asking.add_done_callback(lambda _: self._asking.pop(key, None))
        try:
            paraphrase = await asyncio.shield(asking)
        except (OSError, ValueError) as exc:  # the endpoint's failure: the templates stand in this time
            self.tell(f"the paraphrase endpoint failed ({exc})")
            return
        if paraphrase is None:
            self.tell(f"model {model} answered with no paraphrase that keeps the prompt's numbers, names and code")
        elif key not in self._loaded():
            self._loaded()[key] = paraphrase
            line = json.dumps({"key": key, "model": model, "paraphrase": paraphrase}, ensure_ascii=False) + "\n"
            try:
                with self.path.open("a", encoding="utf-8") as cache:
                    cache.write(line)
            except OSError as exc:
                self.tell(f"cannot write the paraphrase cache {self.path} ({exc.strerror}): kept in memory only")

    def tell(self, problem: str) -> None:
        """Say once per kind of problem why a model's paraphrase was not used (the templates were)."""
        if problem not in self._told:
            self._told.add(problem)
            ops.warning("prompt_paraphrase: %s; the template paraphrase is used instead", problem)

    def _loaded(self) -> dict[str, str]:
        if self._entries is None:
            self._entries = {}
            try:
                lines = self.path.read_text("utf-8").splitlines()
            except FileNotFoundError:
                lines = []
            except (OSError, UnicodeDecodeError) as exc:
                self.tell(f"cannot read the paraphrase cache {self.path} ({exc})")
                lines = []
            for number, line in enumerate(lines, 1):
                try:
                    entry = json.loads(line)
                    self._entries[entry["key"]] = str(entry["paraphrase"])
                except (ValueError, KeyError, TypeError):
                    self.tell(f"{self.path}:{number}: not a cache entry (skipped)")
        return self._entries


_CACHES: dict[Path, ParaphraseCache] = {}


def cache_at(path: Path) -> ParaphraseCache:
    """The one cache of a file, shared by every rule and scenario version that names it."""
    cache = _CACHES.get(path)
    if cache is None:
        cache = _CACHES[path] = ParaphraseCache(path)
    return cache


def _ask(endpoint: str, model: str, text: str, timeout_s: float) -> str | None:
    """The model's paraphrase of `text` (blocking: run in a thread), None when it is no faithful one."""
    body = json.dumps({"model": model, "temperature": 0, "messages": [
        {"role": "system", "content": INSTRUCTION}, {"role": "user", "content": text}]}).encode()
    headers = {"Content-Type": "application/json"}
    if key := os.environ.get(API_KEY_ENV):
        headers["Authorization"] = f"Bearer {key}"
    request = urllib.request.Request(endpoint.rstrip("/") + "/chat/completions", body, headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            answer = json.loads(response.read(_MAX_ANSWER))
    except urllib.error.HTTPError as exc:
        raise OSError(f"HTTP {exc.code}") from None
    try:
        paraphrase = answer["choices"][0]["message"]["content"].strip()
    except (KeyError, IndexError, TypeError, AttributeError):
        raise ValueError("the reply is not a Chat Completions response") from None
    faithful = paraphrase and paraphrase != text and all(
        found.group() in paraphrase for found in _PRECISE.finditer(text))
    return paraphrase if faithful else None
