"""Raw HTTP/1.1 on real sockets for framing tests: a scripted upstream and a client that reads responses
one after another from one connection (pipelining, HEAD, chunked, trailers)."""

from __future__ import annotations

import asyncio
import http.client
import socket
from collections.abc import Awaitable, Callable
from typing import Any, BinaryIO

from tests.helpers.support import ServerLoop

Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class ScriptedUpstream:
    """An upstream that plays `script` on each connection it accepts (on the server loop)."""

    def __init__(self, server_loop: ServerLoop, script: Script) -> None:
        self.server_loop = server_loop
        self.connections = 0

        self.serving: set[asyncio.Task[None]] = set()

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.connections += 1
            task = asyncio.current_task()
            assert task is not None
            self.serving.add(task)
            task.add_done_callback(self.serving.discard)
            try:
                await script(reader, writer)
            except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
                pass
            finally:
                writer.close()

        async def start() -> asyncio.Server:
            return await asyncio.start_server(serve, "127.0.0.1", 0)

        self.server = server_loop.run(start())
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    def close(self) -> None:
        async def stop() -> None:
            self.server.close()
            for task in list(self.serving):
                task.cancel()
            if self.serving:
                await asyncio.wait(self.serving, timeout=5)
        self.server_loop.run(stop())


async def read_request(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """One request's head and (Content-Length or chunked) body, as raw bytes."""
    head = await reader.readuntil(b"\r\n\r\n")
    lower = head.lower()
    body = b""
    if b"transfer-encoding: chunked" in lower:
        while True:
            size_line = await reader.readuntil(b"\r\n")
            size = int(size_line.split(b";")[0], 16)
            if size == 0:
                while await reader.readuntil(b"\r\n") != b"\r\n":  # trailers
                    pass
                break
            body += await reader.readexactly(size)
            await reader.readexactly(2)
    elif b"content-length:" in lower:
        length = int(lower.split(b"content-length:")[1].split(b"\r\n")[0])
        body = await reader.readexactly(length)
    return head, body


class _Kept:
    """The connection's reader as one response sees it: closing it (at the response's end) keeps it open."""

    def __init__(self, file: BinaryIO) -> None:
        self._file = file

    def __getattr__(self, name: str) -> Any:
        return getattr(self._file, name)

    def close(self) -> None:
        pass


class _OneFile:
    """What http.client.HTTPResponse needs of a socket: one shared buffered reader for every response."""

    def __init__(self, file: BinaryIO) -> None:
        self.file = file

    def makefile(self, *_: Any, **__: Any) -> Any:
        return _Kept(self.file)


class RawClient:
    """A client connection that writes bytes as given and parses the responses in order."""

    def __init__(self, url: str, timeout: float = 10) -> None:
        host, port = url.removeprefix("http://").split(":")
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        self.file = self.sock.makefile("rb")

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def response(self, method: str = "GET") -> tuple[int, http.client.HTTPMessage, bytes]:
        response = http.client.HTTPResponse(_OneFile(self.file), method=method)  # type: ignore[arg-type]
        response.begin()
        return response.status, response.headers, response.read()

    def read_line(self) -> bytes:
        return self.file.readline()

    def close(self) -> None:
        self.file.close()
        self.sock.close()

    def __enter__(self) -> RawClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
