"""The engine: which rules match a message, whether their gates let them fire, what they do.

It knows nothing about sockets; adapters hand it `Message`s and carry out the actions it returns.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import functools
import random
import re
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Unpack

import orjson

from chaosproxy.engine.actions import Action, Garble, Reply, Respond, Rewrite, Skip, ends_exchange
from chaosproxy.engine.interest import Interest
from chaosproxy.engine.message import Message, Phase
from chaosproxy.engine.scenario import Match, Rule, Scenario
from chaosproxy.engine.session_state import AgentView, SessionState
from chaosproxy.engine.sessions import AGENT_HEADER, MAX_SESSIONS, SESSION_TTL_S, Session, SessionTable
from chaosproxy.faults import Fault, FaultContext, Level
from chaosproxy.faults._effects import call_effect
from chaosproxy.protocols.mcp import call_result, error_reply, listed_tools, result_reply
from chaosproxy.telemetry.log import PerturbationLog, digest, ops
from chaosproxy.telemetry.log_schema import DigestFields, FaultFields, ModelCallFields, RoutedFields
from chaosproxy.telemetry.tracing import NO_TRACING, Tracing


def draw_seed() -> int:
    return secrets.randbits(32)


def _glob(pattern: str, *, fold_case: bool = False) -> Callable[[str], bool]:
    regex = re.compile(fnmatch.translate(pattern), re.IGNORECASE if fold_case else 0)
    return lambda value: regex.match(value) is not None


@dataclass(slots=True)
class Fired:
    """A fault that fired on a message, with the action it chose."""

    rule: Rule
    fault: Fault
    action: Action


MAX_KEYS = 4096  # content keys a rule remembers per session (LLM history), oldest forgotten first


@dataclass(slots=True)
class Tally:
    """A rule's totals over the run, whatever becomes of sessions and gate counters (the console's numbers).

    `fired` counts the rule's fault lines: each time the agent got something other than what was sent
    (a tool list renamed, each call routed back, a resent history perturbed again), as /metrics does.
    `matched` counts the messages it matched (each resend too) and the calls it routed.
    """

    matched: int = 0
    fired: int = 0


@dataclass(slots=True)
class _Counter:
    """A rule's gate counters in one session (or in all, with scope: global)."""

    matched: int = 0
    fired: int = 0
    scratch: dict[str, Any] = field(default_factory=dict)
    # content key -> (match index it got when first seen, whether it fired then)
    keys: OrderedDict[str, tuple[int, bool]] = field(default_factory=OrderedDict)


class _CompiledRule:
    """A rule with its globs compiled, its per-session (or global) counters and its totals."""

    def __init__(self, rule: Rule, tally: Tally) -> None:
        self.rule = rule
        self.tally = tally
        m = rule.match
        checks: list[Callable[[Message], bool]] = []
        if m.transport is not None:
            is_transport = _glob(m.transport)
            checks.append(lambda msg: is_transport(msg.transport))
        if m.route is not None:
            is_route = _glob(m.route)
            checks.append(lambda msg: msg.route is not None and is_route(msg.route))
        if m.http_method is not None:
            is_method = _glob(m.http_method, fold_case=True)
            checks.append(lambda msg: msg.http_method is not None and is_method(msg.http_method))
        if m.path is not None:
            is_path = _glob(m.path)
            checks.append(lambda msg: msg.path is not None and is_path(msg.path))
        for name, value in m.header.items():
            checks.append(_header_check(name, _glob(value)))
        self.head_checks = list(checks)  # the checks an HTTP request's head alone can answer
        if m.api is not None:
            is_api = _glob(m.api)
            checks.append(lambda msg: msg.api is not None and is_api(msg.api))
        if m.model is not None:
            is_model = _glob(m.model)
            checks.append(lambda msg: msg.model is not None and is_model(msg.model))
        checks += _a2a_checks(m)
        if m.method is not None:
            is_rpc = _glob(m.method)
            checks.append(lambda msg: (method := msg.method) is not None and is_rpc(method))
        if m.tool is not None:
            is_tool = _glob(m.tool)
            checks.append(lambda msg: (tool := msg.tool) is not None and is_tool(tool))
        self.checks = checks
        self.on_messages = rule.fault.on_messages
        self.methods = rule.fault.methods
        # A JSON-RPC-level fault answers a request or breaks a reply, both of which carry an id: a
        # notification is neither, so it does not use up the rule's gates.
        self.ids_only = rule.fault.level is Level.JSONRPC
        # Content faults also read plain (non-JSON-RPC) bodies: a REST tool's JSON or text.
        self.on_plain_bodies = rule.fault.level is Level.CONTENT
        self.needs_body = m.method is not None or m.tool is not None or self.on_messages \
            or m.a2a_method is not None or m.skill is not None  # (a JSON-RPC A2A request names them in its body)
        self.rpc_only = m.method is not None or m.tool is not None  # only JSON-RPC requests carry these
        self.told_plain = False  # told once in the log that plain HTTP requests never match it
        # Per session key; the global counter under None, which no session key can be.
        self.counters: dict[str | None, _Counter] = {}

    def matches(self, msg: Message) -> bool:
        rpc = msg.rpc if self.on_messages else None
        if self.on_messages and rpc is None and (not self.on_plain_bodies or _is_batch(msg.body)):
            return False  # a JSON-RPC batch is no plain body: its ids and envelopes must stay as they are
        if rpc is not None and ((self.methods is not None and msg.method not in self.methods)
                                or (self.ids_only and "id" not in rpc)):
            return False  # a JSON-RPC message the fault cannot change: it does not count toward the gates
        return all(check(msg) for check in self.checks)

    def could_match(self, msg: Message) -> bool:
        """True unless what is known before the body (route, path, headers, the request) rules it out."""
        return self.rule.enabled and all(check(msg) for check in self.checks)

    def counter(self, session: str) -> _Counter:
        key = session if self.rule.scope == "session" else None
        counter = self.counters.get(key)
        if counter is None:
            counter = self.counters[key] = _Counter()
        return counter


def _same_counting(old: Rule, new: Rule) -> bool:
    """True when a rule's counters still mean the same under its new version."""
    ignored = {"probability", "enabled", "description"}
    return old.model_dump(exclude=ignored) == new.model_dump(exclude=ignored)


def _a2a_checks(m: Match) -> list[Callable[[Message], bool]]:
    """The checks of a rule's A2A keys, on what the A2A relay read of a message (`Message.a2a`)."""
    def check(read: Callable[[Any], str | None], is_value: Callable[[str], bool]) -> Callable[[Message], bool]:
        return lambda msg: (call := msg.a2a) is not None and (value := read(call)) is not None and is_value(value)

    keys = (("a2a_method", lambda call: call.method), ("skill", lambda call: call.skill),
            ("task_state", lambda call: call.state), ("a2a_agent", lambda call: call.agent))
    return [check(read, _glob(pattern)) for key, read in keys if (pattern := getattr(m, key)) is not None]


def _header_check(name: str, is_value: Callable[[str], bool]) -> Callable[[Message], bool]:
    def check(msg: Message) -> bool:
        value = (msg.request or msg).headers.get(name)
        return value is not None and is_value(value)
    return check


class Engine:
    """Decides, per message, which faults fire. One engine serves every adapter of a run."""

    def __init__(self, scenario: Scenario, *, seed: int, log: PerturbationLog,
                 session_ttl: float = SESSION_TTL_S, max_sessions: int = MAX_SESSIONS) -> None:
        self.seed = seed
        self.log = log
        self.started = time.monotonic()
        self._session_limits: dict[str, Any] = {"ttl": session_ttl, "limit": max_sessions}
        self.start_routes = dict(scenario.routes)  # what traffic follows; a scenario swap cannot change them
        self.tracing: Tracing = NO_TRACING  # set by whoever runs the engine (chaosproxy.telemetry.tracing)
        # agents' connections its listeners refused or closed, by reason (counted by the HTTP adapter)
        self.refused: dict[str, int] = {}
        self._compiled: list[_CompiledRule] = []
        self.tallies: dict[str, Tally] = {}  # by rule name: the run's totals, which no reset or session end undoes
        self._under_way: dict[str, int] = {}  # calls being decided per session keyed by a client address alone
        self._told_shared = False  # told once that several calls shared such a session at once
        self.load(scenario, keep_state=False)

    def load(self, scenario: Scenario, *, keep_state: bool = True) -> None:
        """Put a scenario in force (atomically: a message is decided under one scenario or the other).

        A swap mid-run keeps what the agent has seen: session state (tool routes, call counts) and
        the counters of every rule that is unchanged apart from probability or enabled, so a
        `first: 3` rule does not start over because another rule was patched.
        """
        previous = {rule.rule.name: rule for rule in self._compiled} if keep_state else {}
        # totals go on under the same name, as /metrics' series do, whatever changed in the rule
        self.tallies = {rule.name: self.tallies.get(rule.name) or Tally() for rule in scenario.rules}
        compiled = [_CompiledRule(rule, self.tallies[rule.name]) for rule in scenario.rules]
        for rule in compiled:
            old = previous.get(rule.rule.name)
            if old is not None and _same_counting(old.rule, rule.rule):
                rule.counters = old.counters
        # What decide() asks, by (phase, wire, messages): the rules in the order written, whatever their level.
        self._in_order = {(phase, wire, messages): [rule for rule in compiled if rule.rule.fault.phase is phase
                                                    and (messages if rule.on_messages else wire)]
                          for phase in Phase for wire in (False, True) for messages in (False, True)}
        self.scenario = scenario
        self._compiled = compiled
        self.interest = Interest(scenario.rules, compiled)  # what adapters ask before building a message
        self._rule_order = {rule.name: i for i, rule in enumerate(scenario.rules)}
        if not keep_state:
            self.sessions = SessionTable(self._session_changed, **self._session_limits)  # a new one: state
            # kept beside it elsewhere (the model-API relay's memory) sees the reset by its identity
            # Per upstream (transport and route): bounded by the configuration, not by the traffic.
            self.views: dict[str, AgentView] = {}

    def end_session(self, key: str, reason: str = "ended") -> None:
        """The agent ended its session (DELETE, the stdio server's exit): its state goes now."""
        self.sessions.end(key, reason)

    def _session_changed(self, key: str, change: str, reason: str) -> None:
        """A session's state was dropped (its per-session counters with it), or a dropped one came back."""
        if change == "dropped":
            for compiled in self._compiled:
                compiled.counters.pop(key, None)
        self.log.session(session=key, change=change, reason=reason)

    def see(self, session: str, transport: str, route: str | None, agent: str | None = None) -> None:
        """A request of `session` arrived, whatever rule it may meet: the session is numbered now if it is
        new (named after `agent` when the agent named itself), so that draws do not depend on which rules
        happen to match which requests. Adapters call it for every request while rules are loaded."""
        if self.sessions.touch(session) is None:  # (the common case first: a session already held)
            self._entry(session, _view_of(transport, route), agent)

    def session(self, key: str, view: str = "-") -> SessionState:
        """The state of session `key`; a new session shares the agent view named `view`."""
        return self._entry(key, view).state

    def _entry(self, key: str, view: str, agent: str | None = None) -> Session:
        """Session `key` in the bounded table, marked used now (made, with its shared view, when new)."""
        return self.sessions.touch(key) or self.sessions.enter(key, lambda: self._fresh(view), agent=agent)

    def _fresh(self, view: str) -> SessionState:
        """A new session's state, sharing the agent view named `view`."""
        shared = self.views.get(view)
        if shared is None:
            shared = self.views[view] = AgentView()
        return SessionState(shared)

    def session_of(self, msg: Message) -> SessionState:
        """The state of `msg`'s session, whose agent view is shared by every session on its upstream
        (transport and route): tool routes and schemas survive a reconnect under a new session id."""
        return self.session(msg.session, _view_name(msg))

    def call_began(self, session: str) -> None:
        """A call that rules may act on began in a session keyed by its client's address alone (no session
        id, no agent name). Two at once (several agents behind one address, or one calling in parallel)
        are counted in the order they arrive, so which faults each meets depends on timing: said once,
        with what to do about it."""
        if self._told_shared:
            return
        under_way = self._under_way[session] = self._under_way.get(session, 0) + 1
        if under_way > 1:
            self._told_shared = True
            ops.warning("calls from %s without an Mcp-Session-Id or %s header were under way at once: they "
                        "count in one session, in the order they arrive, so which faults each meets depends on "
                        "timing. If several agents share this address, give each a name of its own in %s "
                        "for the same faults in every run.", session, AGENT_HEADER, AGENT_HEADER)

    def call_ended(self, session: str) -> None:
        """A call call_began told of is over."""
        under_way = self._under_way.pop(session, 0) - 1
        if under_way > 0:
            self._under_way[session] = under_way

    def _learn(self, msg: Message, session: SessionState) -> None:
        """Remember each tool's output schema as upstream lists it, before any rule reshapes the list,
        and its latest real structured result, so that faults keep the tool's results valid for it."""
        view = session.view
        result = call_result(msg)
        if result is not None:
            if result.get("structuredContent") is not None and not result.get("isError") and msg.tool:
                view.examples[msg.tool] = result["structuredContent"]
            return
        tools = listed_tools(msg)
        if tools is not None:
            _learn_tools(view, tools)

    def lists_tools_first(self, msg: Message) -> bool:
        """True when the adapter should list upstream's tools itself before `msg`, a tools/call request,
        goes on: a rule that keeps results valid for the tool's outputSchema may act on its result, and
        upstream never listed the tool to the proxy (the agent listed them on another connection, or
        lists lazily, after a call, as the Python SDK client does). Asked once per upstream."""
        if msg.method != "tools/call" or msg.tool is None or msg.phase is not Phase.REQUEST:
            return False
        view = self.session_of(msg).view
        return msg.tool not in view.listed and not view.asked_upstream and any(
            fault.needs_output_schema for fault in self.interest.could_match(msg, Phase.RESPONSE))

    def learn_listing(self, msg: Message, tools: list[Any] | None) -> None:
        """What upstream listed when the adapter asked it for `msg` (None: it could not be had)."""
        view = self.session_of(msg).view
        view.asked_upstream = True
        if tools is not None:
            _learn_tools(view, tools)

    def decide(self, msg: Message, *, wire: bool = True, messages: bool = True,
               key: str | None = None, carries: Callable[[Action], bool] | None = None) -> list[Fired]:
        """The faults that fire on `msg`, in rule order, each already logged.

        `wire` and `messages` choose between faults acting on the transport (a whole HTTP response)
        and faults acting on JSON-RPC messages (each message inside it); stdio asks for both.
        A Rewrite is applied to `msg` at once, so later rules and the adapter see the new message.

        `key` names the message's content (a model-API conversation resends its history every turn):
        a message seen before under the same key gets the decision it got then, drawn from a stream
        of (seed, rule, key) alone, and counts as one match however often it is resent.

        `carries` says whether the caller can carry out an action on what `msg` stands for (an A2A
        relay's view of a task has no isError flag to set on a working update): one it cannot changes
        nothing the agent gets, so, like a rewrite that changes nothing, it does not fire.
        """
        fired: list[Fired] = []
        entry = self._entry(msg.session, _view_name(msg))  # before any counter: they go when it goes
        steps: list[tuple[str, Callable[[], Fired | list[Fired] | None]]] = []
        if msg.phase is Phase.REQUEST and msg.method == "tools/call":
            steps.append(("tool routes", lambda: self._route(msg, entry.state)))
        elif messages and msg.phase is Phase.RESPONSE and msg.rpc is not None and msg.method in _LEARNED:
            steps.append(("learning output schemas", lambda: self._learn(msg, entry.state)))
        steps += [(rule.rule.name, functools.partial(self._gate_and_act, rule, msg, entry, key, carries))
                  for rule in self._in_order[msg.phase, wire, messages]]
        for name, step in steps:
            try:
                outcome = step()
            except Exception as exc:  # fail open: a broken fault must not break the agent's traffic
                ops.exception("%s failed on a %s; passing it through", name, msg.phase)
                self.log.error(rule=name, error=repr(exc))
                continue
            outcomes = [outcome] if isinstance(outcome, Fired) else outcome or []
            fired += outcomes
            if any(ends_exchange(one.action) and not _rewrites_plain_body(one, msg) for one in outcomes):
                break
        rewrites = [one for one in fired if _rewrites_plain_body(one, msg)]
        for one in rewrites[:-1]:  # adapters send the first Garble's bytes: make them the last one's
            one.action = rewrites[-1].action
        return fired

    def _route(self, msg: Message, session: SessionState) -> list[Fired]:
        """Calls to a tool name a fault showed the agent go where that fault said.

        Rules reshape the tool list in rule order, so a call is routed back through them in reverse:
        each rule's route for the current name (renaming it, renaming arguments back, refusing an
        old shape, or answering it) applies in turn, down to the first rule. Each rule that routed
        the call is logged and attached to it.
        """
        session.tool_calls += 1
        rpc = msg.rpc
        name = msg.tool
        if name is None or not session.routes or rpc is None:
            return []
        arguments = rpc["params"].get("arguments")
        arguments = dict(arguments) if isinstance(arguments, dict) else {}
        shown, below = name, len(self._rule_order)
        fired: list[Fired] = []
        while True:
            layer = max(((self._rule_order[route.rule], route) for route in session.routes.layers(name)
                         if self._rule_order.get(route.rule, below) < below), key=lambda pair: pair[0], default=None)
            if layer is None:
                break
            below, route = layer
            rule = self.scenario.rules[below]
            action: Action
            if old_shape := sorted(route.refused & arguments.keys()):
                action = Reply(error_reply(msg, -32602, f"Invalid params: unexpected argument {old_shape[0]!r} "
                                                        f"for tool {shown!r}"))
            elif route.reply is not None:
                action = Reply(result_reply(msg, route.reply["result"]) if "result" in route.reply
                               else {"jsonrpc": "2.0", "id": rpc.get("id"), **route.reply})
            else:
                arguments = {route.arguments.get(key, key): value for key, value in arguments.items()}
                name = route.real or name
                params = {**rpc["params"], "name": name} | ({"arguments": arguments} if arguments else {})
                if params == rpc["params"]:
                    continue  # a call already in the upstream's shape (a drifted tool called the old way)
                action = Rewrite({**rpc, "params": params}, effect=call_effect(rpc["params"], params))
                rpc = action.message
            self.tallies[rule.name].matched += 1
            self._log_fault(rule, msg, action, session.tool_calls, routed_to=route.real)
            fired.append(Fired(rule, rule.fault, action))
            if isinstance(action, Reply):
                break
            msg.replace(rpc)
        return fired

    def _gate_and_act(self, compiled: _CompiledRule, msg: Message, entry: Session, key: str | None = None,
                      carries: Callable[[Action], bool] | None = None) -> Fired | None:
        rule = compiled.rule
        if not rule.enabled or not compiled.matches(msg):
            if rule.enabled and compiled.rpc_only and not compiled.told_plain and msg.phase is Phase.REQUEST \
                    and msg.transport == "http" and msg.rpc is None:
                compiled.told_plain = True  # a `tool` rule in front of a REST API would otherwise stay silent
                self.log.skip(rule=rule.name, fault=rule.fault.type, transport=msg.transport, session=msg.session,
                              http_method=msg.http_method, path=msg.path,
                              reason="the rule matches `method`/`tool`, which only JSON-RPC (MCP) requests carry; "
                                     "plain HTTP requests like this one never match it (told once)")
            return None
        compiled.tally.matched += 1
        session = entry.state
        rule.fault.observe(msg, session)
        counter = compiled.counter(msg.session)
        seen = counter.keys.get(key) if key is not None else None
        if seen is None:
            counter.matched += 1
        index = counter.matched if seen is None else seen[0]
        if key is not None:
            counter.keys[key] = seen or (index, False)
            counter.keys.move_to_end(key)
            if len(counter.keys) > MAX_KEYS:
                counter.keys.popitem(last=False)
        now = time.monotonic()
        if rule.window is not None:
            elapsed = now - self.started
            end = rule.window.start_s + (rule.window.duration_s or float("inf"))
            if not rule.window.start_s <= elapsed < end:
                return None
        if index <= rule.after or (index - rule.after) % rule.every:
            return None
        if rule.first is not None and counter.fired >= rule.first and not (seen and seen[1]):
            return None
        if key is not None:  # content-keyed: the same message meets the same fault wherever it is resent
            rng = random.Random(f"{self.seed}:{rule.name}:{key}")
        else:
            # One stream per (seed, rule, session, match index): the same run meets the same faults
            # however requests from different sessions interleave. A session is known by its draw name
            # (the agent's own name for it, else its order of first appearance), since its id
            # (Mcp-Session-Id, a client address) changes from run to run.
            rng = random.Random(f"{self.seed}:{rule.name}:{entry.draws}:{index}")
        if rule.probability < 1 and rng.random() >= rule.probability:
            return None
        ctx = FaultContext(msg, rng, counter.scratch, now, session, rule.name)
        action = rule.fault.act(ctx)
        if action is None:
            return None
        if isinstance(action, Skip):
            self._log_skip(rule, msg, action.reason)
            return None
        if _changes_nothing(action, msg) or (carries is not None and not carries(action)):
            return None
        if not (seen and seen[1]):
            counter.fired += 1
        if key is not None:
            counter.keys[key] = (index, True)
        self._log_fault(rule, msg, action, index)
        for reason in ctx.skipped:  # what the fault left alone of what it changed
            self._log_skip(rule, msg, reason)
        if isinstance(action, Rewrite):
            msg.replace(action.message, action.headers)
        elif isinstance(action, Garble) and msg.rpc is None and rule.fault.level is Level.CONTENT:
            msg.body = action.raw  # a REST body perturbed: later content rules perturb it further
        return Fired(rule, rule.fault, action)

    def _log_skip(self, rule: Rule, msg: Message, reason: str) -> None:
        self.log.skip(rule=rule.name, fault=rule.fault.type, transport=msg.transport, session=msg.session,
                      method=msg.method, tool=msg.tool, rpc_id=msg.rpc_id, reason=reason, **_model_call(msg))

    def _log_fault(self, rule: Rule, msg: Message, action: Action, index: int, **routed: Unpack[RoutedFields]) -> None:
        fault = rule.fault
        # the action's own fields, not a deep copy of them (a rewritten tools array can be large)
        effect = {f.name: value for f in dataclasses.fields(action)
                  if not isinstance(value := getattr(action, f.name), bytes | dict)}
        if isinstance(action, Reply | Rewrite) and "error" in action.message:
            effect["error"] = action.message["error"]
        if isinstance(action, Rewrite | Respond | Garble):
            effect |= action.effect  # what the fault says it did
        fields = FaultFields(
            rule=rule.name, fault=fault.type, component=fault.component, level=fault.level_on(msg),
            phase=msg.phase, transport=msg.transport, session=msg.session, route=msg.route,
            http_method=msg.http_method, path=msg.path, method=msg.method, tool=msg.tool,
            rpc_id=msg.rpc_id, match_index=index, params=fault.params(),
            action=type(action).__name__.lower(), effect=effect, **routed, **_model_call(msg),
            **_digests(action, msg),
        )
        self.tallies[rule.name].fired += 1
        self.log.fault(**fields)
        if (trace := (msg.request or msg).trace) is not None:  # the span of the call it hit
            trace.fault(fields, action)

    def rule_counts(self) -> dict[str, tuple[int, int]]:
        """Each rule's matches and firings in the run so far (Tally), as the console shows them."""
        return {name: (tally.matched, tally.fired) for name, tally in self.tallies.items()}

    def reset(self) -> None:
        """Forget every gate counter and session state (the control API's POST /reset). The totals go on,
        as the log and /metrics do: what happened before the reset still happened."""
        self.load(self.scenario, keep_state=False)


_LEARNED = frozenset({"tools/list", "tools/call"})


def _learn_tools(view: AgentView, tools: list[Any]) -> None:
    """Every name upstream listed, and each tool's output schema as listed (before rules reshape it)."""
    for tool in tools:
        name = tool.get("name") if isinstance(tool, dict) else None
        if isinstance(name, str):
            view.listed.add(name)
            schema = tool.get("outputSchema")
            if isinstance(schema, dict):
                view.output_schemas[name] = schema
            else:
                view.output_schemas.pop(name, None)


def _changes_nothing(action: Action, msg: Message) -> bool:
    """True for a rewrite that leaves the message as it was: such a fault did not fire."""
    match action:
        case Rewrite(message=message, headers=headers):
            return not headers and message == msg.rpc
        case Garble(raw=raw):
            return raw == msg.body
    return False


def _rewrites_plain_body(fired: Fired, msg: Message) -> bool:
    """True for a content fault's new plain (REST) body: faults on one body compose, so it ends nothing."""
    return isinstance(fired.action, Garble) and fired.fault.level is Level.CONTENT and msg.rpc is None


def _is_batch(body: bytes | None) -> bool:
    """A JSON-RPC batch (a JSON array of messages), which content faults leave whole."""
    return body is not None and body.lstrip()[:1] == b"[" and b'"jsonrpc"' in body


def _view_name(msg: Message) -> str:
    """The agent view a message's session shares: one per upstream (transport and route)."""
    return _view_of(msg.transport, msg.route)


def _view_of(transport: str, route: str | None) -> str:
    return f"{transport} {route or ''}"


def _model_call(msg: Message) -> ModelCallFields:
    """A model-API message's api, model and turn, for its log lines (nothing for any other message)."""
    return ModelCallFields(api=msg.api, model=msg.model, turn=msg.turn) if msg.api is not None else ModelCallFields()


def _digests(action: Action, msg: Message) -> DigestFields:
    """Digests of what a fault made and of the payload it changed, so a log says whether two were the same."""
    perturbed = _payload(action)
    if perturbed is None:
        return DigestFields()
    if msg.body is None:
        return DigestFields(perturbed_digest=digest(perturbed))
    return DigestFields(perturbed_digest=digest(perturbed), original_digest=digest(msg.body))


def _payload(action: Action) -> bytes | None:
    """The bytes a payload-changing action puts in place of the original."""
    match action:
        case Respond(body=body) | Garble(raw=body):
            return body
        case Reply(message=message) | Rewrite(message=message):
            return orjson.dumps(message)
    return None
