"""Response bodies shaped chunk by chunk, as wire-level faults shape them (drip, truncate, reset, stream_cut):
one set of stages for every transport. The HTTP adapter runs them over its async chunks (`shaped`);
mitmproxy's addon calls them from `flow.response.stream`, a synchronous transform of each chunk.

A stage takes the chunks so far (and whether the body ended with them) and returns what goes on;
`cut` is set once it lets nothing more through, and `ends` says how the body then ends: a stage that never
cuts (a stream shorter than its cut) leaves the body to end as upstream ends it, changed in nothing.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Sequence

from chaosproxy.protocols.streams import EVENT_END
from chaosproxy.telemetry.log_schema import StreamEnd

FRACTION_WAIT_S = 2.0  # how long a body of unknown length is held to learn its size for `truncate`


class Stage:
    cut = False
    ends: StreamEnd | None = None  # how the body ends if this stage cuts it (None: as upstream ends it)
    # when the stage would let what it holds go though no chunk came (time.monotonic(); None: it holds nothing)
    deadline: float | None = None

    def __call__(self, chunks: list[bytes], end: bool) -> list[bytes]:
        raise NotImplementedError


def run(stages: Sequence[Stage], chunks: list[bytes], end: bool) -> tuple[list[bytes], bool]:
    """`chunks` through every stage in turn; also whether the body ends here (it ended, or a stage cut it)."""
    for stage in stages:
        chunks = stage(chunks, end)
        end = end or stage.cut
    return chunks, end


def planned(stages: Sequence[Stage]) -> StreamEnd:
    """How the body will end if its stages cut it (what a transport prepares for before the body comes)."""
    return next((stage.ends for stage in reversed(stages) if stage.ends is not None), StreamEnd.EOF)


def ending(stages: Sequence[Stage]) -> StreamEnd:
    """How the body ended: as the last stage that cut it says, else as upstream ended it."""
    return planned([stage for stage in stages if stage.cut])


async def shaped(chunks: AsyncIterator[bytes], stages: Sequence[Stage], pace: float | None) -> AsyncIterator[bytes]:
    """`chunks` through `stages` as they come; with `pace`, each piece `pace` s after the one before.
    Upstream is read no further once a stage cut the body (nor at all when one cuts it at 0 bytes: a
    silent upstream does not hold up the cut); a stage's deadline passes though upstream sends nothing meanwhile."""
    if run(stages, [], False)[1]:
        return
    first = True
    source = chunks.__aiter__()
    coming: asyncio.Future[bytes] | None = None
    try:
        while True:
            deadline = min((stage.deadline for stage in stages if stage.deadline is not None), default=None)
            chunk: bytes | None = None
            try:
                if deadline is None and coming is None:
                    chunk = await source.__anext__()
                else:  # waited for no longer than the deadline: then the stages are asked again
                    coming = coming or asyncio.ensure_future(source.__anext__())
                    await asyncio.wait([coming], timeout=None if deadline is None else deadline - time.monotonic())
                    if coming.done():
                        chunk, coming = coming.result(), None
            except StopAsyncIteration:
                break
            out, end = run(stages, [chunk] if chunk is not None else [], False)
            for piece in out:
                if pace is not None and not first:
                    await asyncio.sleep(pace)
                first = False
                yield piece
            if end:
                return
        for piece in run(stages, [], True)[0]:
            yield piece
    finally:
        if coming is not None:
            coming.cancel()


class Slices(Stage):
    """Re-cut into pieces of `size` bytes (a dripped body: each goes as one write, paced)."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __call__(self, chunks: list[bytes], end: bool) -> list[bytes]:
        size = self.size
        return [chunk[i:i + size] for chunk in chunks for i in range(0, len(chunk), size)]


class Limit(Stage):
    """The first `left` bytes."""

    def __init__(self, left: int, ending: StreamEnd | None = None) -> None:
        self.left = left
        self.cut = left <= 0
        self.ends = ending

    def __call__(self, chunks: list[bytes], end: bool) -> list[bytes]:
        out = []
        for chunk in chunks:
            if self.cut:
                break
            out.append(chunk[:self.left])
            self.left -= len(out[-1])
            self.cut = self.left <= 0
        return out


class Fraction(Stage):
    """The first `fraction` of the body: of its Content-Length, or of the whole body once it is in. A
    body of unknown length that does not end within FRACTION_WAIT_S or `max_held` bytes is not
    truncated: what was held goes on, then the rest, and `unended` is told."""

    ends: StreamEnd | None = StreamEnd.CLOSE

    def __init__(self, fraction: float, length: int | None, max_held: int, unended: Callable[[], None]) -> None:
        self.fraction = fraction
        self.limit = Limit(int(length * fraction)) if length is not None else None
        self.held: list[bytes] | None = []
        self.size = 0
        self.max_held = max_held
        self.unended = unended

    def __call__(self, chunks: list[bytes], end: bool) -> list[bytes]:
        if self.limit is None:
            if self.held is None:  # it did not end in time: passed on whole
                return chunks
            self.held += chunks
            self.size += sum(map(len, chunks))
            now = time.monotonic()
            if self.deadline is None and chunks:  # the wait is for a body that began: a stage before this
                self.deadline = now + FRACTION_WAIT_S  # one holding the body whole (mitm's) hands it none
            if not end and (self.size > self.max_held or (self.deadline is not None and now >= self.deadline)):
                held, self.held, self.deadline = self.held, None, None
                self.unended()
                return held
            if not end:
                return []
            whole = b"".join(self.held)
            self.limit = Limit(int(len(whole) * self.fraction))
            chunks = [whole]
        out = self.limit(chunks, end)
        self.cut = self.limit.cut
        return out


class Events(Stage):
    """The stream up to and including the end of its `left`-th SSE event, each chunk passed on as it
    comes (only the one holding that end is cut)."""

    def __init__(self, left: int, idle: bool) -> None:
        self.left = left
        self.cut = left <= 0
        self.ends = StreamEnd.IDLE if idle else StreamEnd.CUT
        self.tail = b""  # the last bytes after the last boundary: a boundary may be split across chunks

    def __call__(self, chunks: list[bytes], end: bool) -> list[bytes]:
        out: list[bytes] = []
        for chunk in chunks:
            if self.cut:
                break
            data = self.tail + chunk
            last_end = 0
            for boundary in EVENT_END.finditer(data):
                last_end = boundary.end()
                self.left -= 1
                if self.left <= 0:
                    self.cut = True
                    out.append(data[len(self.tail):last_end])
                    break
            else:
                self.tail = data[max(last_end, len(data) - 3):]
                out.append(chunk)
        return out
