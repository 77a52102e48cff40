"""A synchronous client for the control API, on the standard library only, so any drill script can use it.

    control = ControlClient("http://127.0.0.1:8801")
    with control.fault({"match": {"path": "/api/*"}, "fault": {"type": "http_error", "status": 503}}):
        run_the_agent()
    assert control.calls(tool="search")[0]["faults"] == [...]

`control.scoped("t1")` is the same API for one scope of the proxy's listener (its requests carry
`control.headers`), `control.for_proxy("p1")` for a proxy made on demand (`create_proxy`).
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
    """One chaosproxy's control API. The token defaults to $CHAOSPROXY_CONTROL_TOKEN ("" for none).

    With `proxy` and/or `scope`, its scenario methods and journal act on that proxy made on demand and/or
    that scope (ask for one with `for_proxy` and `scoped`)."""

    def __init__(self, url: str, *, token: str | None = None, timeout: float = 10, proxy: str | None = None,
                 scope: str | None = None) -> None:
        self.url = url.rstrip("/")
        self.token = (token if token is not None else os.environ.get(TOKEN_ENV)) or None
        self.timeout = timeout
        self.proxy = proxy
        self.scope = scope
        self.headers: dict[str, str] = {}  # what a request carries to be in the scope (set by `scoped`)
        parts = [f"/proxies/{_segment(proxy)}" if proxy else "", f"/scopes/{_segment(scope)}" if scope else ""]
        self._prefix = "".join(parts)
        # Never through an HTTP proxy from the environment: the control API is local or reached directly.
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def scoped(self, name: str, scenario: str | Mapping[str, Any] | None = None) -> ControlClient:
        """The same API for scope `name` of the listener, made now with `scenario` (else none: no faults)
        if it is new; its `headers` are what puts a request in it."""
        scoped = ControlClient(self.url, token=self.token or "", timeout=self.timeout, proxy=self.proxy, scope=name)
        scoped.put_scenario(scenario if scenario is not None else {})
        header = self._json("GET", f"/proxies/{_segment(self.proxy)}/scopes" if self.proxy else "/scopes")["header"]
        scoped.headers = {header: name}
        return scoped

    def delete_scope(self) -> None:
        """Forget this client's scope (its scenario, counters and sessions)."""
        assert self.scope is not None, "a client of a scope (ControlClient.scoped) deletes it"
        self._request("DELETE", self._prefix, timeout=self.timeout).close()

    def create_proxy(self, name: str, upstream: str | Mapping[str, str], *, listen: str = "127.0.0.1:0",
                     scenario: str | Mapping[str, Any] | None = None, seed: int | None = None) -> dict[str, Any]:
        """Make a proxy on demand (a listener of its own; `upstream` a URL, or routes PREFIX -> URL);
        returns it, `listen` the address it took. Talk to it with `for_proxy(name)`."""
        optional = {"scenario": scenario, "seed": seed}
        body = {"name": name, "listen": listen, "routes" if isinstance(upstream, Mapping) else "upstream": upstream,
                **{key: value for key, value in optional.items() if value is not None}}
        return self._json("POST", "/proxies", json.dumps(body).encode(), "application/json")

    def delete_proxy(self, name: str) -> None:
        self._request("DELETE", f"/proxies/{_segment(name)}", timeout=self.timeout).close()

    def for_proxy(self, name: str) -> ControlClient:
        """The same API for a proxy made on demand."""
        return ControlClient(self.url, token=self.token or "", timeout=self.timeout, proxy=name)

    def journal(self, **filters: str | int) -> dict[str, Any]:
        """GET /journal: {"lines": [...], "last": SEQ}. Filters: event, scope, proxy, tool, rule, fault
        (a fault type), method, session, path, since (a SEQ), limit; this client's proxy and scope are
        filled in."""
        mine = {"proxy": self.proxy, "scope": self.scope}
        query = {key: value for key, value in {**mine, **filters}.items() if value is not None}
        return self._json("GET", "/journal?" + urllib.parse.urlencode(query))

    def calls(self, **filters: str | int) -> list[dict[str, Any]]:
        """The call lines the proxy kept (oldest first), e.g. calls(tool="search"): each has `faults`, the
        rules whose faults hit the call."""
        return self.journal(**filters, event="call")["lines"]

    def faults(self, **filters: str | int) -> list[dict[str, Any]]:
        """The fault lines the proxy kept (oldest first), e.g. faults(rule="down")."""
        return self.journal(**filters, event="fault")["lines"]

    def get_scenario(self) -> dict[str, Any]:
        return self._json("GET", self._prefix + "/scenario")

    def put_scenario(self, scenario: str | Mapping[str, Any], *, source: str | None = None) -> dict[str, Any]:
        """Replace the scenario with YAML text or a mapping; returns it as now in force.

        `source` names the text in error reasons (a file name gives FILE:LINE reasons).
        """
        path = self._prefix + "/scenario" + (f"?{urllib.parse.urlencode({'source': source})}" if source else "")
        if isinstance(scenario, str):
            return self._json("PUT", path, scenario.encode(), "application/yaml")
        return self._json("PUT", path, json.dumps(scenario).encode(), "application/json")

    def patch_rule(self, name: str, *, enabled: bool | None = None,
                   probability: float | None = None) -> dict[str, Any]:
        """Enable, disable or change the probability of one rule; returns the rule as now in force."""
        change = {key: value for key, value in (("enabled", enabled), ("probability", probability))
                  if value is not None}
        return self._json("PATCH", f"{self._prefix}/rules/{_segment(name)}", json.dumps(change).encode(),
                          "application/json")

    def reset(self) -> None:
        """Forget every counter and session state (rules with `first`, `after`, rate limits start over)."""
        self._request("POST", self._prefix + "/reset", timeout=self.timeout).close()

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


def _segment(name: str | None) -> str:
    return urllib.parse.quote(name or "", safe="")


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
