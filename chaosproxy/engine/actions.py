"""What a fault asks an adapter to do, every kind of it (`Action`, what Fault.act returns). Plain data:
adapters carry the actions out, the model-API and A2A relays those of their own faults."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class Delay:
    """Wait, then carry on (before forwarding the request or before relaying the response)."""

    seconds: float


@dataclass(frozen=True, slots=True)
class Respond:
    """Answer the agent with this instead of calling upstream (`effect`: what it says, for the log line)."""

    status: int
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    effect: dict[str, Any] = field(default_factory=dict, compare=False)


@dataclass(frozen=True, slots=True)
class Hang:
    """Accept the request and send nothing; forward normally after `release_after` s if set."""

    release_after: float | None = None


@dataclass(frozen=True, slots=True)
class Reset:
    """Abort the connection with a TCP reset: at once (after holding the request `delay` s), or after
    relaying `after_bytes` of the body."""

    after_bytes: int | None = None
    delay: float = 0.0


@dataclass(frozen=True, slots=True)
class Truncate:
    """Relay only the first `limit` bytes (or `fraction` of the body), then close the connection."""

    limit: int | None = None
    fraction: float | None = None


@dataclass(frozen=True, slots=True)
class Drip:
    """Relay the body in `chunk_bytes` pieces with `delay` s between them."""

    chunk_bytes: int
    delay: float


@dataclass(frozen=True, slots=True)
class CutStream:
    """End an event stream after `after_events` events: close it, or keep it open and silent."""

    after_events: int
    idle: bool = False


@dataclass(frozen=True, slots=True)
class Reply:
    """Answer a JSON-RPC request with `message` (an error, a stub result) instead of forwarding it,
    after `delay` seconds."""

    message: dict[str, Any]
    delay: float = 0.0


@dataclass(frozen=True, slots=True)
class Rewrite:
    """Pass the JSON-RPC message on, changed to `message` (later rules see the changed message).

    `effect` says what changed, for the fault's log line: names, counts, positions, small and bounded
    (the message itself may be large, and may hold what the agent or the user wrote)."""

    message: dict[str, Any]
    effect: dict[str, Any] = field(default_factory=dict, compare=False)
    # Mirrored headers (lower-case name: value) to send as given instead of as the body says: a fault
    # that makes them disagree with the body (the 2026 era's -32020). Only headers the request carries.
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Garble:
    """Send `raw` in place of the message's frame: broken JSON, stray lines, an empty line, or a plain
    body a content fault changed. `effect` as Rewrite's."""

    raw: bytes
    effect: dict[str, Any] = field(default_factory=dict, compare=False)


@dataclass(frozen=True, slots=True)
class Notify:
    """Deliver `message` (a JSON-RPC notification) to the agent just before the message being decided."""

    message: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Drop:
    """Deliver nothing in the message's place: the agent never receives it (a notification lost on the way)."""


@dataclass(frozen=True, slots=True)
class BlankCompletion:
    """A model API's reply made empty (`mode` empty: no text, no tool calls, no reasoning) or cut off
    (`length`: the token limit hit), ending with the provider's stop reason `stop` (the model-API relay's)."""

    mode: str
    stop: str


@dataclass(frozen=True, slots=True)
class FailStream:
    """After `after_events` events of a model API's 200 stream, the format's error event (`event`, `data`)
    in place of the rest; `error` is the error's code or type, as the agent's SDK reports it (the
    model-API relay's)."""

    after_events: int
    event: str
    data: bytes
    error: str


@dataclass(frozen=True, slots=True)
class Withhold:
    """Do not relay this piece of an A2A reply (a stream's event, or a task's results): `what` it was
    (the A2A relay's)."""

    what: str


@dataclass(frozen=True, slots=True)
class EndStream:
    """End the agent's A2A stream in place of this event: closed (`idle` false), or kept open and silent
    until the agent gives up (a remote agent that went quiet). `after_events`: events it got (the A2A relay's)."""

    after_events: int
    idle: bool = False


@dataclass(frozen=True, slots=True)
class Skip:
    """Not an action: the fault matched but cannot act on this payload (an image, a binary body).

    The engine logs the reason (`event: skip`) and lets the message pass; the fault does not count as fired.
    """

    reason: str


Action = (Delay | Respond | Hang | Reset | Truncate | Drip | CutStream | Reply | Rewrite | Garble | Notify | Drop
          | BlankCompletion | FailStream | Withhold | EndStream)


def ends_exchange(action: Action) -> bool:
    """True when nothing after this action reaches the agent, so later rules cannot act."""
    return isinstance(action, Respond | Reset | Reply | Garble | Drop) or (
        isinstance(action, Hang) and action.release_after is None)
