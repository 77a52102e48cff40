"""A body cut at 0 bytes is cut at once: `truncate` with bytes 0 and `reset` with after_bytes 0 end the
agent's response after its head, without waiting for the upstream's body, which a slow or silent upstream
may not send for long. Real sockets: an upstream that sends its head and then nothing."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from tests.helpers.framing_support import RawClient, read_request
from tests.helpers.support import rule

SILENT_S = 8.0  # how long the upstream sends nothing after its head
PROMPT_S = 3.0  # the agent's response ends well within this (generous: a shared machine)


@pytest.mark.parametrize("fault,ends", [({"type": "truncate", "bytes": 0}, "close"),
                                        ({"type": "reset", "after_bytes": 0}, "reset")])
@pytest.mark.parametrize("framing", [b"Content-Length: 64\r\n", b"Transfer-Encoding: chunked\r\n"])
def test_a_cut_at_zero_bytes_ends_the_response_without_waiting_for_the_body(
        make_proxy: Any, scripted: Any, fault: dict[str, Any], ends: str, framing: bytes) -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:  # /slow: a head and then nothing; any other path: a whole answer on the same connection
            head, _ = await read_request(reader)
            if head.startswith(b"GET /slow "):
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n" + framing + b"\r\n")
                await writer.drain()
                await asyncio.sleep(SILENT_S)
                return
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await writer.drain()

    proxy = make_proxy(rule("cut", fault, match={"path": "/slow"}), to=scripted(script).url)
    with RawClient(proxy.url, timeout=SILENT_S + 5) as client:
        client.send(b"GET /slow HTTP/1.1\r\nHost: a\r\n\r\n")
        started = time.monotonic()
        received, how = b"", "close"
        try:
            while piece := client.sock.recv(4096):
                received += piece
        except ConnectionResetError:
            how = "reset"
        except TimeoutError:
            how = "waited"
        took = time.monotonic() - started
    assert received.startswith(b"HTTP/1.1 200 OK\r\n") and received.endswith(b"\r\n\r\n")  # the head, no body
    assert how == ends
    assert took < PROMPT_S
    with RawClient(proxy.url, timeout=PROMPT_S) as client:  # the cut connection upstream is not used again
        client.send(b"GET /fine HTTP/1.1\r\nHost: a\r\n\r\n")
        assert client.response()[::2] == (200, b"ok")
