"""What the proxy remembers about an agent across messages.

Faults that change the tool registry an agent sees (renames, duplicates, distractors, drifted input
schemas) leave routes, so that calls to what the agent was shown still go somewhere sensible. Those
routes, and the output schemas the agent was shown, belong to the agent's view of one upstream, not
to one session: an agent that reconnects (a lost session, a retry) still calls the names it was shown.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class ToolRoute:
    """How one rule answers calls to a tool name it showed the agent.

    Exactly one of `real` (forward under this name) or `reply` (answer with this result or error
    object, without calling upstream) is set. A drifted input schema also renames arguments back
    (`arguments`) and refuses calls that still use the old shape (`refused`).
    """

    rule: str
    fault: str
    real: str | None = None
    reply: dict[str, Any] | None = None
    arguments: dict[str, str] = field(default_factory=dict)  # argument names shown -> real ones
    refused: frozenset[str] = frozenset()  # argument names the shown schema no longer has: -32602


class ToolRoutes:
    """Per tool name the agent was shown, the route each rule left for it.

    Rules shape a tool list one after the other, so one name may carry routes from several rules (a
    tool renamed, then its input schema drifted): the engine undoes them from the last rule to the
    first, so they compose in any order instead of overwriting each other.
    """

    __slots__ = ("_by_name",)

    def __init__(self) -> None:
        self._by_name: dict[str, dict[str, ToolRoute]] = {}

    def add(self, name: str, route: ToolRoute) -> None:
        """`route` for calls to `name`, replacing the route its rule left there before."""
        self._by_name.setdefault(name, {})[route.rule] = route

    def drop(self, name: str, rule: str) -> None:
        """Forget the route `rule` left for `name`."""
        layers = self._by_name.get(name)
        if layers is not None and layers.pop(rule, None) is not None and not layers:
            del self._by_name[name]

    def layers(self, name: str) -> Iterator[ToolRoute]:
        """The routes left for `name`, one per rule."""
        return iter(self._by_name.get(name, {}).values())

    def get(self, name: str) -> ToolRoute | None:
        """The route the latest-added rule left for `name` (for tests and faults that inspect one)."""
        layers = self._by_name.get(name)
        return next(reversed(layers.values())) if layers else None

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def __bool__(self) -> bool:
        return bool(self._by_name)


@dataclass(slots=True)
class AgentView:
    """What follows the agent across its sessions on one upstream: the tool routes it was shown,
    the output schema of every tool upstream listed, every name upstream listed (all pages), and
    each tool's latest real structured result (an example that a made-up success can follow)."""

    routes: ToolRoutes = field(default_factory=ToolRoutes)
    output_schemas: dict[str, dict[str, Any]] = field(default_factory=dict)
    listed: set[str] = field(default_factory=set)
    examples: dict[str, Any] = field(default_factory=dict)
    asked_upstream: bool = False  # the proxy listed upstream's tools itself (once, whatever came of it)

    def example_for(self, schema: dict[str, Any]) -> Any:
        """A real structured result of a tool listed with exactly `schema`, or None."""
        return next((self.examples[name] for name, other in self.output_schemas.items()
                     if other == schema and name in self.examples), None)


@dataclass(slots=True)
class SessionState:
    """One session: its agent's view, the count of its tool calls, recent results per tool."""

    view: AgentView = field(default_factory=AgentView)
    tool_calls: int = 0
    results: dict[str, list[Any]] = field(default_factory=dict)

    @property
    def routes(self) -> ToolRoutes:
        return self.view.routes

    @property
    def output_schemas(self) -> dict[str, dict[str, Any]]:
        return self.view.output_schemas
