"""The control API: change a running proxy's scenario, watch its log live, scrape its metrics.

Toxiproxy-style, so chaos drills can be scripted:

  GET /scenario         the scenario in force (JSON, defaults left out; PUT takes it back)
  PUT /scenario         replace it (YAML or JSON body); an invalid one is refused with FILE:LINE reasons
  PATCH /rules/{name}   {"enabled": bool, "probability": float}
  POST /reset           forget gate counters and session state (the run's totals in /stats, /metrics go on)
  GET /events           the perturbation log as it is written, one JSON object a line (?event=fault;
                        ?last=N first replays the last N fault lines, up to 200)
  GET /metrics          Prometheus text
  GET /sessions         the sessions the proxy holds state for: count, limits and a page (?offset=&limit=)
  GET /healthz, GET /version
  GET /                 the live console, one self-contained page (chaosproxy/data/console.html)
  GET /stats            each rule's totals over the run (matched; fired: its fault lines, as /metrics counts
                        them), call and fault totals, active sessions
  POST /scenario/check  validate a scenario (FILE:LINE reasons) without putting it in force
  GET /journal          the call and fault lines kept in memory, filtered (control/journal.py)
  GET, POST /proxies    proxies made on demand (control/proxies.py); GET, PATCH, DELETE /proxies/{name}
  GET /scopes           the scopes of the listener (control/scopes.py); DELETE /scopes/{scope}

/scenario, /rules/{name} and /reset act on the run's own scenario; under /scopes/{scope}, on a scope's
(PUT makes the scope), under /proxies/{name}, on a proxy made on demand, and under
/proxies/{name}/scopes/{scope}, on a scope of one (control/targets.py).

It must run on the event loop that serves the proxy: a scenario swap then never lands in the middle
of a decision, and log listeners run on the loop that owns the event queues.

Safe by default: loopback unless told otherwise, a bearer token on any other address (and whenever
one is given), and no browsers but the console: a cross-site Origin or (on loopback) a Host that is
not a loopback name is refused, which stops CSRF and DNS rebinding from a web page; a browser
(a `Mozilla/` User-Agent) gets the console page and nothing else unless its request carries the
console token, a secret of this process that only the page holds (another origin cannot read the
page, a form cannot add a header). With a bearer token, the page itself needs `?token=TOKEN`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
import importlib.resources
import ipaddress
import os
import secrets
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import yaml
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, Counter, Gauge, generate_latest
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from yarl import URL

from chaosproxy import __version__
from chaosproxy.adapters.http import HttpProxy
from chaosproxy.client import TOKEN_ENV
from chaosproxy.control.journal import Journal, JournalQueryError
from chaosproxy.control.proxies import ProxyError, ProxyRegistry
from chaosproxy.control.scopes import ScopeError, Scopes
from chaosproxy.control.targets import Target, TargetError, find_target
from chaosproxy.engine.core import Engine
from chaosproxy.engine.named_files import ScenarioFiles
from chaosproxy.engine.scenario import Scenario, ScenarioError, keep_routes, off_loop, parse_scenario
from chaosproxy.engine.sessions import SCOPE_HEADER
from chaosproxy.engine.yaml_limits import MAX_DOCUMENT_BYTES
from chaosproxy.errors import ConfigError
from chaosproxy.telemetry.log import ops
from chaosproxy.telemetry.log_schema import Event, Key, ProxyMark
from chaosproxy.telemetry.metrics import LogMetrics

EVENT_QUEUE_SIZE = 1000
MAX_SUBSCRIBERS = 32  # /events readers at once; each costs a queue of EVENT_QUEUE_SIZE lines
OPEN_PATHS = frozenset({"/healthz"})  # no token needed: liveness probes rarely carry one
CONSOLE_HEADER = "X-Chaosproxy-Console"  # carries the console token on the console page's requests
LOG_EVENTS = frozenset({"run", "fault", "call", "skip", "error", "control", "session"})  # ?event= kinds
RECENT_FAULTS = 200  # fault lines kept for a console that opens late (/events?last=N)
# The console page may run its own script and talk to this origin, nothing else; no one may frame it.
CONSOLE_POLICY = ("default-src 'none'; script-src 'nonce-{nonce}'; style-src 'unsafe-inline'; connect-src 'self'; "
                  "img-src data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")


class ControlConfigError(ConfigError):
    """The control API cannot start as configured."""


class RulePatch(BaseModel):
    """What PATCH /rules/{name} may change. Strict: "false" is not a boolean."""

    model_config = ConfigDict(extra="forbid", strict=True)

    enabled: bool | None = None
    probability: float | None = Field(None, ge=0, le=1)


async def listen(runner: web.AppRunner, host: str, port: int, undo: Callable[[], Awaitable[None]]) -> int:
    """Set an API's app runner up and listen on host:port; the port bound (port 0 picks one). When that
    fails (the port is taken), `undo` stops what the API had started before the error goes on."""
    try:
        await runner.setup()
        site = web.TCPSite(runner, host, port, reuse_address=True)
        await site.start()
    except BaseException:
        await undo()
        raise
    return site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]


def is_loopback(host: str) -> bool:
    """True for localhost and addresses in 127.0.0.0/8 or ::1; an empty host means every interface."""
    host = host.strip("[]").rstrip(".").lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def scenario_json(scenario: Scenario) -> dict[str, Any]:
    """The scenario as a person would write it (defaults left out), in a form PUT /scenario takes back."""
    data = scenario.model_dump(mode="json", exclude_defaults=True)
    data["rules"] = data.get("rules", [])
    for rule, dumped in zip(scenario.rules, data["rules"], strict=True):
        dumped["fault"] = {"type": rule.fault.type, **dumped.get("fault", {})}  # the tag equals its default
    return data


class ControlServer:
    """The control API over one engine, on a listener of its own."""

    def __init__(self, engine: Engine, *, token: str | None = None, file_roots: Iterable[Path] = (),
                 event_queue: int = EVENT_QUEUE_SIZE, max_subscribers: int = MAX_SUBSCRIBERS,
                 proxies: ProxyRegistry | None = None) -> None:
        """`file_roots`: the only folders a PUT scenario may name files in (none: it may name no file);
        `proxies`: the proxies made on demand, when another API (Toxiproxy's) shares them (else its own)."""
        self.engine = engine
        self.proxies = proxies or ProxyRegistry(engine, SCOPE_HEADER)
        self._own_proxies = proxies is None
        self.scopes: Scopes | None = None  # the listener's, once attached
        self.journal = Journal()
        self.token = token or None
        self.file_roots = tuple(file_roots)
        self.max_subscribers = max_subscribers
        self.event_queue = event_queue
        self.metrics = LogMetrics(lambda: len(engine.sessions), lambda: engine.refused)
        self._dropped = Counter("chaosproxy_control_events_dropped",
                                "Events not sent to a slow /events client", registry=self.metrics.registry)
        self._subscribers = Gauge("chaosproxy_control_event_subscribers", "Clients reading /events",
                                  registry=self.metrics.registry)
        self._streams: set[asyncio.Task[Any]] = set()
        self._loopback = True
        self._stopping = False
        self._runner: web.AppRunner | None = None
        self._unsubscribe: list[Callable[[], None]] = []
        self.console_token = secrets.token_urlsafe(24)
        self._recent: deque[tuple[float, dict[str, Any]]] = deque(maxlen=RECENT_FAULTS)

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        """Listen; returns the bound port. Raises ControlConfigError before binding if a token is missing."""
        self._loopback = is_loopback(host)
        if not self._loopback and self.token is None:
            raise ControlConfigError(f"the control API on {host or 'every interface'} is not on loopback, "
                                     f"so it needs a token: pass --control-token or set {TOKEN_ENV}")
        app = web.Application(middlewares=[self._guard, _refusals])
        for prefix in ("", "/scopes/{scope}", "/proxies/{proxy}", "/proxies/{proxy}/scopes/{scope}"):
            app.router.add_get(prefix + "/scenario", self._get_scenario)
            app.router.add_put(prefix + "/scenario", self._put_scenario)
            app.router.add_patch(prefix + "/rules/{name}", self._patch_rule)
            app.router.add_post(prefix + "/reset", self._reset)
        for prefix in ("", "/proxies/{proxy}"):
            app.router.add_get(prefix + "/scopes", self._list_scopes)
            app.router.add_delete(prefix + "/scopes/{scope}", self._delete_scope)
        app.router.add_get("/proxies", self._list_proxies)
        app.router.add_post("/proxies", self._create_proxy)
        app.router.add_get("/proxies/{proxy}", self._show_proxy)
        app.router.add_patch("/proxies/{proxy}", self._change_proxy)
        app.router.add_delete("/proxies/{proxy}", self._delete_proxy)
        app.router.add_get("/journal", self._journal)
        app.router.add_get("/events", self._events)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/sessions", self._sessions)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/version", self._version)
        app.router.add_get("/", self._console)
        app.router.add_get("/stats", self._stats)
        app.router.add_post("/scenario/check", self._check_scenario)
        self._unsubscribe = [self.engine.log.subscribe(_never_raising(self.metrics.observe)),
                             self.engine.log.subscribe(_never_raising(self._remember)),
                             self.engine.log.subscribe(_never_raising(self.journal.record))]
        self._runner = web.AppRunner(app, handle_signals=False, handler_cancellation=True, access_log=None,
                                     shutdown_timeout=1)
        return await listen(self._runner, host, port, self.stop)

    async def stop(self) -> None:
        self._stopping = True
        for stream in list(self._streams):  # end open /events streams, or shutdown waits on them
            stream.cancel()
        for unsubscribe in self._unsubscribe:
            unsubscribe()
        self._unsubscribe = []
        if self._own_proxies:
            await self.proxies.close()
        if self.scopes is not None:
            await self.scopes.close()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    @web.middleware
    async def _guard(self, request: web.Request,
                     handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
        host = request.headers.get("Host")
        origin = request.headers.get("Origin")
        if origin is not None and origin != f"http://{host}":
            return _error(403, f"cross-site request from Origin {origin!r} refused")
        if self._loopback and host is not None and not is_loopback(_hostname(host)):
            return _error(403, f"Host {host!r} is not a loopback name (a DNS rebinding attempt?)")
        console = _same(request.headers.get(CONSOLE_HEADER), self.console_token)
        if request.path == "/":  # the console page: it holds the console token, so it needs the bearer token
            if self.token is not None and not (self._authorized(request)
                                               or _same(request.query.get("token"), self.token)):
                return _error(401, "the console needs the control token: open /?token=TOKEN")
            return await handler(request)
        if "Mozilla/" in request.headers.get("User-Agent", "") and not console:
            return _error(403, "the control API serves browsers only through its console page (GET /)")
        if self.token is not None and request.path not in OPEN_PATHS and not (console or self._authorized(request)):
            return _error(401, "a bearer token is required (Authorization: Bearer TOKEN)",
                          headers={"WWW-Authenticate": 'Bearer realm="chaosproxy"'})
        return await handler(request)

    def _authorized(self, request: web.Request) -> bool:
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        return scheme.lower() == "bearer" and _same(given.strip(), self.token)

    def attach(self, proxy: object) -> None:
        """The proxy the run listens with: an HTTP one's scopes are served from here on, named in the
        header the proxies made on demand use too."""
        if isinstance(proxy, HttpProxy):
            proxy.scope_header = self.proxies.scope_header.lower().encode()
            self.scopes = Scopes(self.engine, proxy)

    def _target(self, request: web.Request, *, create: bool = False) -> Target:
        return find_target(request.match_info, self.engine, self.scopes, self.proxies, create=create)

    def _in_force(self, target: Target) -> dict[str, Any]:
        """The scenario in force; a seed it names shows as the run's, the one in force (a --seed flag
        may differ from it, and a scenario put in force later cannot change it)."""
        data = scenario_json(target.current())
        if "seed" in data:
            data["seed"] = target.engine.seed
        return data

    def _seed_notes(self, scenario: Scenario, engine: Engine) -> list[str]:
        """Why a scenario's seed would not be used, when it differs from the run's."""
        if scenario.seed is None or scenario.seed == engine.seed:
            return []
        return [f"seed {scenario.seed} is not used: the run keeps seed {engine.seed}, as a seed is fixed "
                "when the proxy starts (restart it with --seed to change it)"]

    async def _get_scenario(self, request: web.Request) -> web.Response:
        target = self._target(request)
        if request.query.get("format") == "yaml":  # for people (the console's editor)
            text = yaml.safe_dump(self._in_force(target), sort_keys=False, allow_unicode=True)
            return web.Response(text=text, content_type="application/yaml")
        return _json(self._in_force(target))

    async def _read_scenario(self, request: web.Request,
                             engine: Engine | None = None) -> Scenario | tuple[int, dict[str, Any]]:
        """The scenario in a request's body, or the status and reasons why it cannot be put in force.

        Parsed in a worker thread, so the proxy and this API keep answering meanwhile.
        """
        body = bytearray()
        async for chunk in request.content.iter_chunked(1 << 16):
            body += chunk
            if len(body) > MAX_DOCUMENT_BYTES:
                return 413, {"error": f"a scenario may have at most {MAX_DOCUMENT_BYTES >> 10} KiB; "
                                      "the one in force stays"}
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError:
            return 400, {"error": "the scenario is not UTF-8 text"}
        source = request.query.get("source", "request")
        files = ScenarioFiles.under(self.file_roots)
        try:
            scenario = await off_loop(lambda: parse_scenario(text, source, files), source)
            return keep_routes(scenario, (engine or self.engine).start_routes, source)
        except ScenarioError as exc:
            return 400, {"error": "invalid scenario; the one in force stays", "problems": exc.problems}

    async def _check_scenario(self, request: web.Request) -> web.Response:
        """Whether PUT /scenario would take this body; a refusal is an answer here, not an error."""
        scenario = await self._read_scenario(request)
        if isinstance(scenario, tuple):
            return _json({"valid": False, **scenario[1]})
        notes = self._seed_notes(scenario, self.engine)
        return _json({"valid": True, "rules": [rule.name for rule in scenario.rules],
                      **({"notes": notes} if notes else {})})

    async def _put_scenario(self, request: web.Request) -> web.Response:
        target = self._target(request, create=True)
        scenario = await self._read_scenario(request, target.engine)
        if isinstance(scenario, tuple):
            status, refusal = scenario
            return _error(status, refusal.pop("error"), **refusal)
        target.put(scenario)
        self.engine.log.control(change="scenario", rules=[rule.name for rule in scenario.rules], **target.marks)
        ops.info("control: scenario replaced (%d rules)%s", len(scenario.rules), _of(target))
        for note in self._seed_notes(scenario, target.engine):
            ops.warning("control: %s", note)
        return _json(self._in_force(target))

    async def _patch_rule(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        try:
            patch = RulePatch.model_validate_json(await request.read())
        except ValidationError as exc:
            problems = [f"{name}.{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}" for e in exc.errors()]
            return _error(400, "invalid rule change", problems=problems)
        changes = patch.model_dump(exclude_none=True)
        if not changes:
            return _error(400, "nothing to change: give enabled and/or probability")
        # No await from here on: read, change and swap in one step, so concurrent PATCHes never lose one.
        target = self._target(request)
        scenario = target.current()
        rules = list(scenario.rules)
        index = next((i for i, rule in enumerate(rules) if rule.name == name), None)
        if index is None:
            return _error(404, f"no rule named {name!r}", rules=[rule.name for rule in rules])
        rules[index] = rules[index].model_copy(update=changes)
        target.put(scenario.model_copy(update={"rules": rules}))
        self.engine.log.control(change="rule", rule=name, **changes, **target.marks)
        ops.info("control: rule %r changed: %s%s", name, changes, _of(target))
        return _json(scenario_json(target.current())["rules"][index])

    async def _reset(self, request: web.Request) -> web.Response:
        target = self._target(request)
        target.reset()
        self.engine.log.control(change="reset", **target.marks)
        ops.info("control: counters and session state reset%s", _of(target))
        return web.Response(status=204)

    def _scopes_of(self, request: web.Request) -> Scopes | None:
        """The scopes of the run's listener, or of the proxy made on demand the path names."""
        name = request.match_info.get("proxy")
        return self.proxies.get(name).scopes if name is not None else self.scopes

    async def _list_scopes(self, request: web.Request) -> web.Response:
        scopes = self._scopes_of(request)
        header = scopes.proxy.scope_header.decode() if scopes is not None else None
        return _json({"header": header, "scopes": scopes.names() if scopes is not None else []})

    async def _delete_scope(self, request: web.Request) -> web.Response:
        scopes, name = self._scopes_of(request), request.match_info["scope"]
        if scopes is None or not await scopes.delete(name):
            return _error(404, f"no scope named {name!r}")
        proxy: ProxyMark = {"proxy": request.match_info["proxy"]} if "proxy" in request.match_info else {}
        self.engine.log.control(change="scope deleted", scope=name, **proxy)
        return web.Response(status=204)

    async def _list_proxies(self, _: web.Request) -> web.Response:
        return _json({"proxies": [proxy.as_json() for proxy in self.proxies.proxies.values()]})

    async def _create_proxy(self, request: web.Request) -> web.Response:
        """POST /proxies {name, upstream or routes, listen, scenario (YAML text or a mapping), seed, enabled,
        scope_header}: 201 and the proxy."""
        body = await read_json(request)
        scenario = None
        if (given := body.get("scenario")) is not None:
            text = given if isinstance(given, str) else orjson.dumps(given).decode()
            source = f"proxy {str(body.get('name'))[:60]}"
            files = ScenarioFiles.under(self.file_roots)
            try:
                scenario = await off_loop(lambda: parse_scenario(text, source, files), source)
            except ScenarioError as exc:
                return _error(400, "invalid scenario", problems=exc.problems)
        seed = body.get("seed")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            return _error(400, f"seed is a whole number, got {seed!r}")
        upstream = body.get("routes") or body.get("upstream") or ""
        proxy = await self.proxies.create(body.get("name", ""), body.get("listen") or "", upstream, scenario=scenario,
                                          enabled=body.get("enabled") is not False, seed=seed,
                                          scope_header=body.get("scope_header"))
        return _json(proxy.as_json(), 201)

    async def _show_proxy(self, request: web.Request) -> web.Response:
        return _json(self.proxies.get(request.match_info["proxy"]).as_json())

    async def _change_proxy(self, request: web.Request) -> web.Response:
        """PATCH /proxies/{name} {enabled, listen, upstream}: what is given changes."""
        body = await read_json(request)
        proxy = self.proxies.get(request.match_info["proxy"])
        await proxy.change(listen=body.get("listen"), upstream=body.get("upstream"), enabled=body.get("enabled"))
        return _json(proxy.as_json())

    async def _delete_proxy(self, request: web.Request) -> web.Response:
        await self.proxies.delete(request.match_info["proxy"])
        return web.Response(status=204)

    async def _journal(self, request: web.Request) -> web.Response:
        return _json(self.journal.query(request.query))

    async def _events(self, request: web.Request) -> web.StreamResponse:
        if len(self._streams) >= self.max_subscribers:
            return _error(503, f"{self.max_subscribers} clients already read /events; try again later",
                          headers={"Retry-After": "5"})
        kinds = frozenset(request.query.getall("event", ()))
        if unknown := sorted(kinds - LOG_EVENTS):
            return _error(400, f"unknown event kind {unknown[0]!r}; known: {', '.join(sorted(LOG_EVENTS))}")
        try:
            last = min(int(request.query.get("last", "0")), RECENT_FAULTS)
        except ValueError:
            return _error(400, f"last must be a number, got {request.query['last']!r}")
        subscriber = _Subscriber(self.event_queue, kinds, self._dropped)
        response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson",
                                               "Cache-Control": "no-cache"})
        # The recent lines, then every later one: taken and subscribed in one step, none missed or doubled.
        replay = [_line(ts, fields) for ts, fields in list(self._recent)[-last:]] if last > 0 and (
            not kinds or "fault" in kinds) else []
        # Subscribed before the headers go out: a client that has them sees every later line.
        unsubscribe = self.engine.log.subscribe(_never_raising(subscriber.put))
        task = asyncio.current_task()
        assert task is not None
        self._streams.add(task)
        self._subscribers.inc()
        try:
            await response.prepare(request)
            if replay:
                await response.write(b"".join(replay))
            while True:
                await response.write(await subscriber.next_lines())
        except ConnectionError:
            pass  # the client went away
        except asyncio.CancelledError:
            if not self._stopping:  # the client went away (aiohttp cancels the handler)
                raise
        finally:
            unsubscribe()
            self._subscribers.dec()
            self._streams.discard(task)
        return response  # the server is stopping: end the stream cleanly

    async def _metrics(self, _: web.Request) -> web.Response:
        body = generate_latest(self.metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _sessions(self, request: web.Request) -> web.Response:
        try:
            offset = max(0, int(request.query.get("offset", 0)))
            limit = min(1000, max(0, int(request.query.get("limit", 100))))
        except ValueError:
            return _error(400, "offset and limit are whole numbers")
        table = self.engine.sessions
        page = table.page(offset, limit)
        return _json({"count": len(table), "ttl_s": table.ttl, "max_sessions": table.limit,
                      "offset": offset, "sessions": page})

    async def _healthz(self, _: web.Request) -> web.Response:
        return _json({"status": "ok"})

    async def _version(self, _: web.Request) -> web.Response:
        return _json({"version": __version__, Key.RUN_ID: self.engine.log.run_id, Key.SEED: self.engine.seed})

    async def _console(self, _: web.Request) -> web.Response:
        """The console page, with this process's console token and a fresh script nonce filled in."""
        nonce = secrets.token_urlsafe(16)
        page = _console_page().replace("{{NONCE}}", nonce).replace("{{TOKEN}}", self.console_token)
        return web.Response(text=page, content_type="text/html", headers={
            "Content-Security-Policy": CONSOLE_POLICY.format(nonce=nonce), "X-Frame-Options": "DENY",
            "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer", "Cache-Control": "no-store"})

    async def _stats(self, _: web.Request) -> web.Response:
        """What the console polls: per-rule totals (Engine.rule_counts: never less when a session ends),
        call and fault totals (it derives rates), sessions."""
        counts = self.engine.rule_counts()
        rules = [{"name": rule.name, "enabled": rule.enabled, "probability": rule.probability,
                  "fault": rule.fault.type, "component": rule.fault.component,
                  "matched": counts.get(rule.name, (0, 0))[0], "fired": counts.get(rule.name, (0, 0))[1]}
                 for rule in self.engine.scenario.rules]
        registry = self.metrics.registry
        return _json({"version": __version__, Key.RUN_ID: self.engine.log.run_id, Key.SEED: self.engine.seed,
                      "calls": _total(self.metrics.calls), "faults": _total(self.metrics.faults),
                      "active_sessions": registry.get_sample_value("chaosproxy_active_sessions") or 0,
                      "rules": rules})

    def _remember(self, fields: dict[str, Any]) -> None:
        """A log listener: keep the last fault lines for consoles that open later."""
        if fields.get("event") == Event.FAULT:
            self._recent.append((time.time(), dict(fields)))


class _Subscriber:
    """One /events client: a bounded queue that the log fills without ever waiting.

    A slow client loses lines (counted, and told with a `dropped` line) rather than slowing the proxy.
    """

    def __init__(self, size: int, kinds: frozenset[str], dropped: Counter) -> None:
        self.queue: asyncio.Queue[tuple[float, dict[str, Any]]] = asyncio.Queue(size)
        self.kinds = kinds
        self.dropped = 0
        self._reported = 0
        self._dropped_total = dropped

    def put(self, fields: dict[str, Any]) -> None:
        """The log listener. Copies the fields: the log reuses its dict once listeners return."""
        if self.kinds and fields.get("event") not in self.kinds:
            return
        try:
            self.queue.put_nowait((time.time(), dict(fields)))
        except asyncio.QueueFull:
            self.dropped += 1
            self._dropped_total.inc()

    async def next_lines(self) -> bytes:
        """Every line queued so far (waiting for one), as NDJSON, then news of any dropped since.

        Lines are dropped only while the queue is full, so after every line still in it.
        """
        items = [await self.queue.get()]
        while not self.queue.empty():
            items.append(self.queue.get_nowait())
        lines = [_line(ts, fields) for ts, fields in items]
        if self.dropped > self._reported:
            lines.append(_ndjson({"event": Event.DROPPED, "count": self.dropped - self._reported}))
            self._reported = self.dropped
        return b"".join(lines)


async def start_control(engine: Engine, host: str = "127.0.0.1", port: int = 0, token: str | None = None,
                        *, file_roots: Iterable[Path] = (),
                        proxies: ProxyRegistry | None = None) -> tuple[ControlServer, int]:
    """Start a control API; returns it (call `stop()`) and its bound port."""
    server = ControlServer(engine, token=token, file_roots=file_roots, proxies=proxies)
    return server, await server.start(host, port)


@contextlib.asynccontextmanager
async def serve_control(engine: Engine, address: tuple[str, int] | None, token: str | None = None, *,
                        file_roots: Iterable[Path] = (),
                        proxies: ProxyRegistry | None = None) -> AsyncIterator[ControlServer | None]:
    """The CLI's `--control HOST:PORT` (None: no control API) and `--control-token`.

    The token falls back to $CHAOSPROXY_CONTROL_TOKEN; `file_roots` are the folders a PUT scenario may
    name files in (the start-up scenario's folder and --scenario-dir). Raises ControlConfigError, with a message for
    the user, when a non-loopback address has no token or the address cannot be bound.
    """
    if address is None:
        yield None
        return
    host, port = address
    try:
        server, bound = await start_control(engine, host, port, token or os.environ.get(TOKEN_ENV),
                                            file_roots=file_roots, proxies=proxies)
    except OSError as exc:
        reason = exc.strerror or exc
        raise ControlConfigError(f"cannot listen on {host}:{port} for the control API: {reason}") from exc
    ops.info("control API on %s port %d%s", host, bound, " (bearer token required)" if server.token else "")
    try:
        yield server
    finally:
        await server.stop()


def _hostname(host_header: str) -> str:
    try:
        return URL(f"http://{host_header}").host or ""
    except ValueError:
        return ""


def _line(ts: float, fields: dict[str, Any]) -> bytes:
    """One /events line: the time it was logged, then the log line's fields."""
    stamp = datetime.fromtimestamp(ts, UTC).isoformat(timespec="microseconds")
    rest = {key: value for key, value in fields.items() if key != Key.EVENT}
    return _ndjson({Key.TS: stamp, Key.EVENT: fields.get(Key.EVENT), **rest})


def _ndjson(fields: dict[str, Any]) -> bytes:
    return orjson.dumps(fields, option=orjson.OPT_APPEND_NEWLINE | orjson.OPT_NON_STR_KEYS)


def _same(given: str | None, secret: str | None) -> bool:
    """A constant-time comparison of a presented secret with ours (never equal when either is missing)."""
    return given is not None and secret is not None and hmac.compare_digest(given.encode(), secret.encode())


def _total(counter: Counter) -> float:
    """A labelled counter's sum over all its labels."""
    return sum(sample.value for metric in counter.collect() for sample in metric.samples
               if sample.name.endswith("_total"))


@functools.cache
def _console_page() -> str:
    return importlib.resources.files("chaosproxy").joinpath("data/console.html").read_text(encoding="utf-8")


@web.middleware
async def _refusals(request: web.Request,
                    handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
    """A request about a scope or proxy that cannot be had, or a change to one that cannot be made: its
    status and reason (TargetError, ProxyError, ScopeError, JournalQueryError)."""
    try:
        return await handler(request)
    except (TargetError, ProxyError) as exc:
        return _error(exc.status, str(exc))
    except (ScopeError, JournalQueryError) as exc:
        return _error(400, str(exc))


async def read_json(request: web.Request, kind: type = dict) -> Any:
    """A request's JSON (whatever its Content-Type: Toxiproxy's Go client says text/plain), an object or
    (`kind` list) an array; ProxyError 400 when it is not one."""
    try:
        body = orjson.loads(await request.read())
    except orjson.JSONDecodeError as exc:
        raise ProxyError(f"bad request body: {exc}") from None
    if not isinstance(body, kind):
        raise ProxyError(f"bad request body: expected a JSON {'object' if kind is dict else 'array'}")
    return body


def _of(target: Target) -> str:
    """What a log message says of the target, when it is not the run's own scenario."""
    return "".join(f" ({key} {value})" for key, value in target.marks.items())


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(data), content_type="application/json")


def _error(status: int, message: str, *, headers: dict[str, str] | None = None,
           **details: Any) -> web.Response:
    response = _json({"error": message, **details}, status)
    response.headers.update(headers or {})
    return response


def _never_raising(listener: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any]], None]:
    """Log listeners run inside the proxy's log call: a bug in one must not break the agent's traffic."""
    def guarded(fields: dict[str, Any]) -> None:
        try:
            listener(fields)
        except Exception:  # fail open: a broken listener must not break the traffic being logged
            ops.exception("control: a log listener failed")
    return guarded
