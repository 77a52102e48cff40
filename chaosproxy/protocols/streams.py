"""Async chunk-stream helpers shared by adapters: reading and decoding bodies, SSE event framing.

Every helper yields chunks as soon as they are available: nothing here waits for a whole body.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable

# An SSE event ends at a blank line; lines end in CRLF, LF or CR.
EVENT_END = re.compile(rb"\r\n\r\n|\n\n|\r\r")


async def reads(read: Callable[[], Awaitable[bytes]]) -> AsyncIterator[bytes]:
    """What `read` returns, piece by piece, until it returns b"" (the end)."""
    while piece := await read():
        yield piece


async def once(payload: bytes) -> AsyncIterator[bytes]:
    yield payload


async def then(first: bytes, rest: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """`first` (if any), then `rest`."""
    if first:
        yield first
    async for piece in rest:
        yield piece


DECODED_PIECE = 1 << 20  # a decoded piece is at most this large, however well the upstream's bytes compress


def _decoder(encoding: str) -> zlib._Decompress:
    return zlib.decompressobj(wbits=47 if encoding != "deflate" else 15)  # gzip (or zlib) / zlib-wrapped deflate


async def decoded(chunks: AsyncIterator[bytes], encoding: str) -> AsyncIterator[bytes]:
    """A gzip or deflate body decoded as it arrives (so rules and the SSE splitter see plain text), in
    pieces of at most DECODED_PIECE bytes: a small compressed piece cannot make a huge plain one."""
    decoder = _decoder(encoding)
    async for piece in chunks:
        while piece:
            if plain := decoder.decompress(piece, DECODED_PIECE):
                yield plain
            piece = decoder.unconsumed_tail
    if rest := decoder.flush():
        yield rest


def decode_whole(data: bytes, encoding: str, limit: int) -> bytes | None:
    """A whole gzip or deflate body decoded, or None when it is corrupt, unfinished, or decodes to
    more than `limit` bytes (it is then relayed as it came, not read by rules)."""
    decoder = _decoder(encoding)
    try:
        plain = decoder.decompress(data, limit + 1)
    except zlib.error:
        return None
    return plain if len(plain) <= limit and decoder.eof and not decoder.unconsumed_tail else None


class Unframed(bytes):
    """Bytes of an SSE event too large to hold (over the splitter's limit): relayed as they are, not inspected."""


class SseSplitter:
    """Cuts a stream fed chunk by chunk into SSE events (each with its blank-line terminator).

    Linear in the stream's size however large an event is: each feed scans only the new bytes (and
    the 3 before them, as a boundary may straddle chunks). An event that grows past `max_event`
    bytes is given back in `Unframed` pieces as it arrives, up to and including its end.
    """

    __slots__ = ("_pending", "_scanned", "_max", "_oversize")

    def __init__(self, max_event: int = 16 << 20) -> None:
        self._pending = bytearray()
        self._scanned = 0
        self._max = max_event
        self._oversize = False

    def feed(self, chunk: bytes) -> list[bytes]:
        """The events this chunk completes (or Unframed pieces of an oversize one)."""
        pending = self._pending
        pending += chunk
        events: list[bytes] = []
        start = 0
        for end in EVENT_END.finditer(pending, max(self._scanned - 3, 0)):
            piece = bytes(pending[start:end.end()])
            events.append(Unframed(piece) if self._oversize else piece)
            self._oversize = False
            start = end.end()
        if start:
            del pending[:start]
        if len(pending) > self._max:
            self._oversize = True
            tail = bytes(pending[-3:])  # kept back: a boundary may start here
            events.append(Unframed(bytes(pending[:-3])))
            pending[:] = tail
        self._scanned = len(pending)
        return events

    def rest(self) -> bytes:
        """What is left after the last complete event (an unterminated one) when the stream ends."""
        rest = bytes(self._pending)
        self._pending.clear()
        self._scanned = 0
        return Unframed(rest) if self._oversize else rest


async def sse_frames(chunks: AsyncIterator[bytes], max_event: int = 16 << 20) -> AsyncIterator[bytes]:
    """Each SSE event as one bytes object (with its blank-line terminator) as soon as it is complete."""
    splitter = SseSplitter(max_event)
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
