"""What the agent did about the faults, read from the call log.

An incident starts at a tool call a fault disrupted (the agent got an error, a stand-in, a broken
exchange or nothing instead of the real answer). Every later call of the same tool by the agent (in
any of its sessions: one run of a log is one agent) belongs to it until one gets through undisrupted: then the agent recovered, and the time to
recovery runs from the end of the disrupted call to the end of the good one. An incident with no
later call of the tool means the agent gave up on it (or on the task).

A call to a tool that does not exist is a call upstream or the proxy cannot serve by that name: a
name an `unknown_tool` fault misspelt, or a made-up tool (`tool_flood`, `distractor_tool`) the agent
chose. A name the agent invents by itself reaches upstream as an ordinary call; the log does not
carry upstream's answer, so those are not counted.
"""

from __future__ import annotations

import collections
import statistics
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from chaosproxy.report.logfile import Call, Session

MADE_UP_TOOL_FAULTS = frozenset({"unknown_tool", "tool_flood", "distractor_tool"})
# What an agent sends on a fresh connection before it can call a tool again.
ATTEMPT_STEPS = frozenset({"initialize", "notifications/initialized", "server/discover", "tools/list"})


@dataclass(slots=True)
class Incident:
    """One tool's trouble in a session, from the disrupted call to the first that got through."""

    component: str  # of the fault that disrupted the first call
    started: float
    retries: int = 0
    recovered_at: float | None = None

    @property
    def time_to_recovery_ms(self) -> float | None:
        return None if self.recovered_at is None else (self.recovered_at - self.started) * 1000


def incidents(sessions: Iterable[Session]) -> list[Incident]:
    """The incidents of one agent, whose calls may span several sessions (a retrying agent reconnects).

    A disrupted call that is not a tool call (a 429 on `initialize`, a lost session) while a tool's
    incident is open is a retry blocked before its tools/call: it counts as a retry of the incident
    opened last, which it most likely was.
    """
    calls = sorted(((call, tool) for session in sessions for call, tool in _tool_marked(session)),
                   key=lambda pair: pair[0].ts)
    found: list[Incident] = []
    open_incidents: dict[str, Incident] = {}
    for call, is_tool_call in calls:
        if not is_tool_call:
            if call.disrupted and call.method in ATTEMPT_STEPS and open_incidents:
                max(open_incidents.values(), key=lambda incident: incident.started).retries += 1
            continue
        incident = open_incidents.get(call.label)
        if incident is not None:
            incident.retries += 1
            if not call.disrupted:
                incident.recovered_at = call.ts
                del open_incidents[call.label]
        elif call.disrupted and call.faults:
            cause = next((fault for fault in call.faults if fault.disruptive), call.faults[0])
            open_incidents[call.label] = Incident(cause.component, call.ts)
            found.append(open_incidents[call.label])
    return found


def _tool_marked(session: Session) -> Iterator[tuple[Call, bool]]:
    """Each call, and whether it is a step of the agent's (a tool call, or a turn to its model API)."""
    tool_calls = {id(call) for call in session.tool_calls + session.model_calls}
    return ((call, id(call) in tool_calls) for call in session.calls)


def calls_a_made_up_tool(call: Call) -> bool:
    return any(fault.fault in MADE_UP_TOOL_FAULTS for fault in call.faults)


@dataclass(frozen=True, slots=True)
class Recovery:
    """How incidents went: retried (another call of the tool), recovered (one got through), gave up."""

    incidents: int
    retried: int
    recovered: int
    median_time_to_recovery_ms: float | None
    max_time_to_recovery_ms: float | None

    @property
    def gave_up(self) -> int:
        return self.incidents - self.recovered

    @classmethod
    def of(cls, found: list[Incident]) -> Recovery:
        times = [t for incident in found if (t := incident.time_to_recovery_ms) is not None]
        return cls(len(found), sum(1 for i in found if i.retries),
                   sum(1 for i in found if i.recovered_at is not None),
                   round(statistics.median(times), 1) if times else None,
                   round(max(times), 1) if times else None)


@dataclass(frozen=True)
class Behaviour:
    sessions: int
    tool_calls: int
    model_calls: int
    disrupted_model_calls: int
    disrupted_calls: int
    incomplete_calls: int
    made_up_tool_calls: int
    unattached_faults: int  # fired, but joined to no call (a reply on another connection that never ended)
    faults_by_component: dict[str, int]
    faults_by_type: dict[str, int]
    recovery: Recovery
    recovery_by_component: dict[str, Recovery] = field(default_factory=dict)


def behaviour(sessions: Iterable[Session]) -> Behaviour:
    sessions = list(sessions)
    calls = [call for session in sessions for call in session.tool_calls]
    model_calls = [call for session in sessions for call in session.model_calls]
    faults = [fault for session in sessions for fault in session.faults]
    by_agent: dict[str, list[Session]] = {}
    for session in sessions:  # one run is one agent (a drill's run), whatever sessions it opened
        by_agent.setdefault(session.run_id, []).append(session)
    found = [incident for agent in by_agent.values() for incident in incidents(agent)]
    by_component: dict[str, list[Incident]] = {}
    for incident in found:
        by_component.setdefault(incident.component, []).append(incident)
    return Behaviour(
        sessions=len(sessions), tool_calls=len(calls),
        model_calls=len(model_calls), disrupted_model_calls=sum(1 for call in model_calls if call.disrupted),
        disrupted_calls=sum(1 for call in calls if call.disrupted),
        incomplete_calls=sum(1 for call in calls if call.incomplete),
        made_up_tool_calls=sum(1 for call in calls if calls_a_made_up_tool(call)),
        unattached_faults=sum(len(session.unattached) for session in sessions),
        faults_by_component=dict(collections.Counter(f.component for f in faults).most_common()),
        faults_by_type=dict(collections.Counter(f.fault for f in faults).most_common()),
        recovery=Recovery.of(found),
        recovery_by_component={name: Recovery.of(group) for name, group in sorted(by_component.items())})
