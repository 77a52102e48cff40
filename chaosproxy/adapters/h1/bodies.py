"""Message bodies as they arrive (`Body`), and the flow control they share with the connections.

A body is handed to a consumer that pulls (async iteration) or is pushed to (`Body.pipe`); past HIGH_WATER
its producer (the connection it comes from) pauses. `NO_BODY` and `SENT_BODY` stand for the bodies of
requests that have none or went upstream whole with their head.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Protocol

from chaosproxy.adapters.h1.heads import Headers
from chaosproxy.protocols import streams

HIGH_WATER = 256 << 10  # a side whose buffer is over this pauses its producer
LOW_WATER = 64 << 10


class Producer(Protocol):
    """The connection a body comes from: told to stop reading while the body's consumer lags."""

    def pause_reading(self) -> None: ...
    def resume_reading(self) -> None: ...


class Body:
    """One message body as it arrives, for a consumer that pulls (async iteration) or is pushed to (pipe).

    Pieces are buffered until the consumer takes them; past HIGH_WATER the producer is paused, so a
    1 GiB body never sits in memory.
    """

    __slots__ = ("_pieces", "_size", "done", "trailers", "error", "_waiter", "_pipe", "_end", "_producer",
                 "_paused", "received")

    def __init__(self, producer: Producer | None) -> None:
        self._pieces: deque[bytes] | None = None  # made when a piece must wait (a piped body never does)
        self._size = 0
        self.done = False
        self.trailers: Headers = []
        self.error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._pipe: Callable[[bytes], None] | None = None
        self._end: Callable[[Headers], None] | None = None
        self._producer = producer
        self._paused = False
        self.received = 0

    def feed(self, data: bytes) -> None:
        self.received += len(data)
        if self._pipe is not None:
            self._pipe(data)
            return
        if self._pieces is None:
            self._pieces = deque()
        self._pieces.append(data)
        self._size += len(data)
        if self._size > HIGH_WATER and not self._paused:
            assert self._producer is not None  # (NO_BODY and SENT_BODY, which have none, are never fed)
            self._paused = True
            self._producer.pause_reading()
        self._wake()

    def finish(self, trailers: Headers) -> None:
        self.done = True
        self.trailers = trailers
        if self._end is not None:
            self._end(trailers)
        else:
            self._wake()

    def fail(self, error: BaseException) -> None:
        if not self.done:
            self.error = error
            self.done = True
            self._wake()

    def pipe(self, write: Callable[[bytes], None], end: Callable[[Headers], None]) -> None:
        """From now on, push every piece to `write` and the end to `end` (what was buffered first)."""
        while self._pieces:
            write(self._pieces.popleft())
        self._size = 0
        self._pipe = write
        if self.done and self.error is None:
            end(self.trailers)
        else:
            self._end = end
        self._resume_producer()

    def unpipe(self) -> None:
        self._pipe = self._end = None

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _resume_producer(self) -> None:
        if self._paused:
            assert self._producer is not None
            self._paused = False
            self._producer.resume_reading()

    async def read(self) -> bytes:
        """The next piece; b"" at the end. Raises the error that ended the body early."""
        while not self._pieces:
            if self.done:
                if self.error is not None:
                    raise self.error
                return b""
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        piece = self._pieces.popleft()
        self._size -= len(piece)
        if self._size < LOW_WATER:
            self._resume_producer()
        return piece

    def chunks(self) -> AsyncIterator[bytes]:
        return streams.reads(self.read)

    async def read_up_to(self, limit: int) -> tuple[bytes, bool]:
        """Up to `limit` bytes (more if a piece overshoots); True when that was the whole body."""
        pieces: list[bytes] = []
        size = 0
        while size <= limit:
            piece = await self.read()
            if not piece:
                return b"".join(pieces), True
            pieces.append(piece)
            size += len(piece)
        return b"".join(pieces), False


class _NoBody(Body):
    """The body of a request that has none (no Content-Length, no chunked): over from the start, and
    one object for all such requests, which then cost no Body of their own."""

    __slots__ = ()

    def __init__(self) -> None:
        super().__init__(None)  # never fed, so never paused
        self.done = True

    def finish(self, trailers: Headers) -> None:
        pass

    def pipe(self, write: Callable[[bytes], None], end: Callable[[Headers], None]) -> None:
        end([])

    def unpipe(self) -> None:
        pass


NO_BODY: Body = _NoBody()


class _SentBody(_NoBody):
    """The body of a request that went upstream whole with its head: what the parser still hands on of
    it has gone already."""

    __slots__ = ()

    def feed(self, data: bytes) -> None:
        pass


SENT_BODY: Body = _SentBody()


def ignore(_: object) -> None:
    """A pipe's end that takes what it is given and does nothing with it."""
