"""What the three formats' stream editors share: the decisions they ask for, and the events they send.

An editor is fed one SSE event at a time and returns the bytes to send in its place. Every event goes
as it came unless a fault that fired changed it: a tool call some rule could act on is held from its
first event to its last (and whatever comes between, so the order stays), then decided, and only when
the decision changed the call are its events rewritten; the rest of the held events go as they came.
Decisions are taken where they take effect, so a fault is logged exactly when the agent gets what it
changed: a tool call when its first event is about to go, `empty_completion` at the reply's first
output, `llm_stream_error` when the event after its `after_events` is about to go.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson

from chaosproxy.engine.actions import BlankCompletion
from chaosproxy.protocols import streams
from chaosproxy.protocols.llm.view import ToolCall
from chaosproxy.telemetry.log import ops


class Decisions(Protocol):
    """What an editor asks the relay while a stream goes by (chaosproxy.adapters.llm_relay.LlmExchange)."""

    def watches(self, tool: str | None) -> bool:
        """Whether a rule (or a tool route) may change a call to `tool` (None: a name not known yet)."""

    def edit_call(self, call: ToolCall) -> ToolCall:
        """The call as the agent gets it: the same object when nothing changed it."""

    def empty_mode(self) -> BlankCompletion | None:
        """What empty_completion does to this reply when it fires (asked once, at the reply's first output)."""

    @property
    def error_points(self) -> frozenset[int]:
        """Counts of relayed events after which an llm_stream_error rule could end the stream."""

    def stream_error(self, relayed: int) -> tuple[str, bytes] | None:
        """The error event (its name, "" for none, and data) to send now, `relayed` events in, or None."""


@dataclass(slots=True, eq=False)
class Event:
    """One upstream event on its way to the agent: sent as `raw` unless a fault changed `data` (dirty)."""

    raw: bytes
    name: str | None = None
    data: Any = None
    counts: bool = True  # an event the agent's SDK reads (a comment is not)
    starts: list[HeldCall] = field(default_factory=list)  # held calls whose first event this is
    dirty: bool = False
    extra: bytes = b""  # an event a rewrite adds right after this one

    def wire(self) -> bytes:
        if not self.dirty:
            return self.raw + self.extra
        return streams.sse_with_data(self.raw, orjson.dumps(self.data)) + self.extra

    def change(self) -> Any:
        """The data, to be changed in place: the event then goes re-serialised."""
        self.dirty = True
        return self.data


@dataclass(slots=True, eq=False)
class HeldCall:
    """A tool call held until it is complete: its id, name and arguments so far, and its events."""

    call_id: str
    name: str
    key: Any = None  # what the format tells its calls apart by (a block index, an item id)
    arguments: str = ""
    events: list[Event] = field(default_factory=list)
    complete: bool = False


CUT_OFF_CHARS = 40  # the text a streamed reply cut off at the token limit keeps, as a short answer would


def frame(data: Any, event: str | None = None) -> bytes:
    """One SSE event with JSON data (and an event name, as Anthropic and Responses streams carry)."""
    head = b"event: " + event.encode() + b"\n" if event else b""
    return head + b"data: " + orjson.dumps(data) + b"\n\n"


def parse(raw: bytes) -> Event:
    """An upstream event with its name and JSON data (None for comments, `[DONE]` or anything not JSON)."""
    name = streams.sse_field(raw, b"event")
    data = streams.sse_data(raw)
    try:
        value = orjson.loads(data) if data and data != b"[DONE]" else None
    except orjson.JSONDecodeError:
        value = None
    return Event(raw, name.decode("utf-8", "replace") if name is not None else None, value, data is not None)


class Editor:
    """Base of the format editors: holds events behind an incomplete call, sends them, and ends the
    stream with the provider's error event where an llm_stream_error fires."""

    def __init__(self, decisions: Decisions) -> None:
        self.decisions = decisions
        self.relayed = 0  # events the agent got (comments do not count)
        self.ended = False
        self.broken = False  # the editor failed: the rest of the stream passes as it comes
        self.queue: list[Event] = []  # events held behind a call that is not complete yet
        self.holding = 0  # held calls not complete yet
        self.empty: BlankCompletion | None = None
        self._asked_empty = False

    def feed(self, raw: bytes) -> list[bytes]:
        """What to send for this upstream event (nothing once the stream has ended)."""
        if self.ended:
            return []
        if self.broken:
            return self._send([parse(raw)])
        try:
            events = self.edit(parse(raw))
        except Exception:  # fail open: a bug here must not break the agent's stream
            ops.exception("LLM stream editor failed on an event; the rest of the stream passes untouched")
            self.broken = True
            events, self.queue, self.holding = [*self.queue, parse(raw)], [], 0
            for event in events:
                event.dirty, event.starts = False, []
        if self.queue or self.holding:
            self.queue += events
            if self.holding:
                return []
            events, self.queue = self.queue, []
        return self._send(events)

    def finish(self) -> list[bytes]:
        """Anything still held when upstream ends the stream."""
        events, self.queue, self.holding = self.queue, [], 0
        return self._send(events) if not self.ended else []

    def output_starts(self) -> None:
        """The reply's first output (text, a tool call, reasoning): empty_completion is decided here."""
        if not self._asked_empty:
            self._asked_empty = True
            self.empty = self.decisions.empty_mode()

    def hold(self, event: Event, call: HeldCall) -> HeldCall:
        """Hold `call` from `event` on, when a rule may change it (else it passes as it comes)."""
        if self.decisions.watches(call.name or None):
            event.starts.append(call)
            call.events.append(event)
            self.holding += 1
        else:
            call.complete = True
        return call

    def completed(self, call: HeldCall) -> None:
        if not call.complete:
            call.complete = True
            self.holding -= 1

    def _send(self, events: list[Event]) -> list[bytes]:
        out: list[bytes] = []
        points = self.decisions.error_points
        for event in events:
            if event.counts and self.relayed in points and (error := self.decisions.stream_error(self.relayed)):
                self.ended = True
                out += self.error_events(*error, event)
                return out
            for call in event.starts:
                self._settle(call)
            out.append(event.wire())
            self.relayed += event.counts
        return out

    def _settle(self, call: HeldCall) -> None:
        """Decide a held call (its first event is about to go) and rewrite its events if it changed."""
        edited = self.decisions.edit_call(ToolCall(call.call_id, call.name, call.arguments))
        if edited.name == call.name and edited.arguments == call.arguments:
            return
        try:
            self.rewrite(call, edited)
        except Exception:  # fail open: the call goes as the model made it
            ops.exception("LLM stream editor failed rewriting a tool call; it goes as it came")
            for event in call.events:
                event.dirty, event.extra = False, b""

    def error_events(self, name: str, data: bytes, replaced: Event) -> list[bytes]:
        """The planned error event, as the format sends it in place of `replaced` and what follows."""
        return [(b"event: " + name.encode() + b"\n" if name else b"") + b"data: " + data + b"\n\n"]

    def edit(self, event: Event) -> list[Event]:
        """The events to send for this upstream one (held ones are queued by `feed`)."""
        raise NotImplementedError

    def rewrite(self, call: HeldCall, edited: ToolCall) -> None:
        """Put `edited` in place of `call` in its held events."""
        raise NotImplementedError
