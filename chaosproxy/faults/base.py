"""The fault unit: a pydantic model whose fields are its YAML parameters, plus one `act` method."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, ClassVar

from pydantic import AliasChoices, BaseModel, ConfigDict, Field

from chaosproxy.engine.actions import Action, Skip
from chaosproxy.engine.message import Message, Phase
from chaosproxy.engine.session_state import SessionState


class Component(StrEnum):
    """The part of the agent's POMDP a fault perturbs."""

    OBSERVATION = "observation"
    ACTION = "action"
    REWARD = "reward"
    TRANSITION = "transition"


class Level(StrEnum):
    """The protocol layer a fault works at."""

    TRANSPORT = "transport"
    HTTP = "http"
    JSONRPC = "jsonrpc"
    MCP = "mcp"
    CONTENT = "content"
    LLM = "llm"  # the model API's own messages: the user's prompt, the model's completion and tool calls
    A2A = "a2a"  # another agent's card, tasks and task events (chaosproxy.protocols.a2a)


@dataclass(slots=True)
class FaultContext:
    """What a fault may look at when it acts.

    `rng` is the decision's own seeded stream, `state` the rule's scratch space for this session
    (or for all, with scope: global), `session` what every rule knows about the session, and
    `rule` the rule's name (for tool routes the fault leaves behind). A fault that acts on part of a
    message only adds to `skipped` why it left the rest alone: the engine logs each (`event: skip`).
    """

    message: Message
    rng: random.Random
    state: dict[str, Any]
    now: float
    session: SessionState
    rule: str
    skipped: list[str] = field(default_factory=list)


MAX_WAIT_MS = 86_400_000.0  # the longest wait a fault may add (a day): longer is a hang, which has its own fault


class Fault(BaseModel):
    """Base of every fault. Subclasses set `type`, `component`, `level` and implement `act`.

    `act` returns the action to carry out, or None when the fault declines this message (a token
    bucket with tokens left, a stream cut on a response that is not a stream); a declined fault
    neither counts as fired nor is logged. It returns `Skip(reason)` when the message is one it
    should act on but cannot (a binary result for a text fault): that is logged, not fired.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)  # no endless or NaN wait

    type: str
    component: ClassVar[Component]
    level: ClassVar[Level]
    # The phase the fault acts in: each fault declares it (a class attribute), or takes it as a parameter
    # where the user chooses (latency, rpc_error). No default: a new fault says which, as it says its level.
    phase: ClassVar[Phase]
    routes_calls: ClassVar[bool] = False  # True when the fault leaves tool routes in the session
    # The JSON-RPC methods whose messages the fault can change (None: any). Other JSON-RPC messages
    # never match its rule, so they do not use up its gates (`after: 2` is not spent on initialize).
    methods: ClassVar[frozenset[str] | None] = None

    def level_on(self, msg: Message) -> Level:
        """The level the fault worked at on `msg`, for its log line: its `level`, unless it acts on
        more than one surface (a task-state fault on MCP's Tasks or on A2A's tasks)."""
        return self.level

    @property
    def on_messages(self) -> bool:
        """True for faults that act on JSON-RPC messages, False for those that act on the wire.

        On HTTP one response may carry many JSON-RPC messages (an SSE stream): wire faults act on
        the response once, message faults on each message in it.
        """
        return self.level not in (Level.TRANSPORT, Level.HTTP)

    @property
    def needs_output_schema(self) -> bool:
        """True when what the fault makes of a tool's result depends on the tool's outputSchema (to
        keep the result valid for it): the proxy then lists upstream's tools itself when the agent
        never listed them through it."""
        return False

    def observe(self, msg: Message, session: SessionState) -> None:
        """Called on every message the rule matches, before its gates: for faults that need history
        (a stale replay needs earlier results even from calls the gates let through)."""

    def act(self, ctx: FaultContext) -> Action | Skip | None:
        raise NotImplementedError

    def params(self) -> dict[str, Any]:
        """The parameters as given, for the log."""
        return self.model_dump(exclude={"type"}, exclude_defaults=True, mode="json")

    @classmethod
    def summary(cls) -> str:
        return (cls.__doc__ or "").strip().splitlines()[0]


def phase_parameter(description: str) -> Any:
    """The `phase` field of a fault whose phase the user chooses (latency, rpc_error): request by default.
    `at`, its name before the faults' phase had one name, is still read, so older scenarios keep working."""
    return Field(Phase.REQUEST, validation_alias=AliasChoices("phase", "at"), description=description)


REGISTRY: dict[str, type[Fault]] = {}


def register[F: Fault](cls: type[F]) -> type[F]:
    """Class decorator: make a fault available to scenarios under its `type`."""
    name = cls.model_fields["type"].default
    if not isinstance(name, str) or name in REGISTRY:
        raise ValueError(f"fault {cls.__name__}: missing or duplicate type {name!r}")
    if cls.__module__ != f"chaosproxy.faults.{name}":  # the registry imports a type's module by its name
        raise ValueError(f"fault {cls.__name__}: type {name!r} must be defined in chaosproxy/faults/{name}.py")
    if not isinstance(getattr(cls, "phase", None), Phase | property) and "phase" not in cls.model_fields:
        raise ValueError(f"fault {cls.__name__}: no phase (set `phase = Phase.REQUEST` or RESPONSE)")
    REGISTRY[name] = cls
    return cls


RESULTS = frozenset({"tools/call"})  # faults on a tool call or its result
LISTINGS = frozenset({"tools/list"})  # faults on the tool list
