"""What the three formats' stream editors share: the decisions taken for a stream, and event framing.

An editor is fed one SSE event at a time and returns what to send in its place. It holds back only
the events of a tool call it may rewrite (until the call is complete), so text deltas flow as they
arrive; a stream that no rule rewrites never reaches an editor at all.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from chaosproxy import streams
from chaosproxy.log import ops
from chaosproxy.llm.view import ToolCall

type EditCall = Callable[[ToolCall], ToolCall]


@dataclass(frozen=True, slots=True)
class StreamPlan:
    """What the relay decided for one streamed reply before it started.

    `edit_call` returns a tool call as the agent should get it (renamed back, malformed, ...), or
    the same object; `empty` makes the reply an empty (`empty`) or cut-off (`length`) completion;
    `error_after` ends the stream with the format's error event after that many events.
    """

    edit_call: EditCall | None = None
    empty: str | None = None
    error_after: int | None = None
    error: tuple[str, bytes] | None = None  # the error event: its name ("" for none) and its data


def frame(data: Any, event: str | None = None) -> bytes:
    """One SSE event with JSON data (and an event name, as Anthropic and Responses streams carry)."""
    head = b"event: " + event.encode() + b"\n" if event else b""
    return head + b"data: " + orjson.dumps(data) + b"\n\n"


def parse(event: bytes) -> tuple[str | None, Any]:
    """An SSE event's name and JSON data; data is None for comments, `[DONE]` or anything not JSON."""
    name = streams.sse_field(event, b"event")
    data = streams.sse_data(event)
    try:
        value = orjson.loads(data) if data and data != b"[DONE]" else None
    except orjson.JSONDecodeError:
        value = None
    return (name.decode("utf-8", "replace") if name is not None else None), value


class Editor:
    """Base of the format editors: counts events and ends the stream with an error when planned."""

    def __init__(self, plan: StreamPlan) -> None:
        self.plan = plan
        self.events = 0
        self.ended = False
        self.broken = False  # the editor failed: the rest of the stream passes as it comes

    def feed(self, event: bytes) -> list[bytes]:
        """What to send for this upstream event (nothing once the stream has ended)."""
        if self.ended:
            return []
        if self.broken:
            return [event]
        try:
            out = self.edit(event)
        except Exception:  # fail open: a bug here must not break the agent's stream
            ops.exception("LLM stream editor failed on an event; the rest of the stream passes untouched")
            self.broken = True
            return [event]
        self.events += 1
        if self.plan.error_after is not None and self.events >= self.plan.error_after:
            self.ended = True
            out += self.error_events()
        return out

    def error_events(self) -> list[bytes]:
        """The planned error event, as the format sends it."""
        name, data = self.plan.error or ("", b"{}")
        return [(b"event: " + name.encode() + b"\n" if name else b"") + b"data: " + data + b"\n\n"]

    def edit(self, event: bytes) -> list[bytes]:
        raise NotImplementedError

    def finish(self) -> list[bytes]:
        """Anything still held when upstream ends the stream."""
        return []

    def call(self, call: ToolCall) -> ToolCall:
        return self.plan.edit_call(call) if self.plan.edit_call is not None else call
