"""What both ends of the relay share (`_Wire`): header collection for httptools, corked writes, and
flow control between a connection and the one that feeds it."""

from __future__ import annotations

import asyncio

from chaosproxy.adapters.h1.bodies import Producer
from chaosproxy.adapters.h1.heads import Headers


class _Wire(asyncio.Protocol):
    """What both ends of the relay share: header collection for httptools, corked writes, and flow control.

    While a side's transport cannot take more (over HIGH_WATER), the side that feeds it stops reading
    (`_feeder`: the other end of a pass-through or a tunnel), and a coroutine writing to it waits in
    `drain`.

    A message that starts a piece of input is known by that piece (`_head_piece`, while its head is
    parsed), so its head can go on as it was written when nothing in it must change.
    """

    _piece: bytes | None  # the piece being parsed, while no message began in it or before it
    _head_piece: bytes | None
    _mid_message = False

    transport: asyncio.Transport
    _out: list[bytes] | None
    _headers: Headers
    _trailers: Headers | None
    _drain: asyncio.Future[None] | None
    _writing_paused: bool

    def _writable(self) -> bool:
        raise NotImplementedError

    def _feeder(self) -> Producer | None:
        """Whose reading stops while this side's transport is full."""
        raise NotImplementedError

    def _gone(self) -> BaseException | None:
        """What a drain raises when this side's connection is gone (None while it is there)."""
        raise NotImplementedError

    def pause_writing(self) -> None:
        self._writing_paused = True
        if (feeder := self._feeder()) is not None:
            feeder.pause_reading()

    def resume_writing(self) -> None:
        self._writing_paused = False
        if (feeder := self._feeder()) is not None:
            feeder.resume_reading()
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)

    def _end_drain(self, error: BaseException) -> None:
        if self._drain is not None and not self._drain.done():
            self._drain.set_exception(error)

    async def drain(self) -> None:
        if (gone := self._gone()) is not None:
            raise gone
        if self._writing_paused:
            if self._drain is None or self._drain.done():
                self._drain = asyncio.get_running_loop().create_future()
            await self._drain

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._trailers is not None:
            self._trailers.append((name, value))
        else:
            self._headers.append((name, value))

    def cork(self) -> None:
        """Hold writes until `uncork`: a head and body written in one turn go out in one send."""
        if self._out is None:
            self._out = []

    def uncork(self) -> None:
        out, self._out = self._out, None
        if out and self._writable():
            self.transport.write(out[0] if len(out) == 1 else b"".join(out))

    def discard_corked(self) -> None:
        """Drop what was written since `cork`: it must not go out."""
        if self._out is not None:
            self._out.clear()

    def unwrite(self, size: int) -> None:
        """Drop the last `size` bytes written since `cork`: they must not go out."""
        out = self._out
        while out and size > 0:
            last = out.pop()
            if len(last) > size:
                out.append(last[:len(last) - size])
            size -= len(last)
