"""Proxies made on demand: each its own listener, upstream (or routes), scenario, seed and log marks.

The control API (`POST /proxies`) and the Toxiproxy-compatible API (control/toxiproxy.py) both make,
change and delete them here, at run time, as Toxiproxy does: a test that makes a proxy of its own is
isolated from every other. A proxy's engine writes to the run's log, its lines marked `proxy: NAME`
with its own seed. Deleting one closes its listener, its agents' connections and its upstream pools,
and cancels its calls under way: nothing of it stays behind.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from chaosproxy.adapters.http import HttpProxy
from chaosproxy.control.scopes import Scopes
from chaosproxy.control.toxics import Toxic
from chaosproxy.engine.core import Engine, draw_seed
from chaosproxy.engine.scenario import Scenario, check_route
from chaosproxy.telemetry.log import MarkedLog, ops

MAX_PROXIES = 1000  # at once: each holds a listening socket, an engine and upstream pools
# A proxy's name reaches the log and the API's paths; a scope header's name, every request's head.
_PROXY_NAME = re.compile(r"[A-Za-z0-9._~:@+=-]{1,128}")
_HEADER_NAME = re.compile(r"[A-Za-z0-9-]{1,64}")


class ProxyError(ValueError):
    """A proxy cannot be made or changed as asked; `status` is the HTTP answer."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def parse_listen(value: str) -> tuple[str, int]:
    """HOST:PORT (an empty host is 127.0.0.1, never every interface; an empty value, 127.0.0.1:0)."""
    if not isinstance(value, str):
        raise ProxyError(f"listen is HOST:PORT, got {value!r}")
    host, sep, port = value.rpartition(":")
    if not value:
        return "127.0.0.1", 0
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ProxyError(f"listen is HOST:PORT, got {value!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


def parse_routes(upstream: str | Mapping[str, str]) -> dict[str, str]:
    """An upstream URL (or Toxiproxy's HOST:PORT, taken as http://HOST:PORT), or routes PREFIX -> URL."""
    if not isinstance(upstream, str | Mapping):
        raise ProxyError(f"upstream is a URL or HOST:PORT, routes a mapping of PREFIX to URL; got {upstream!r}")
    routes = ({"/": upstream} if upstream else {}) if isinstance(upstream, str) else dict(upstream)
    if not routes:
        raise ProxyError("missing required field: upstream")
    try:
        for prefix, url in list(routes.items()):
            if not isinstance(url, str):
                raise ValueError(f"route {prefix}: the upstream is a URL, got {url!r}")
            routes[prefix] = url if "://" in url else f"http://{url}"
            check_route(prefix, routes[prefix])
    except ValueError as exc:
        raise ProxyError(str(exc)) from None
    return routes


@dataclass(eq=False)
class ManagedProxy:
    """One proxy made on demand: its engine lives as long as it does; its listener while it is enabled."""

    name: str
    listen: tuple[str, int]  # the port is the bound one once it has listened
    upstream: str  # as it was given (Toxiproxy's HOST:PORT stays so); `routes` is what traffic follows
    routes: dict[str, str]
    engine: Engine
    scope_header: str
    scenario: Scenario = field(default_factory=Scenario)  # its own rules; the toxics' rules follow them
    toxics: dict[str, Toxic] = field(default_factory=dict)
    proxy: HttpProxy | None = None
    scopes: Scopes | None = None

    @property
    def enabled(self) -> bool:
        return self.proxy is not None

    @property
    def address(self) -> str:
        host, port = self.listen
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    def as_json(self) -> dict[str, Any]:
        """What the control API shows of it."""
        return {"name": self.name, "listen": self.address, "upstream": self.upstream, "routes": self.routes,
                "enabled": self.enabled, "seed": self.engine.seed, "scope_header": self.scope_header,
                "rules": [rule.name for rule in self.engine.scenario.rules], "toxics": list(self.toxics)}

    def load(self, scenario: Scenario | None = None, toxics: dict[str, Toxic] | None = None) -> None:
        """Put its scenario (and toxics) in force: the scenario's rules, then each toxic's. Raises
        ProxyError (409) when a toxic is named as one of the scenario's rules is."""
        scenario = self.scenario if scenario is None else scenario
        toxics = self.toxics if toxics is None else toxics
        names = {rule.name for rule in scenario.rules}
        if clash := sorted(names & toxics.keys()):
            raise ProxyError(f"a rule of proxy {self.name}'s scenario is named {clash[0]!r} as a toxic is", 409)
        rules = [*scenario.rules, *(toxic.rule for toxic in toxics.values() if toxic.rule is not None)]
        self.engine.load(scenario.model_copy(update={"rules": rules, "routes": self.engine.start_routes}))
        self.scenario, self.toxics = scenario, toxics

    async def enable(self) -> None:
        """Listen (again, on the port it had): a new listener over the same engine and scopes."""
        if self.proxy is not None:
            return
        proxy = HttpProxy(self.engine, self.routes)
        proxy.scope_header = self.scope_header.lower().encode()
        try:
            port = await proxy.start(*self.listen)
        except OSError as exc:
            await proxy.stop()
            raise ProxyError(f"proxy {self.name}: cannot listen on {self.address}: {exc.strerror or exc}",
                             500) from None
        self.listen = (self.listen[0], port)
        self.proxy = proxy
        if self.scopes is None:
            self.scopes = Scopes(self.engine, proxy, {"proxy": self.name})
        else:
            self.scopes.serve_on(proxy)

    async def change(self, *, listen: str | None = None, upstream: str | Mapping[str, str] | None = None,
                     enabled: bool | None = None) -> None:
        """Change what is given of where it listens, where it forwards and whether it listens (Toxiproxy's
        POST /proxies/{name}): a new address or upstream means a new listener, the engine kept."""
        address = parse_listen(listen) if listen is not None else self.listen
        routes = parse_routes(upstream) if upstream is not None else self.routes
        listening = self.enabled if enabled is None else bool(enabled)
        if address != self.listen or routes != self.routes or not listening:
            await self.disable()
        if routes != self.routes:
            self.routes, self.upstream = routes, upstream if isinstance(upstream, str) else ""
            self.engine.start_routes = routes
            self.load()
        self.listen = address
        if listening:
            await self.enable()

    async def disable(self) -> None:
        """Stop listening and cut its agents' connections, as Toxiproxy does; the engine stays."""
        proxy, self.proxy = self.proxy, None
        if proxy is None:
            return
        proxy.close_connections()
        for scoped in proxy.scopes.values():
            await scoped.stop()
        await proxy.stop()

    async def close(self) -> None:
        await self.disable()
        if self.scopes is not None:
            await self.scopes.close()
            self.scopes = None
        self.engine.log.control(change="proxy deleted", proxy=self.name)


class ProxyRegistry:
    """The proxies made on demand in one run, by name, all on the run's log (and its seed, unless given)."""

    def __init__(self, engine: Engine, scope_header: str) -> None:
        """`engine`: the run's (its log and session limits are every proxy's); `scope_header`: the header
        that names a scope on the proxies made here, unless one says otherwise."""
        self.engine = engine
        self.scope_header = scope_header
        self.proxies: dict[str, ManagedProxy] = {}

    def get(self, name: str) -> ManagedProxy:
        proxy = self.proxies.get(name)
        if proxy is None:
            raise ProxyError("proxy not found", 404)
        return proxy

    async def create(self, name: str, listen: str, upstream: str | Mapping[str, str], *, enabled: bool = True,
                     scenario: Scenario | None = None, seed: int | None = None,
                     scope_header: str | None = None) -> ManagedProxy:
        """Make a proxy (listening at once when `enabled`); ProxyError: 409 when the name is taken,
        400 for a bad field, 500 when it cannot listen."""
        if not isinstance(name, str) or not _PROXY_NAME.fullmatch(name):
            raise ProxyError(f"a proxy's name is 1 to 128 letters, digits or ._~:@+=- (got {str(name)[:140]!r})")
        if scope_header is not None and (not isinstance(scope_header, str) or not _HEADER_NAME.fullmatch(scope_header)):
            raise ProxyError(f"scope_header is a header's name (letters, digits, -), got {str(scope_header)[:80]!r}")
        if name in self.proxies:
            raise ProxyError("proxy already exists", 409)
        if len(self.proxies) >= MAX_PROXIES:
            raise ProxyError(f"{MAX_PROXIES} proxies exist already: delete one first", 503)
        address, routes = parse_listen(listen), parse_routes(upstream)
        scenario = scenario or Scenario()
        seed = seed if seed is not None else scenario.seed if scenario.seed is not None else draw_seed()
        engine = Engine(scenario.model_copy(update={"routes": routes}), seed=seed,
                        log=MarkedLog(self.engine.log, {"proxy": name}, seed=seed),
                        session_ttl=self.engine.sessions.ttl, max_sessions=self.engine.sessions.limit)
        engine.tracing = self.engine.tracing
        managed = ManagedProxy(name, address, upstream if isinstance(upstream, str) else "", routes, engine,
                               scope_header or self.scope_header, scenario)
        if enabled:
            await managed.enable()
        self.proxies[name] = managed
        engine.log.control(change="proxy created", proxy=name, listen=managed.address, enabled=enabled,
                           rules=[rule.name for rule in scenario.rules])
        ops.info("control: proxy %s made on %s -> %s (seed %d)", name, managed.address, managed.upstream or routes,
                 seed)
        return managed

    async def delete(self, name: str) -> None:
        proxy = self.get(name)
        del self.proxies[name]
        await proxy.close()

    async def close(self) -> None:
        """Delete every proxy (the run is stopping)."""
        for name in list(self.proxies):
            await self.delete(name)
