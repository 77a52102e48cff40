"""Accepting agents' connections (`Listener`, which pauses rather than resets when the process is out
of open files), and stopping (`stop_serving`)."""

from __future__ import annotations

import asyncio
import errno
import socket

from chaosproxy.adapters.h1.client import ClientConnection, Handler
from chaosproxy.telemetry.log import ops

OUT_OF_FILES = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
ACCEPT_BATCH = 64  # connections accepted per wake-up, so that one busy listener cannot starve the loop
ACCEPT_PAUSE_S = 0.5  # how long accepting stops when the process is out of files (nginx: 500 ms)
OUT_OF_FILES_LOG_S = 10.0  # at most one line this often says so


class Listener:
    """Accepts agents' connections on a listening socket, one ClientConnection each.

    The event loop's own server would do, but for one case: out of open files (EMFILE), uvloop's (libuv's)
    accepts every waiting connection and closes it at once, so agents that were queued get a reset. Here
    accepting pauses instead (as nginx does), the connections open go on being served, waiting agents
    stay in the kernel's queue until a file is free, and the limit is logged once in a while and counted.
    """

    def __init__(self, handler: Handler, sock: socket.socket) -> None:
        self.handler = handler
        self.sock = sock
        self.loop = asyncio.get_running_loop()
        self._logged_at = -OUT_OF_FILES_LOG_S
        self._closed = False
        self._setting_up: set[asyncio.Task[None]] = set()
        sock.setblocking(False)
        self.loop.add_reader(sock.fileno(), self._accept)

    def _accept(self) -> None:
        for _ in range(ACCEPT_BATCH):
            try:
                conn, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in OUT_OF_FILES:
                    self._pause(exc)
                return  # (any other error is the one connection's: it is gone; the next wake-up goes on)
            conn.setblocking(False)
            task = self.loop.create_task(self._serve(conn))
            self._setting_up.add(task)  # (the loop keeps only a weak reference)
            task.add_done_callback(self._setting_up.discard)

    async def _serve(self, conn: socket.socket) -> None:
        try:
            await self.loop.connect_accepted_socket(lambda: ClientConnection(self.handler), conn)
        except OSError:  # the agent left before its connection was set up
            conn.close()

    def _pause(self, error: OSError) -> None:
        self.handler.limits.refused["out_of_files"] += 1
        if self.loop.time() - self._logged_at >= OUT_OF_FILES_LOG_S:
            self._logged_at = self.loop.time()
            ops.warning("out of open files (%s, %d connections open): not accepting for %g s at a time until one "
                        "is free", error.strerror, len(self.handler.connections), ACCEPT_PAUSE_S)
        self.loop.remove_reader(self.sock.fileno())
        self.loop.call_later(ACCEPT_PAUSE_S, self._resume)

    def _resume(self) -> None:
        if not self._closed:
            self.loop.add_reader(self.sock.fileno(), self._accept)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.loop.remove_reader(self.sock.fileno())
            self.sock.close()


async def stop_serving(listener: Listener | None, tasks: set[asyncio.Task[None]]) -> None:
    """Stop accepting agents and cancel the exchanges under way, waiting up to 1 s for them to end."""
    if listener is not None:
        listener.close()
    for task in list(tasks):
        task.cancel()
    if tasks:
        await asyncio.wait(tasks, timeout=1)
