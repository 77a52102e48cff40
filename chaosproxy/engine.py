"""The engine: which rules match a message, whether their gates let them fire, what they do.

It knows nothing about sockets; adapters hand it `Message`s and carry out the actions it returns.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import random
import re
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from chaosproxy.actions import Action, Garble, Reply, Respond, Rewrite, Skip, ends_exchange
from chaosproxy.faults import Fault, FaultContext, Level
from chaosproxy.log import PerturbationLog, digest, ops
from chaosproxy.mcp import error_reply, result_reply
from chaosproxy.message import Message, Phase
from chaosproxy.otel import NO_TRACING, Tracing
from chaosproxy.scenario import Rule, Scenario
from chaosproxy.session import SessionState


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
class _Counter:
    matched: int = 0
    fired: int = 0
    scratch: dict[str, Any] = field(default_factory=dict)
    # content key -> (match index it got when first seen, whether it fired then)
    keys: OrderedDict[str, tuple[int, bool]] = field(default_factory=OrderedDict)


class _CompiledRule:
    """A rule with its globs compiled and its per-session (or global) counters."""

    def __init__(self, rule: Rule) -> None:
        self.rule = rule
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
        if m.method is not None:
            is_rpc = _glob(m.method)
            checks.append(lambda msg: (method := msg.method) is not None and is_rpc(method))
        if m.tool is not None:
            is_tool = _glob(m.tool)
            checks.append(lambda msg: (tool := msg.tool) is not None and is_tool(tool))
        self.checks = checks
        self.on_messages = rule.fault.on_messages
        # Content faults also read plain (non-JSON-RPC) bodies: a REST tool's JSON or text.
        self.on_plain_bodies = rule.fault.level is Level.CONTENT
        self.needs_body = m.method is not None or m.tool is not None or self.on_messages
        self.counters: dict[str, _Counter] = {}

    def matches(self, msg: Message) -> bool:
        if self.on_messages and msg.rpc is None and not self.on_plain_bodies:
            return False
        return all(check(msg) for check in self.checks)

    def counter(self, session: str) -> _Counter:
        key = session if self.rule.scope == "session" else "*"
        counter = self.counters.get(key)
        if counter is None:
            counter = self.counters[key] = _Counter()
        return counter


def _same_counting(old: Rule, new: Rule) -> bool:
    """True when a rule's counters still mean the same under its new version."""
    ignored = {"probability", "enabled", "description"}
    return old.model_dump(exclude=ignored) == new.model_dump(exclude=ignored)


def _header_check(name: str, is_value: Callable[[str], bool]) -> Callable[[Message], bool]:
    def check(msg: Message) -> bool:
        value = (msg.request or msg).headers.get(name)
        return value is not None and is_value(value)
    return check


class Engine:
    """Decides, per message, which faults fire. One engine serves every adapter of a run."""

    def __init__(self, scenario: Scenario, *, seed: int, log: PerturbationLog) -> None:
        self.seed = seed
        self.log = log
        self.started = time.monotonic()
        self.tracing: Tracing = NO_TRACING  # set by whoever runs the engine (chaosproxy.otel)
        self._compiled: list[_CompiledRule] = []
        self.load(scenario, keep_state=False)

    def load(self, scenario: Scenario, *, keep_state: bool = True) -> None:
        """Put a scenario in force (atomically: a message is decided under one scenario or the other).

        A swap mid-run keeps what the agent has seen: session state (tool routes, call counts) and
        the counters of every rule that is unchanged apart from probability or enabled, so a
        `first: 3` rule does not start over because another rule was patched.
        """
        previous = {rule.rule.name: rule for rule in self._compiled} if keep_state else {}
        compiled = [_CompiledRule(rule) for rule in scenario.rules]
        for rule in compiled:
            old = previous.get(rule.rule.name)
            if old is not None and _same_counting(old.rule, rule.rule):
                rule.counters = old.counters
        by_kind: dict[tuple[Phase, bool], list[_CompiledRule]] = {
            (phase, on_messages): [] for phase in Phase for on_messages in (False, True)}
        for rule in compiled:
            by_kind[rule.rule.fault.phase, rule.on_messages].append(rule)
        self.scenario = scenario
        self._compiled = compiled
        self._by_kind = by_kind
        # Faults that show the agent made-up tools need to see its tools/call requests to route them.
        self._routes_calls = any(rule.rule.fault.routes_calls for rule in compiled)
        self.needs_body = self._routes_calls or any(
            rule.needs_body and rule.rule.fault.phase is Phase.REQUEST for rule in compiled)
        if not keep_state:
            self.sessions: dict[str, SessionState] = {}
            self._ordinals: dict[str, int] = {}

    def active(self, phase: Phase, *, wire: bool = True, messages: bool = True) -> bool:
        """False when no rule can act here: adapters then skip building messages at all."""
        if phase is Phase.REQUEST and messages and self._routes_calls:
            return True
        return bool(wire and self._by_kind[phase, False]) or bool(messages and self._by_kind[phase, True])

    def could_act(self, msg: Message) -> bool:
        """False when no rule could act on this HTTP request or on its response, judged from the request
        head alone (transport, route, method, path, headers): the adapter may then relay it untouched."""
        if self._routes_calls and msg.http_method == "POST":
            return True
        return any(rule.rule.enabled and all(check(msg) for check in rule.head_checks) for rule in self._compiled)

    def session(self, key: str) -> SessionState:
        state = self.sessions.get(key)
        if state is None:
            state = self.sessions[key] = SessionState()
        return state

    def decide(self, msg: Message, *, wire: bool = True, messages: bool = True,
               key: str | None = None) -> list[Fired]:
        """The faults that fire on `msg`, in rule order, each already logged.

        `wire` and `messages` choose between faults acting on the transport (a whole HTTP response)
        and faults acting on JSON-RPC messages (each message inside it); stdio asks for both.
        A Rewrite is applied to `msg` at once, so later rules and the adapter see the new message.

        `key` names the message's content (a model-API conversation resends its history every turn):
        a message seen before under the same key gets the decision it got then, drawn from a stream
        of (seed, rule, key) alone, and counts as one match however often it is resent.
        """
        fired: list[Fired] = []
        steps: list[tuple[str, Callable[[], Fired | None]]] = []
        if msg.phase is Phase.REQUEST and msg.method == "tools/call":
            steps.append(("tool routes", lambda: self._route(msg)))
        rules = (self._by_kind[msg.phase, False] if wire else []) + (self._by_kind[msg.phase, True] if messages else [])
        steps += [(rule.rule.name, lambda rule=rule: self._gate_and_act(rule, msg, key)) for rule in rules]
        for name, step in steps:
            try:
                outcome = step()
            except Exception as exc:  # fail open: a broken fault must not break the agent's traffic
                ops.exception("%s failed on a %s; passing it through", name, msg.phase)
                self.log.error(rule=name, error=repr(exc))
                continue
            if outcome is not None:
                fired.append(outcome)
                if ends_exchange(outcome.action):
                    break
        return fired

    def _route(self, msg: Message) -> Fired | None:
        """Calls to a tool a fault made up (a duplicate, a distractor, a new name) go where it said.

        Routes chain (a distractor of a renamed tool): they are followed to the end, at most once each.
        """
        session = self.session(msg.session)
        session.tool_calls += 1
        name = msg.tool
        route = session.routes.get(name) if name is not None else None
        if route is None:
            return None
        rule = next((r for r in self.scenario.rules if r.name == route.rule), None)
        if rule is None:  # the scenario changed since; the route went with the old one
            return None
        seen = {name}
        while route.real is not None and route.real not in seen and (onward := session.routes.get(route.real)):
            seen.add(route.real)
            route = onward
        rpc = msg.rpc
        assert rpc is not None
        arguments = rpc["params"].get("arguments")
        arguments = arguments if isinstance(arguments, dict) else {}
        if route.reply is not None:
            action: Action = Reply(result_reply(msg, route.reply["result"]) if "result" in route.reply
                                   else {"jsonrpc": "2.0", "id": rpc.get("id"), **route.reply})
        elif old_shape := sorted(route.refused & arguments.keys()):
            action = Reply(error_reply(msg, -32602, f"Invalid params: unexpected argument {old_shape[0]!r} "
                                                    f"for tool {name!r}"))
        else:
            renamed = {route.arguments.get(key, key): value for key, value in arguments.items()}
            params = {**rpc["params"], "name": route.real} | ({"arguments": renamed} if renamed else {})
            action = Rewrite({**rpc, "params": params})
        self._log_fault(rule, msg, action, session.tool_calls, routed_to=route.real)
        if isinstance(action, Rewrite):
            msg.replace(action.message)
        return Fired(rule, rule.fault, action)

    def _gate_and_act(self, compiled: _CompiledRule, msg: Message, key: str | None = None) -> Fired | None:
        rule = compiled.rule
        if not rule.enabled or not compiled.matches(msg):
            return None
        rule.fault.observe(msg, self.session(msg.session))
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
            # however requests from different sessions interleave. Sessions count by order of first
            # appearance, since their ids (Mcp-Session-Id, ports) are random from run to run.
            ordinal = self._ordinals.setdefault(msg.session, len(self._ordinals) + 1)
            rng = random.Random(f"{self.seed}:{rule.name}:{ordinal}:{index}")
        if rule.probability < 1 and rng.random() >= rule.probability:
            return None
        action = rule.fault.act(FaultContext(msg, rng, counter.scratch, now, self.session(msg.session), rule.name))
        if action is None:
            return None
        if isinstance(action, Skip):
            llm = {"api": msg.api, "model": msg.model, "turn": msg.turn} if msg.api is not None else {}
            self.log.skip(rule=rule.name, fault=rule.fault.type, transport=msg.transport, session=msg.session,
                          method=msg.method, tool=msg.tool, rpc_id=msg.rpc_id, reason=action.reason, **llm)
            return None
        if not (seen and seen[1]):
            counter.fired += 1
        if key is not None:
            counter.keys[key] = (index, True)
        self._log_fault(rule, msg, action, index)
        if isinstance(action, Rewrite):
            msg.replace(action.message)
        return Fired(rule, rule.fault, action)

    def _log_fault(self, rule: Rule, msg: Message, action: Action, index: int, **extra: Any) -> None:
        fault = rule.fault
        effect = {k: v for k, v in dataclasses.asdict(action).items() if not isinstance(v, bytes | dict)}
        if isinstance(action, Reply | Rewrite) and "error" in action.message:
            effect["error"] = action.message["error"]
        if msg.api is not None:
            extra.update(api=msg.api, model=msg.model, turn=msg.turn)
        perturbed = _payload(action)
        if perturbed is not None:
            extra["perturbed_digest"] = digest(perturbed)
            if msg.body is not None:
                extra["original_digest"] = digest(msg.body)
        fields = dict(
            rule=rule.name, fault=fault.type, component=fault.component, level=fault.level,
            phase=msg.phase, transport=msg.transport, session=msg.session, route=msg.route,
            http_method=msg.http_method, path=msg.path, method=msg.method, tool=msg.tool,
            rpc_id=msg.rpc_id, match_index=index, params=fault.params(),
            action=type(action).__name__.lower(), effect=effect, **extra,
        )
        self.log.fault(**fields)
        if (trace := (msg.request or msg).trace) is not None:  # the span of the call it hit
            trace.fault(fields, action)

    def rule_counts(self) -> dict[str, tuple[int, int]]:
        """Each rule's matches and firings so far, over every session (the console shows them)."""
        return {compiled.rule.name: (sum(c.matched for c in compiled.counters.values()),
                                     sum(c.fired for c in compiled.counters.values()))
                for compiled in self._compiled}

    def reset(self) -> None:
        """Forget every counter and session state (the control API's POST /reset)."""
        self.load(self.scenario, keep_state=False)


def _payload(action: Action) -> bytes | None:
    """The bytes a payload-changing action puts in place of the original."""
    match action:
        case Respond(body=body) | Garble(raw=body):
            return body
        case Reply(message=message) | Rewrite(message=message):
            return orjson.dumps(message)
    return None
