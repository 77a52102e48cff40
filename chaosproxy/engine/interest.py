"""Could anything act here? What the rules of the scenario in force could act on, asked by every adapter
and protocol relay before it builds a message, reads a body or asks for a reply unencoded.

`Engine.load` builds a new `Interest` for each scenario and puts it in force in one assignment
(`Engine.interest`): each question is answered under one scenario or the other, never a mix, and the
answers kept for heads alike (`could_act`'s cache) start over with it. An exchange asks again when its
reply comes, so a scenario put in force mid-call applies to that reply (as it does to the engine's
decisions, which always follow the scenario in force). Only enabled rules count: a rule's `enabled`
changes only with a new scenario (rules are frozen; the control API's PATCH, a reload and a scope's scenario
each load one), so a disabled rule never has a body read or a reply asked for plain. Tool routes a rule
left in sessions stay in force when it is disabled (`Engine.decide` routes through every rule loaded), so
calls are read for them still. Protocol relays keep what they work out
from it for their own messages (a model API's prompts, an A2A card) with `derived`, which goes with it.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import TYPE_CHECKING, Any, cast

from chaosproxy.engine.message import Message, Phase
from chaosproxy.engine.sessions import AGENT_HEADER

if TYPE_CHECKING:
    from chaosproxy.engine.core import _CompiledRule
    from chaosproxy.engine.scenario import Rule
    from chaosproxy.faults import Fault

AGENT_HEADER_KEY = AGENT_HEADER.lower().encode()  # the header an agent names itself in, as a head's keys are

MAX_VERDICTS = 4096  # could_act's answers kept for heads alike: all dropped beyond (a new scenario: none)


class Interest:
    """Which messages the rules of one scenario could act on, judged before the engine is asked."""

    __slots__ = ("rules", "idle", "request_bodies", "head_headers", "head_verdict", "_compiled", "_by_kind",
                 "_routes_calls", "_verdicts", "_derived")

    def __init__(self, rules: Sequence[Rule], compiled: Sequence[_CompiledRule]) -> None:
        self.rules = tuple(rules)  # the scenario's rules, in the order written (for `derived`)
        # Faults that show the agent made-up tools need to see its tools/call requests to route them
        # (disabled or not: the routes they left stay in force).
        self._routes_calls = any(rule.rule.fault.routes_calls for rule in compiled)
        compiled = self._compiled = tuple(rule for rule in compiled if rule.rule.enabled)
        self.idle = not compiled and not self._routes_calls  # nothing can act on any message
        by_kind: dict[tuple[Phase, bool], list[_CompiledRule]] = {
            (phase, on_messages): [] for phase in Phase for on_messages in (False, True)}
        for rule in compiled:
            by_kind[rule.rule.fault.phase, rule.on_messages].append(rule)
        self._by_kind = by_kind
        # a rule reads requests' bodies: adapters read them whole up to the rule body limit, not a small one
        self.request_bodies = self._routes_calls or any(
            rule.needs_body and rule.rule.fault.phase is Phase.REQUEST for rule in compiled)
        # The headers an adapter must read off a request's head: those a head check reads, and the one in
        # which an agent names itself.
        self.head_headers = frozenset([AGENT_HEADER_KEY, *(name.lower().encode("latin-1", "replace")
                                                            for rule in compiled for name in rule.rule.match.header)])
        self._verdicts: dict[Hashable, bool] = {}
        # What `could_act` answered for a head alike (its key: what the head checks read of it), or None: not
        # asked yet under this scenario. (The cache's own `get`: asked for every plain request, it costs no call.)
        self.head_verdict: Callable[[Hashable], bool | None] = self._verdicts.get
        self._derived: dict[Callable[[Interest], Any], Any] = {}

    def acts(self, phase: Phase, *, wire: bool = True, messages: bool = True) -> bool:
        """False when no rule can act in `phase` on the transport (`wire`: a whole HTTP response, a line)
        or on the messages in it (`messages`): adapters then skip building messages at all."""
        if phase is Phase.REQUEST and messages and self._routes_calls:
            return True
        return bool(wire and self._by_kind[phase, False]) or bool(messages and self._by_kind[phase, True])

    def could_act(self, msg: Message, key: Hashable | None = None) -> bool:
        """False when no rule could act on this HTTP request or on its response, judged from the request
        head alone (transport, route, method, path, headers): the adapter may then relay it untouched.
        With `key`, the answer is kept for `head_verdict` (adapters that see many requests alike key
        only heads of a bounded size; the cache holds at most MAX_VERDICTS)."""
        could = self._could_act(msg)
        if key is not None:
            verdicts = self._verdicts
            if len(verdicts) >= MAX_VERDICTS:
                verdicts.clear()
            verdicts[key] = could
        return could

    def _could_act(self, msg: Message) -> bool:
        if self._routes_calls and msg.http_method == "POST":
            return True
        for rule in self._compiled:  # loops, not any(all(...)): this runs for every request
            for check in rule.head_checks:
                if not check(msg):
                    break
            else:
                return True
        return False

    def could_act_on_reply(self, request: Message) -> bool:
        """False when no rule could act on the response to `request` (an HTTP request whose body was
        read) and the engine has nothing to learn from it: the adapter may then relay it untouched.
        Judged by the JSON-RPC method it answers, as rules on messages name the methods whose messages
        they change (`Fault.methods`), bar content faults, which also change a reply that is not
        JSON-RPC; a tool list is always read (the output schemas faults keep to)."""
        on_messages = self._by_kind[Phase.RESPONSE, True]
        if self._by_kind[Phase.RESPONSE, False]:  # a rule on the whole HTTP response
            return True
        if not on_messages:
            return False
        method = request.method if request.rpc is not None else None
        if method is None or method == "tools/list":
            return True
        return any(rule.methods is None or method in rule.methods or rule.on_plain_bodies for rule in on_messages)

    def could_match(self, msg: Message, phase: Phase | None = None) -> list[Fault]:
        """The faults of the (enabled) rules on messages in `phase` (default: `msg`'s) that what is known
        before `msg`'s body (route, path, headers, the request) does not rule out.

        Adapters read a body of unknown length (chunked) whole only when there are some: an unrelated
        rule must not make every large text response wait for its last byte.
        """
        return [rule.rule.fault for rule in self._by_kind[phase or msg.phase, True] if rule.could_match(msg)]

    def faults(self, msg: Message) -> list[Fault]:
        """The faults of the (enabled) rules on messages that match `msg`, before any gate is asked: what a
        protocol relay asks of a synthetic message to learn whether to read a reply at all."""
        return [rule.rule.fault for rule in self._by_kind[msg.phase, True] if rule.matches(msg)]

    def derived[T](self, build: Callable[[Interest], T]) -> T:
        """What `build` works out from this interest (a protocol's own: which of its messages rules act
        on), worked out once per scenario: a relay asks for it on each request."""
        if build not in self._derived:
            self._derived[build] = build(self)
        return cast("T", self._derived[build])
