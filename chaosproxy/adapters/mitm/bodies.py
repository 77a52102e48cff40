"""Response bodies under mitmproxy, chunk by chunk: `flow.response.stream` is a synchronous transform of
each chunk, so the shaping stages every transport shares (adapters/shaping) run here in it, after the
stages of mitm's own that decide on the messages in the body (a whole JSON body, SSE events, a model
API's stream); a drip is paced and a cut carried out on the agent's connection (`Wire`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from chaosproxy.adapters import shaping
from chaosproxy.adapters.execute import OUTCOMES
from chaosproxy.adapters.http.heads import RULE_BODY_LIMIT
from chaosproxy.adapters.jsonrpc import JsonRpcRelay
from chaosproxy.adapters.mitm.wire import Wire
from chaosproxy.adapters.shaping import Stage
from chaosproxy.engine.message import Message
from chaosproxy.protocols import streams
from chaosproxy.protocols.llm.stream import Editor
from chaosproxy.telemetry.log import ops
from chaosproxy.telemetry.log_schema import StreamEnd

if TYPE_CHECKING:
    from chaosproxy.adapters.mitm.addon import Flow


class Shaper:
    """`flow.response.stream`: runs each upstream chunk through the stages, then carries out the ending.

    mitmproxy writes each chunk this generator yields before resuming it, so an ending carried out
    after the last yield (close, reset) falls right after those bytes, before anything else (the
    chunked terminator) can follow them.
    """

    def __init__(self, state: Flow, stages: list[Stage], wire: Wire | None, pace: float | None) -> None:
        self.state = state
        self.stages = stages
        self.wire = wire
        self.pace = pace
        self.done = False

    def __call__(self, chunk: bytes) -> Iterator[bytes]:
        if self.done:
            return
        if self.pace is not None and self.wire is not None:
            self.wire.pace(self.pace)
            self.pace = None
        try:
            chunks, end = shaping.run(self.stages, [chunk] if chunk else [], not chunk)
        except Exception:  # fail open: the rest of the body passes as it comes
            ops.exception("mitm: shaping a response body failed; passing the rest through")
            self.stages = []
            chunks, end = [chunk] if chunk else [], not chunk
        for piece in chunks:
            self.state.bytes_out += len(piece)
            yield piece
        if end:
            self.done = True
            self._finish()

    def _finish(self) -> None:
        wire, state = self.wire, self.state
        if wire is not None:
            wire.unpace()
        ending = shaping.ending(self.stages)
        if ending is StreamEnd.IDLE:
            state.outcome = OUTCOMES[ending]
            state.hold = True  # the response hook waits, so the end of the body is never sent
        elif ending is not StreamEnd.EOF and wire is not None:  # (without it, Wire.of said why: the body just ends)
            state.outcome, state.cut = OUTCOMES[ending], True
            if ending is StreamEnd.RESET:
                wire.reset()
            else:
                wire.close()  # FIN after the bytes written (a cut stream too: its response is read until close)


class WholeBody(Stage):
    """The whole body, its JSON-RPC message decided on once it is in."""

    def __init__(self, decide: Callable[[bytes], bytes], request: Message) -> None:
        self.decide, self.request = decide, request
        self.parts: list[bytes] | None = []
        self.size = 0

    def __call__(self, chunks: list[bytes], end: bool) -> list[bytes]:
        if self.parts is None:  # past the limit: streaming on
            return chunks
        self.parts += chunks
        self.size += sum(map(len, chunks))
        if self.size > RULE_BODY_LIMIT:
            ops.warning("mitm: %s %s: a body past %d bytes is passed on undecided", self.request.http_method,
                        self.request.path, RULE_BODY_LIMIT)
            held, self.parts = self.parts, None
            return held
        if not end:
            return []
        return [self.decide(b"".join(self.parts))]


class _Events(Stage):
    """A stage that takes its chunks as SSE events, each once it is complete."""

    def __init__(self) -> None:
        self.splitter = streams.SseSplitter()

    def events(self, chunks: list[bytes], end: bool) -> list[bytes]:
        events = [event for chunk in chunks for event in self.splitter.feed(chunk)]
        if end and (rest := self.splitter.rest()):
            events.append(rest)
        return events


class LlmEvents(_Events):
    """A model API's streamed reply through its format's editor, event by event."""

    def __init__(self, editor: Editor) -> None:
        super().__init__()
        self.editor = editor

    def __call__(self, chunks: list[bytes], end: bool) -> list[bytes]:
        out = [piece for event in self.events(chunks, end) for piece in self.editor.feed(event)]
        return out + self.editor.finish() if end and not self.editor.ended else out


class SseMessages(_Events):
    """SSE events, each one's JSON-RPC message decided on as it completes; the rules that fire go on
    the call line's `faults` (on a legacy GET stream, the replies' faults are their POSTs')."""

    def __init__(self, relay: JsonRpcRelay, request: Message, faults: list[str]) -> None:
        super().__init__()
        self.relay, self.request = relay, request
        self.session = request.session
        self.faults: list[str] | None = faults

    def __call__(self, chunks: list[bytes], end: bool) -> list[bytes]:
        return [self._event(event) for event in self.events(chunks, end)]

    def _event(self, event: bytes) -> bytes:
        if streams.sse_field(event, b"event") == b"endpoint":  # legacy HTTP+SSE: the stream's session
            event, self.session = self.relay.endpoint(event, self.session)
            self.faults = None
            return event
        return self.relay.relay_frame(event, self.request, self.session, self.faults)
