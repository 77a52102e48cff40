"""What the model-API faults ask the LLM relay to do to a reply (plain data, as chaosproxy.engine.actions).

Their fields are what the fault's log line says it did (`effect`), so each names what the agent meets.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class EmptyCompletion:
    """Make the reply empty (`empty`: no text, no tool calls, no reasoning) or cut off (`length`: the token
    limit hit), ending with the provider's stop reason `stop`."""

    mode: str
    stop: str


@dataclass(frozen=True, slots=True)
class StreamError:
    """After `after_events` events of a 200 stream, send the format's error event (`event`, `data`) in place
    of the rest; `error` is the error's code or type, as the agent's SDK reports it."""

    after_events: int
    event: str
    data: bytes
    error: str
