"""What the agent did about the faults, read from the call log.

An incident is a tool call (or a turn to the model API) that a fault disrupted: the agent got an
error, a stand-in, a broken exchange or nothing instead of the real answer, or the call failed
because of what the fault did (see logfile.Call.disrupted). Then, per incident:

- retried: the agent made the same call again as its very next one (a tool call: the same tool; a
  turn to the model: the same turn), and repeating that call is not simply what it does anyway: an
  agent that also calls a tool straight after a call of it that got through (a loop over cities, a
  poll) shows no retries of that tool, as its repeats are no reaction to the failure. The log holds no
  arguments, so this errs on the side of counting too few retries, never too many.
- got through on a retry: one of its repeats was answered undisrupted; the time runs from the end of
  the disrupted call to the end of the one that got through.
- recovered: the run reached its goal (a drill's verdict: passed) after the fault. A log alone says
  nothing of the goal: recovery is then not known (None).

Incidents follow the agent across the sessions of its run (a retrying agent reconnects).

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
from itertools import pairwise
from typing import Any

from chaosproxy.records.logfile import MODEL, TOOL, Call, Session

MADE_UP_TOOL_FAULTS = frozenset({"unknown_tool", "tool_flood", "distractor_tool"})
# What an agent sends on a fresh connection before it can call a tool again.
ATTEMPT_STEPS = frozenset({"initialize", "notifications/initialized", "server/discover", "tools/list"})


@dataclass(slots=True)
class Incident:
    """One call a fault disrupted, and what the agent did next."""

    component: str  # of the fault that disrupted the call
    started: float
    reached_goal: bool | None  # its run's verdict, when known
    retries: int = 0  # repeats of the call until one got through (or the run ended)
    retried: bool = False
    got_through_at: float | None = None

    @property
    def time_to_get_through_ms(self) -> float | None:
        return None if self.got_through_at is None else (self.got_through_at - self.started) * 1000


def incidents(sessions: Iterable[Session]) -> list[Incident]:
    """The incidents of one agent (one run), whose calls may span several sessions.

    A disrupted call that is not a tool call (a 429 on `initialize`, a lost session) while an
    incident is open is a repeat blocked before its tools/call: it is a try of the incident opened
    last, which it most likely was.
    """
    sessions = list(sessions)
    goal = next((s.reached_goal for s in sessions if s.reached_goal is not None), None)
    marked = sorted(((call, step) for session in sessions for call, step in _steps(session)),
                    key=lambda pair: pair[0].ts)
    found: list[Incident] = []
    for kind in (TOOL, MODEL):
        found += _incidents_of([(call, step == kind) for call, step in marked if step in (kind, None)], goal)
    return sorted(found, key=lambda incident: incident.started)


def _incidents_of(calls: list[tuple[Call, bool]], goal: bool | None) -> list[Incident]:
    """The incidents among one kind of step (tool calls, or turns to the model API), in time order;
    `calls` marks each as such a step, or as an attempt step (initialize, tools/list) between them."""
    steps = [call for call, is_step in calls if is_step]
    routine = {call.identity for call, after in pairwise(steps) if not call.disrupted
               and after.identity == call.identity}
    found: list[Incident] = []
    open_incidents: dict[tuple[Any, ...], Incident] = {}
    previous: Incident | None = None  # the incident the agent's previous step opened, if it did
    for call, is_step in calls:
        if not is_step:
            if call.disrupted and call.method in ATTEMPT_STEPS and open_incidents:
                latest = max(open_incidents.values(), key=lambda incident: incident.started)
                latest.retries += 1
                latest.retried |= latest is previous  # reconnecting at once to call it again
            continue
        incident = open_incidents.get(call.identity)
        if incident is not None:
            incident.retries += 1
            incident.retried |= incident is previous
            if not call.disrupted:
                if incident.retried:
                    incident.got_through_at = call.ts
                del open_incidents[call.identity]
            previous = incident if call.disrupted else None
        elif call.disrupted:
            cause = next((fault for fault in call.faults if fault.disruptive), call.faults[0])
            previous = Incident(cause.component, call.ts, goal)
            found.append(previous)
            if call.identity not in routine:
                open_incidents[call.identity] = previous
        else:
            previous = None
    return found


def _steps(session: Session) -> Iterator[tuple[Call, str | None]]:
    """Each call, and which kind of the agent's steps it is: a tool call, a turn to its model API, or None."""
    return ((call, call.kind if call.kind in (TOOL, MODEL) else None) for call in session.calls)


def calls_a_made_up_tool(call: Call) -> bool:
    return any(fault.fault in MADE_UP_TOOL_FAULTS for fault in call.faults)


@dataclass(frozen=True, slots=True)
class Recovery:
    """How incidents went: retried, got through on a retry (and how fast), and recovered (the run
    reached its goal; None when no incident's run has a verdict, as in a log alone)."""

    incidents: int
    retried: int
    got_through: int
    recovered: int | None
    judged: int  # incidents whose run has a verdict: what `recovered` is out of
    median_time_to_get_through_ms: float | None
    max_time_to_get_through_ms: float | None

    @classmethod
    def of(cls, found: list[Incident]) -> Recovery:
        times = [t for incident in found if (t := incident.time_to_get_through_ms) is not None]
        judged = [incident for incident in found if incident.reached_goal is not None]
        return cls(len(found), sum(1 for i in found if i.retried), len(times),
                   sum(1 for i in judged if i.reached_goal) if judged else None, len(judged),
                   round(statistics.median(times), 1) if times else None,
                   round(max(times), 1) if times else None)


@dataclass(frozen=True)
class Behaviour:
    sessions: int
    tool_calls: int
    model_calls: int
    disrupted_model_calls: int
    failed_upstream_model_calls: int
    perturbed_calls: int  # a fault fired on it (changed, delayed or replaced what the agent got)
    disrupted_calls: int  # a fault kept the real answer from the agent, or made the call fail
    failed_upstream_calls: int  # failed with no fault to blame: the upstream's own error
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
        failed_upstream_model_calls=sum(1 for call in model_calls if call.failed_upstream),
        perturbed_calls=sum(1 for call in calls if call.faults),
        disrupted_calls=sum(1 for call in calls if call.disrupted),
        failed_upstream_calls=sum(1 for call in calls if call.failed_upstream),
        incomplete_calls=sum(1 for call in calls if call.incomplete),
        made_up_tool_calls=sum(1 for call in calls if calls_a_made_up_tool(call)),
        unattached_faults=sum(len(session.unattached) for session in sessions),
        faults_by_component=dict(collections.Counter(f.component for f in faults).most_common()),
        faults_by_type=dict(collections.Counter(f.fault for f in faults).most_common()),
        recovery=Recovery.of(found),
        recovery_by_component={name: Recovery.of(group) for name, group in sorted(by_component.items())})
