"""What the A2A faults ask the A2A relay to do to a reply, beyond a Rewrite (plain data, as
chaosproxy.engine.actions): their fields are what the fault's log line says it did."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Withhold:
    """Do not relay this piece of a reply (a stream's event, or a task's results): `what` it was."""

    what: str


@dataclass(frozen=True, slots=True)
class EndStream:
    """End the agent's stream in place of this event: closed (`idle` false), or kept open and silent
    until the agent gives up (a remote agent that went quiet). `after_events`: events it got."""

    after_events: int
    idle: bool = False
