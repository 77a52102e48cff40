"""Async chunk-stream helpers shared by adapters: SSE event framing and body shaping.

Every helper yields chunks as soon as they are available: nothing here waits for a whole body.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator

# An SSE event ends at a blank line; lines end in CRLF, LF or CR.
_EVENT_END = re.compile(rb"\r\n\r\n|\n\n|\r\r")


async def limit(chunks: AsyncIterator[bytes], max_bytes: int) -> AsyncIterator[bytes]:
    """The first `max_bytes` bytes of the stream."""
    left = max_bytes
    if left <= 0:
        return
    async for chunk in chunks:
        if len(chunk) >= left:
            yield chunk[:left]
            return
        left -= len(chunk)
        yield chunk


async def drip(chunks: AsyncIterator[bytes], size: int, delay: float) -> AsyncIterator[bytes]:
    """Re-slice the stream into `size`-byte pieces with `delay` seconds before each but the first."""
    first = True
    async for chunk in chunks:
        for start in range(0, len(chunk), size):
            if not first:
                await asyncio.sleep(delay)
            first = False
            yield chunk[start:start + size]


async def sse_events(chunks: AsyncIterator[bytes], max_events: int) -> AsyncIterator[bytes]:
    """The stream up to and including the end of its `max_events`-th event, unbuffered."""
    if max_events <= 0:
        return
    seen = 0
    tail = b""  # the last bytes after the last boundary: a boundary may be split across chunks
    async for chunk in chunks:
        data = tail + chunk
        last_end = 0
        for end in _EVENT_END.finditer(data):
            seen += 1
            last_end = end.end()
            if seen == max_events:
                yield data[len(tail):last_end]
                return
        tail = data[max(last_end, len(data) - 3):]
        yield chunk


class SseSplitter:
    """Cuts a stream fed chunk by chunk into SSE events (each with its blank-line terminator).

    For adapters that are handed chunks rather than an iterator to pull from (mitmproxy's stream hook).
    """

    __slots__ = ("_pending",)

    def __init__(self) -> None:
        self._pending = b""

    def feed(self, chunk: bytes) -> list[bytes]:
        """The events this chunk completes."""
        pending = self._pending + chunk
        events, start = [], 0
        for end in _EVENT_END.finditer(pending):
            events.append(pending[start:end.end()])
            start = end.end()
        self._pending = pending[start:]
        return events

    def rest(self) -> bytes:
        """What is left after the last complete event (an unterminated one) when the stream ends."""
        rest, self._pending = self._pending, b""
        return rest


async def sse_frames(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """Each SSE event as one bytes object (with its blank-line terminator) as soon as it is complete."""
    splitter = SseSplitter()
    async for chunk in chunks:
        for event in splitter.feed(chunk):
            yield event
    if rest := splitter.rest():
        yield rest


_LINE = re.compile(rb"\r\n|\n|\r")


def sse_data(event: bytes) -> bytes | None:
    """The event's data (its `data:` lines joined by LF), or None when it has none."""
    data = [line[5:].removeprefix(b" ") for line in _LINE.split(event) if line.startswith(b"data:")]
    return b"\n".join(data) if data else None


def sse_field(event: bytes, name: bytes) -> bytes | None:
    """The value of the event's first `name:` line (e.g. b"event"), if any."""
    prefix = name + b":"
    for line in _LINE.split(event):
        if line.startswith(prefix):
            return line[len(prefix):].removeprefix(b" ")
    return None


def sse_with_data(event: bytes, data: bytes) -> bytes:
    """The event with its data replaced; other fields (id, event, retry, comments) are kept."""
    lines = [line for line in _LINE.split(event) if line and not line.startswith(b"data:")]
    lines += [b"data: " + line for line in _LINE.split(data)]
    return b"\n".join(lines) + b"\n\n"
