"""The agent's TCP connection under a mitmproxy flow, for faults below HTTP (pace its writes, close it,
reset it): mitmproxy does not expose it, so it is reached through the proxyserver addon's table of live
connections, the one piece of mitmproxy's internals chaosproxy relies on."""

from __future__ import annotations

import asyncio
import socket
import struct
from collections import deque
from collections.abc import Callable
from typing import Any

from mitmproxy.addons import proxyserver
from mitmproxy.connection import Client
from mitmproxy.proxy.server import ConnectionIO


def reset_transport(transport: asyncio.BaseTransport | None) -> None:
    """Abort with RST (SO_LINGER 0) rather than a polite FIN, as a crashed server or middlebox would."""
    if transport is None:
        return
    sock: socket.socket | None = transport.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()  # type: ignore[attr-defined]


class Wire:
    """The agent's TCP connection under a flow, for faults below HTTP: pace its writes, close it, reset it.

    mitmproxy keeps it in the proxyserver addon's table of live connections (the table its inject.*
    commands use); everything mitmproxy sends the agent goes through that ConnectionIO's writer.
    """

    def __init__(self, io: ConnectionIO) -> None:
        self.io = io

    @classmethod
    def of(cls, client: Client, server: proxyserver.Proxyserver | None) -> Wire | None:
        handler = server.connections.get(client.id) if server is not None else None
        io = getattr(handler, "transports", {}).get(client)
        return cls(io) if io is not None and io.writer is not None else None

    def pace(self, delay: float) -> None:
        """From now on, each write (one body piece: one TLS record) goes out `delay` s after the one before."""
        if not isinstance(self.io.writer, PacedWriter):
            self.io.writer = PacedWriter(self.io, delay)  # type: ignore[assignment]  # (a stand-in writer)

    def unpace(self) -> None:
        """Writes from now on go out at once (after those held back); then the real writer is put back."""
        if isinstance(writer := self.io.writer, PacedWriter):
            writer.release()

    def close(self) -> None:
        """FIN after the bytes written so far (no TLS close_notify: the body just stops)."""
        self.io.writer.close()  # type: ignore[union-attr]

    def reset(self) -> None:
        writer = self.io.writer
        if isinstance(writer, PacedWriter):
            writer.then(lambda: reset_transport(writer.writer.transport))
        else:
            reset_transport(writer.transport)  # type: ignore[union-attr]


class PacedWriter:
    """Stands in for a connection's asyncio writer while a body drips: holds each write back `delay` s.

    `drain` waits for the held writes, so mitmproxy stops reading upstream meanwhile: memory stays flat.
    """

    def __init__(self, io: ConnectionIO, delay: float) -> None:
        self.io = io
        self.writer: asyncio.StreamWriter = io.writer  # type: ignore[assignment]
        self.delay: float | None = delay
        self.pending: deque[tuple[Callable[[], Any], float | None]] = deque()  # with the pause before it
        self.flushed = asyncio.Event()
        self.flushed.set()
        self.task: asyncio.Task[None] | None = None
        self.first = True

    def write(self, data: bytes) -> None:
        self.then(lambda: self.writer.write(data), self.delay)

    def write_eof(self) -> None:
        self.then(self.writer.write_eof)

    def close(self) -> None:
        self.then(self.writer.close)

    def is_closing(self) -> bool:
        return self.writer.is_closing()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self.writer.get_extra_info(name, default)

    async def drain(self) -> None:
        await self.flushed.wait()
        await self.writer.drain()

    def release(self) -> None:
        self.delay = None
        self.then(lambda: None)  # puts the real writer back once what is held has gone out

    def then(self, operation: Callable[[], Any], delay: float | None = None) -> None:
        self.pending.append((operation, delay))
        self.flushed.clear()
        if self.task is None:
            self.task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        try:
            while self.pending:
                operation, delay = self.pending.popleft()
                if delay is not None and not self.first:
                    await asyncio.sleep(delay)
                self.first = self.first and delay is None
                if self.writer.is_closing():
                    self.pending.clear()
                    break
                operation()
        finally:
            self.task = None
            self.flushed.set()
            if self.delay is None and self.io.writer is self:
                self.io.writer = self.writer
