"""What a control API request about a scenario acts on: the run's own engine, a scope of its listener, a
proxy made on demand, or a scope of one. `/scenario`, `/rules/{name}` and `/reset` are the same under
`/scopes/{scope}`, `/proxies/{proxy}` and `/proxies/{proxy}/scopes/{scope}`."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from chaosproxy.control.proxies import ProxyError, ProxyRegistry
from chaosproxy.control.scopes import Scopes
from chaosproxy.engine.core import Engine
from chaosproxy.engine.scenario import Scenario
from chaosproxy.telemetry.log_schema import Marks


class TargetError(LookupError):
    """No such scope or proxy, or none can be had here; `status` is the HTTP answer."""

    def __init__(self, message: str, status: int = 404) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Target:
    """One engine's scenario, as the control API reads and changes it."""

    engine: Engine  # whose seed and routes a new scenario is held against (a new scope's: its listener's)
    current: Callable[[], Scenario]  # what GET shows and PATCH changes
    put: Callable[[Scenario], object]  # puts a scenario in force (ScopeError, ProxyError when it cannot)
    marks: Marks  # for the control lines of the log: {"proxy": P, "scope": S}, {} for the run's

    def reset(self) -> None:
        """Forget its gate counters and session state."""
        self.engine.reset()


def find_target(match: Mapping[str, str], engine: Engine, scopes: Scopes | None, proxies: ProxyRegistry, *,
                create: bool = False) -> Target:
    """The target a request's path names (`match`: its `proxy` and `scope`), the run's by default;
    `create`: a scope that does not exist yet is made by `put` (PUT /scopes/NAME/scenario)."""
    marks: Marks = {}
    if (name := match.get("proxy")) is not None:
        try:
            managed = proxies.get(name)
        except ProxyError as exc:
            raise TargetError(f"no proxy named {name!r}", exc.status) from None
        engine, scopes, marks = managed.engine, managed.scopes, {"proxy": name}
        if "scope" not in match:
            return Target(engine, lambda: managed.scenario, managed.load, marks)
    if (scope := match.get("scope")) is None:
        return Target(engine, lambda: engine.scenario, engine.load, marks)
    if scopes is None:
        raise TargetError("scopes need a listening HTTP proxy (chaosproxy run, or an enabled proxy made on demand)")
    scoped = scopes.get(scope)
    if scoped is None and not create:
        raise TargetError(f"no scope named {scope!r}")

    def current() -> Scenario:
        engine = scopes.get(scope)
        assert engine is not None, "a scope's scenario is read once it exists"
        return engine.scenario

    return Target(scoped or engine, current, lambda scenario: scopes.put(scope, scenario), {**marks, "scope": scope})
