"""What the model-API faults ask the LLM relay to do to a reply (plain data, as chaosproxy.actions)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class EmptyCompletion:
    """Make the reply empty (`empty`: no text, no tool calls) or cut off (`length`: the token limit hit)."""

    mode: str


@dataclass(frozen=True, slots=True)
class StreamError:
    """After `after_events` events of a 200 stream, send the format's error event (`event`, `data`) and end it."""

    after_events: int
    event: str
    data: bytes
