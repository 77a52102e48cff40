"""A synchronous client for the control API, on the standard library only, so any drill script can use it.

    control = ControlClient("http://127.0.0.1:8801")
    with control.fault({"match": {"path": "/api/*"}, "fault": {"type": "http_error", "status": 503}}):
        run_the_agent()
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Self

TOKEN_ENV = "CHAOSPROXY_CONTROL_TOKEN"


class ControlError(RuntimeError):
    """The control API refused a request. `problems` holds the FILE:LINE reasons of an invalid scenario."""

    def __init__(self, status: int, message: str, problems: list[str] | None = None) -> None:
        super().__init__(f"{status}: {message}" + "".join(f"\n  {problem}" for problem in problems or ()))
        self.status = status
        self.message = message
        self.problems = problems or []


class ControlClient:
    """One chaosproxy's control API. The token defaults to $CHAOSPROXY_CONTROL_TOKEN ("" for none)."""

    def __init__(self, url: str, *, token: str | None = None, timeout: float = 10) -> None:
        self.url = url.rstrip("/")
        self.token = (token if token is not None else os.environ.get(TOKEN_ENV)) or None
        self.timeout = timeout
        # Never through an HTTP proxy from the environment: the control API is local or reached directly.
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def get_scenario(self) -> dict[str, Any]:
        return self._json("GET", "/scenario")

    def put_scenario(self, scenario: str | Mapping[str, Any], *, source: str | None = None) -> dict[str, Any]:
        """Replace the scenario with YAML text or a mapping; returns it as now in force.

        `source` names the text in error reasons (a file name gives FILE:LINE reasons).
        """
        path = "/scenario" + (f"?{urllib.parse.urlencode({'source': source})}" if source else "")
        if isinstance(scenario, str):
            return self._json("PUT", path, scenario.encode(), "application/yaml")
        return self._json("PUT", path, json.dumps(scenario).encode(), "application/json")

    def patch_rule(self, name: str, *, enabled: bool | None = None,
                   probability: float | None = None) -> dict[str, Any]:
        """Enable, disable or change the probability of one rule; returns the rule as now in force."""
        change = {key: value for key, value in (("enabled", enabled), ("probability", probability))
                  if value is not None}
        return self._json("PATCH", f"/rules/{urllib.parse.quote(name, safe='')}", json.dumps(change).encode(),
                          "application/json")

    def reset(self) -> None:
        """Forget every counter and session state (rules with `first`, `after`, rate limits start over)."""
        self._request("POST", "/reset", timeout=self.timeout).close()

    def metrics(self) -> str:
        with self._request("GET", "/metrics", timeout=self.timeout) as response:
            return response.read().decode()

    def version(self) -> dict[str, Any]:
        return self._json("GET", "/version")

    def healthy(self) -> bool:
        try:
            return self._json("GET", "/healthz").get("status") == "ok"
        except (ControlError, OSError):
            return False

    def events(self, kinds: Iterable[str] = (), *, timeout: float | None = None) -> EventStream:
        """The perturbation log's lines as they are written, from the moment this returns.

        `kinds` picks among fault, call and error lines. With `timeout`, reading raises TimeoutError
        when no line comes for that long.
        """
        query = urllib.parse.urlencode([("event", kind) for kind in kinds])
        return EventStream(self._request("GET", "/events" + (f"?{query}" if query else ""), timeout=timeout))

    @contextlib.contextmanager
    def fault(self, rule: Mapping[str, Any]) -> Iterator[str]:
        """Add a rule for the duration of a block; yields its name (one is made up when it has none).

        The rule goes first, so it acts before the scenario's own rules. On exit it is taken out of the
        scenario then in force, leaving any other change made meanwhile. Session state and the
        counters of the other rules carry over the swap.
        """
        added = {"name": f"fault-{secrets.token_hex(4)}", **rule}
        scenario = self.get_scenario()
        self.put_scenario({**scenario, "rules": [added, *scenario["rules"]]})
        try:
            yield added["name"]
        finally:
            current = self.get_scenario()
            rules = [r for r in current["rules"] if r["name"] != added["name"]]
            self.put_scenario({**current, "rules": rules})

    def _json(self, method: str, path: str, body: bytes | None = None,
              content_type: str | None = None) -> dict[str, Any]:
        with self._request(method, path, body, content_type, timeout=self.timeout) as response:
            return json.loads(response.read())

    def _request(self, method: str, path: str, body: bytes | None = None, content_type: str | None = None,
                 *, timeout: float | None) -> Any:
        request = urllib.request.Request(self.url + path, data=body, method=method)
        if content_type is not None:
            request.add_header("Content-Type", content_type)
        if self.token is not None:
            request.add_header("Authorization", f"Bearer {self.token}")
        try:
            return self._opener.open(request, timeout=timeout)
        except urllib.error.HTTPError as exc:
            with exc:
                try:
                    detail = json.loads(exc.read())
                except ValueError:
                    detail = {}
            raise ControlError(exc.code, detail.get("error", exc.reason), detail.get("problems")) from None


class EventStream:
    """An open GET /events: iterate for the lines (dicts); close it, or use `with`, to disconnect.

    A line `{"event": "dropped", "count": N}` says N lines were lost because this reader was slow.
    """

    def __init__(self, response: Any) -> None:
        self._response = response

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return self

    def __next__(self) -> dict[str, Any]:
        while line := self._response.readline():
            if line.strip():
                return json.loads(line)
        raise StopIteration

    def close(self) -> None:
        self._response.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
