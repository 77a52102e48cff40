"""Reading a perturbation log back: each session's calls in order, with the faults that hit each call.

A fault line comes before the call line it belongs to (faults are logged as they fire, a call when
it ends). They are joined by JSON-RPC id within the session, or, for plain HTTP calls, by the rule
names the call line lists (and a fault on a response body by its request's method, path and time).
A fault on a reply that reached the agent on another connection (legacy HTTP+SSE) joins the last call
with its id; one that joins no call stays on the session, unattached.

Each call is classified on its own (`Call.kind`), never by the session it shares: one client's REST
requests and its MCP `initialize` come from one address, so one session may hold both.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, cast

import orjson

from chaosproxy.protocols import a2a
from chaosproxy.telemetry.log_schema import INCOMPLETE, CallLine, Event, FaultLine, Key, Line, Outcome

# Actions that keep the real answer from the agent: it gets an error, a fake, a broken frame or nothing.
# (A content fault's new body, `garble` at level content, is a perturbed answer, not a withheld one.)
DISRUPTIVE_ACTIONS = frozenset({"respond", "reply", "hang", "reset", "truncate", "garble", "cutstream",
                                "withhold", "endstream"})  # (the last two: an A2A stream's events kept back)
# A misspelt tool name is passed on, and upstream answers it with an error.
DISRUPTIVE_FAULTS = frozenset({"unknown_tool"})
# Actions that hold a call up: a call that then failed (the agent gave up waiting) failed by the fault.
DELAYING_ACTIONS = frozenset({"delay", "drip"})
TOOL, MODEL, PLUMBING = "tool", "model", "plumbing"  # what a call is (Call.kind)
CLOCK_SLACK_S = 0.01  # a call's start is its end less its duration, measured on another clock


def read_events(path: str | Path) -> Iterator[dict[str, Any]]:
    """The log's JSON objects in order; a line cut short by a killed process is skipped."""
    with open(path, "rb") as stream:
        for line in stream:
            if not line.strip():
                continue
            try:
                event = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue
            if isinstance(event, dict):
                yield event


def _time(event: Line) -> float:
    return datetime.fromisoformat(event[Key.TS]).timestamp()


@dataclass(slots=True)
class Fault:
    ts: float
    rule: str
    fault: str
    component: str
    level: str | None
    phase: str | None
    action: str | None
    tool: str | None
    rpc_id: Any
    params: dict[str, Any]
    effect: dict[str, Any]
    http_method: str | None = None
    path: str | None = None

    @classmethod
    def from_event(cls, event: FaultLine) -> Fault:
        return cls(_time(event), event.get(Key.RULE, "?"), event.get(Key.FAULT, "?"),
                   event.get(Key.COMPONENT, "?"), event.get(Key.LEVEL), event.get(Key.PHASE), event.get(Key.ACTION),
                   event.get(Key.TOOL), event.get(Key.RPC_ID), event.get(Key.PARAMS) or {},
                   event.get(Key.EFFECT) or {}, event.get(Key.HTTP_METHOD), event.get(Key.PATH))

    @property
    def disruptive(self) -> bool:
        """The fault kept the real answer from the agent (or, `unknown_tool`, had upstream refuse the call)."""
        if self.action == "garble" and self.level == "content":
            return False
        return self.action in DISRUPTIVE_ACTIONS or self.fault in DISRUPTIVE_FAULTS

    @property
    def could_fail(self) -> bool:
        """The fault could be why its call failed: it acted before upstream answered (a request
        changed or held) or held the answer up until the agent gave up."""
        return self.disruptive or self.phase == "request" or self.action in DELAYING_ACTIONS


@dataclass(slots=True)
class Call:
    ts: float  # when it ended
    duration_ms: float
    method: str | None
    tool: str | None
    rpc_id: Any
    http_method: str | None
    path: str | None
    status: int | None
    outcome: str
    rules: list[str]
    api: str | None = None  # a model-API call (LLM-gateway mode): which API, the model asked for, the turn
    model: str | None = None
    turn: int | None = None
    route: str | None = None
    faults: list[Fault] = field(default_factory=list)
    kind: str = TOOL  # tool, model or plumbing: set by read_sessions, which sees the whole run

    @classmethod
    def from_event(cls, event: CallLine) -> Call:
        return cls(_time(event), float(event.get(Key.DURATION_MS) or 0), event.get(Key.METHOD),
                   event.get(Key.TOOL), event.get(Key.RPC_ID), event.get(Key.HTTP_METHOD), event.get(Key.PATH),
                   event.get(Key.STATUS), event.get(Key.OUTCOME, Outcome.OK), list(event.get(Key.FAULTS) or []),
                   event.get(Key.API), event.get(Key.MODEL), event.get(Key.TURN), event.get(Key.ROUTE))

    @property
    def start(self) -> float:
        return self.ts - self.duration_ms / 1000

    @property
    def label(self) -> str:
        """What the agent called: the tool by the name it asked for (a fault may have sent on another),
        else the model API and model, else the JSON-RPC method, else the HTTP method and path."""
        if self.api is not None:
            return f"{self.api} {self.model}" if self.model else self.api
        if self.method == "tools/call":
            asked = (fault.tool for fault in self.faults if fault.phase == "request" and fault.tool)
            if name := next(asked, None) or self.tool:
                return name
        return self.method or f"{self.http_method or '?'} {self.path or '?'}"

    @property
    def incomplete(self) -> bool:
        return self.outcome in INCOMPLETE

    @property
    def failed(self) -> bool:
        """The agent got no good answer: an error status, a broken exchange, a stand-in, or nothing."""
        return self.outcome != Outcome.OK or (self.status is not None and self.status >= 400)

    @property
    def disrupted(self) -> bool:
        """A fault kept the real answer from the agent, or made the call fail (see Fault.could_fail)."""
        return any(fault.disruptive for fault in self.faults) or (
            self.failed and any(fault.could_fail for fault in self.faults))

    @property
    def failed_upstream(self) -> bool:
        """Failed with no fault to blame: the upstream's own error (a 404, a 500), or the agent gave
        up on an answer no fault held up."""
        return self.failed and not self.disrupted

    @property
    def identity(self) -> tuple[Any, ...]:
        """What makes a later call the same call again: the tool (for a model-API call, its turn)."""
        return (self.label, self.turn) if self.kind == MODEL else (self.label,)

    def claims(self, fault: Fault) -> bool:
        if self.rpc_id is not None:
            return fault.rpc_id == self.rpc_id
        if fault.rpc_id is not None and self.api is None:  # (a model-API fault's id is its tool call's)
            return False
        # A plain HTTP call: by the rules its line names, or, for a fault on its response body that a
        # log line did not name, by its request and its time (it fired while the call was under way).
        return fault.rule in self.rules or (
            fault.phase == "response" and (fault.http_method, fault.path) == (self.http_method, self.path)
            and self.start - CLOCK_SLACK_S <= fault.ts <= self.ts + CLOCK_SLACK_S)


@dataclass(slots=True)
class Session:
    run_id: str
    seed: int | None
    session: str
    transport: str | None
    calls: list[Call] = field(default_factory=list)
    unattached: list[Fault] = field(default_factory=list)
    reached_goal: bool | None = None  # whether its run passed (a drill's verdict); None: not known (a log)

    @property
    def tool_calls(self) -> list[Call]:
        """Calls of tools: MCP tools/call requests, and the requests of plain HTTP tool APIs."""
        return [call for call in self.calls if call.kind == TOOL]

    @property
    def model_calls(self) -> list[Call]:
        """Calls of the agent's model API (LLM-gateway mode): each turn of its tool loop."""
        return [call for call in self.calls if call.kind == MODEL]

    @property
    def faults(self) -> list[Fault]:
        return [fault for call in self.calls for fault in call.faults] + self.unattached

    @property
    def started(self) -> float:
        times = [call.start for call in self.calls] + [fault.ts for fault in self.unattached]
        return min(times, default=0.0)


def read_sessions(path: str | Path) -> list[Session]:
    """The log's sessions in order of appearance, per run id (an appended-to log keeps its runs apart)."""
    sessions: dict[tuple[str, str], Session] = {}
    pending: dict[tuple[str, str], list[Fault]] = {}
    for event in read_events(path):
        kind = event.get(Key.EVENT)
        if kind not in (Event.FAULT, Event.CALL):
            continue
        key = (str(event.get(Key.RUN_ID)), str(event.get(Key.SESSION)))
        session = sessions.get(key)
        if session is None:
            session = sessions[key] = Session(key[0], event.get(Key.SEED), key[1], event.get(Key.TRANSPORT))
        waiting = pending.setdefault(key, [])
        if kind == Event.FAULT:
            waiting.append(Fault.from_event(cast(FaultLine, event)))
            continue
        call = Call.from_event(cast(CallLine, event))
        unclaimed: list[Fault] = []
        for fault in waiting:
            (call.faults if call.claims(fault) else unclaimed).append(fault)
        waiting[:] = unclaimed
        session.calls.append(call)
    for key, waiting in pending.items():
        calls = sessions[key].calls
        for fault in waiting:
            owner = next((call for call in reversed(calls)
                          if call.rpc_id is not None and call.rpc_id == fault.rpc_id), None)
            (owner.faults if owner is not None else sessions[key].unattached).append(fault)
    runs: dict[str, list[Call]] = {}
    for (run_id, _), session in sessions.items():
        runs.setdefault(run_id, []).extend(session.calls)
    for calls in runs.values():
        classify(calls)
    return list(sessions.values())


def classify(calls: list[Call]) -> None:
    """Set each call's kind, from the call itself and the run's JSON-RPC traffic (all its sessions).

    A model-API call is a turn of the agent's loop; a JSON-RPC `tools/call` (or an A2A message sent to
    another agent) is a tool call and any other JSON-RPC message MCP's (or A2A's) plumbing. A plain
    HTTP request is a REST tool call, unless it is an MCP endpoint's own: a request without JSON-RPC
    (a GET stream, a DELETE) on a path that carries JSON-RPC, or a GET that was open while JSON-RPC
    went to its route (legacy HTTP+SSE's stream, whose POSTs go to another path).
    """
    rpc_paths = {(call.route, call.path) for call in calls if call.method is not None}
    rpc_starts: dict[str | None, list[float]] = {}
    for call in calls:
        if call.method is not None:
            rpc_starts.setdefault(call.route, []).append(call.start)
    for call in calls:
        if call.api is not None:
            call.kind = MODEL
        elif call.method is not None:
            call.kind = TOOL if call.method == "tools/call" or call.method in a2a.SENDS_ON_THE_WIRE else PLUMBING
        elif (call.route, call.path) in rpc_paths or (call.http_method == "GET" and any(
                call.start <= start <= call.ts for start in rpc_starts.get(call.route, ()))):
            call.kind = PLUMBING
        else:
            call.kind = TOOL
