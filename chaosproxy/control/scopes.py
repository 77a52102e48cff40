"""Scopes: calls on one listener set apart, each scope with a scenario and gate counters of its own.

Tests that run in parallel against one proxy (pytest-xdist workers, a shared staging sidecar) each name
a scope in a request header (`X-Chaosproxy-Scope: NAME`, or the listener's `scope_header`) and give it a
scenario (`PUT /scopes/NAME/scenario`): their calls then meet only their own faults, and a `first: 1`
rule fires once in each. A scope is an engine of its own (scenario, gate counters, sessions) behind a
proxy of its own that listens on nothing: the listener hands it the requests that name it
(`HttpProxy.scopes`). Calls that name no scope, or one that does not exist, get the listener's own
scenario. Its log lines are the run's, marked `scope: NAME` (the journal filters on it).
"""

from __future__ import annotations

import re

from chaosproxy.adapters.http import HttpProxy
from chaosproxy.engine.core import Engine
from chaosproxy.engine.scenario import Scenario, keep_routes
from chaosproxy.telemetry.log import MarkedLog
from chaosproxy.telemetry.log_schema import Marks

MAX_SCOPES = 1000  # on one listener at once: each holds an engine and an upstream pool
# What a scope may be called: it reaches the log and the control API's paths, and is looked up by the
# bytes of a request header (a name no request could send would be useless).
_SCOPE_NAME = re.compile(r"[A-Za-z0-9._~:@+=-]{1,128}")


class ScopeError(ValueError):
    """A scope cannot be made as asked (a name it may not have, too many scopes)."""


def check_scope_name(name: str) -> str:
    """`name`, unless it is not a short token (letters, digits, `._~:@+=-`): ScopeError says so."""
    if not _SCOPE_NAME.fullmatch(name):
        raise ScopeError(f"a scope's name is 1 to 128 letters, digits or ._~:@+=- (got {name[:140]!r})")
    return name


class Scopes:
    """The scopes of one listener (its HttpProxy), each an engine beside the listener's own."""

    def __init__(self, engine: Engine, proxy: HttpProxy, marks: Marks | None = None) -> None:
        """`engine`: the listener's own (its seed, log, session limits and routes are the scopes' too);
        `marks`: what the listener's own lines are marked with (a proxy made on demand: its name)."""
        self.engine = engine
        self.proxy = proxy
        self.marks = marks or {}
        self._engines: dict[str, Engine] = {}

    def names(self) -> list[str]:
        return sorted(self._engines)

    def get(self, name: str) -> Engine | None:
        return self._engines.get(name)

    def put(self, name: str, scenario: Scenario) -> Engine:
        """Give scope `name` this scenario, making the scope when it is new. A scope that exists keeps
        what it has seen (Engine.load): the counters of its unchanged rules and its sessions."""
        scenario = keep_routes(scenario, self.engine.start_routes, f"scope {name}")
        engine = self._engines.get(name)
        if engine is not None:
            engine.load(scenario)
            return engine
        check_scope_name(name)
        if len(self._engines) >= MAX_SCOPES:
            raise ScopeError(f"{MAX_SCOPES} scopes exist already on this listener: delete one first")
        base = self.engine
        log = MarkedLog(base.log, {**self.marks, "scope": name}, seed=base.seed)
        engine = Engine(scenario, seed=base.seed, log=log, session_ttl=base.sessions.ttl,
                        max_sessions=base.sessions.limit)
        engine.tracing = base.tracing
        self._engines[name] = engine
        self.proxy.scopes[name.encode()] = self.proxy.for_scope(engine)
        return engine

    async def delete(self, name: str) -> bool:
        """Forget scope `name`: its calls under way are cut, later ones get the listener's scenario.
        False when there is no such scope."""
        if self._engines.pop(name, None) is None:
            return False
        scoped = self.proxy.scopes.pop(name.encode(), None)
        if scoped is not None:
            await scoped.stop()
        return True

    def serve_on(self, proxy: HttpProxy) -> None:
        """Serve the scopes through `proxy` from now on (the listener made anew, as when a proxy made on
        demand is enabled again)."""
        self.proxy = proxy
        proxy.scopes.update({name.encode(): proxy.for_scope(engine) for name, engine in self._engines.items()})

    async def close(self) -> None:
        for name in list(self._engines):
            await self.delete(name)

