"""One model-API gateway for a whole eval, each sample-epoch's rules matched by the name it sends.

A model's base URL is fixed when Inspect makes the model, before any sample runs, so the gateway is
one embedded proxy (its own thread) in front of the provider for the whole eval. Each sample-epoch
names itself with `X-Chaosproxy-Agent` (set through the provider's extra headers): its draws are keyed
by that name (README, "Reproducible runs"), and its rules, put in force when it starts and taken out
when it ends, match only its requests (`match.header`) and are named after it, so they count its
requests alone. The gateway's log lines reach the sample by the session the name gives them.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

from yarl import URL

from chaosproxy.embedded import EmbeddedProxy
from chaosproxy.engine.sessions import AGENT_HEADER
from chaosproxy.telemetry.log_schema import Key


class ModelGateway:
    """`url` stands for `upstream` (a provider's base URL, path kept) while the plan lives."""

    def __init__(self, upstream: str, *, seed: int, log_path: Path) -> None:
        target = URL(upstream)
        self.proxy = EmbeddedProxy(str(target.origin()), seed=seed, log_path=log_path).start()
        self.url = self.proxy.url + (target.raw_path if target.raw_path != "/" else "")
        self._rules: dict[str, list[dict[str, Any]]] = {}  # agent -> its rules as put in force
        self._sinks: dict[str, list[dict[str, Any]]] = {}  # agent -> where its log lines go
        self._lock = threading.Lock()  # one scenario change at a time, each the newest whole
        self.proxy.engine.log.subscribe(self._route)

    def _route(self, line: dict[str, Any]) -> None:
        """On the gateway's thread: a line of an agent's session goes to that agent's sample."""
        session = line.get(Key.SESSION)
        if isinstance(session, str) and (sink := self._sinks.get(session.partition("#")[0])) is not None:
            sink.append(line)

    async def enter(self, agent: str, rules: list[dict[str, Any]], sink: list[dict[str, Any]]) -> None:
        """Put `agent`'s rules (a scenario's, as written; none: it runs clean) in force; its log lines go
        to `sink` from now on."""
        self._sinks[agent] = sink
        self._rules[agent] = [_own_rule(agent, rule) for rule in rules]
        if self._rules[agent]:
            await asyncio.to_thread(self._apply)

    async def leave(self, agent: str) -> None:
        had_rules = bool(self._rules.pop(agent, None))
        if had_rules:
            await asyncio.to_thread(self._apply)
        self.proxy.engine.log.flush()
        self._sinks.pop(agent, None)

    def _apply(self) -> None:
        """The rules of every sample under way, in force at once (unchanged rules keep their counters)."""
        with self._lock:
            rules = [rule for rules in list(self._rules.values()) for rule in rules]
            self.proxy.control.put_scenario({"rules": rules}, source="chaosproxy.harness")

    def close(self) -> None:
        self.proxy.stop()


def _own_rule(agent: str, rule: dict[str, Any]) -> dict[str, Any]:
    """`rule` for `agent` alone: named after it (its draws and counters are its own) and matching only
    requests that carry its name."""
    match = dict(rule.get("match") or {})
    match["header"] = {**(match.get("header") or {}), AGENT_HEADER: agent}
    return {**rule, "name": f"{agent}/{rule['name']}", "match": match}
