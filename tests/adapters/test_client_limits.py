"""What an agent's connection may cost (issue 35, and the head limit of issue 23): request heads over
their limits are refused with 431, a head sent too slowly gets 408, and an idle keep-alive connection is
closed; the proxy keeps serving everyone else. On real sockets."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time

import pytest

from chaosproxy.adapters.h1 import ClientLimits
from tests.helpers.framing_support import RawClient, read_request


def fast() -> ClientLimits:
    return ClientLimits(max_line=1024, max_head=4096, head_timeout=0.5, idle_timeout=0.5)


def closed_within(sock: socket.socket, seconds: float) -> bytes:
    """What the proxy sends before closing the connection, which it must do within `seconds`."""
    sock.settimeout(seconds)
    received = b""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        piece = sock.recv(65536)
        if not piece:
            return received
        received += piece
    raise AssertionError(f"still open after {seconds} s; received {received!r}")


@pytest.mark.parametrize("head", [
    b"GET /" + b"a" * 2000 + b" HTTP/1.1\r\nHost: a\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: a\r\nX-Big: " + b"v" * 2000 + b"\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: a\r\n" + b"".join(b"X-%d: v\r\n" % n for n in range(1000)) + b"\r\n",
    b"GET / HTTP/1.1\r\nHost: a\r\nX-Unending: " + b"v" * (1 << 20),  # never terminated: refused early
], ids=["request line", "header line", "many headers", "unterminated"])
def test_a_head_over_its_limits_is_refused_with_431_and_the_proxy_keeps_serving(make_proxy, head):
    proxy = make_proxy(limits=(limits := ClientLimits(max_line=1024, max_head=4096)))
    with RawClient(proxy.url) as client:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # refused before it was all sent
            client.send(head)
        answer = closed_within(client.sock, 5)
    assert answer.startswith(b"HTTP/1.1 431 ") and b"Connection: close" in answer
    assert limits.refused["head_too_large"] == 1
    with RawClient(proxy.url) as client:
        client.send(b"GET /health HTTP/1.1\r\nHost: a\r\n\r\n")
        assert client.response()[:3:2] == (200, b"ok")


def test_heads_within_the_limits_pass(make_proxy):
    proxy = make_proxy(limits=ClientLimits(max_line=1024, max_head=4096))
    with RawClient(proxy.url) as client:
        client.send(b"GET /echo/" + b"a" * 900 + b" HTTP/1.1\r\nHost: a\r\nX-Ok: " + b"v" * 900 + b"\r\n\r\n")
        assert client.response()[0] == 200


@pytest.mark.slow
def test_a_head_sent_too_slowly_is_answered_408_and_closed(make_proxy):
    proxy = make_proxy(limits=(limits := fast()))
    with RawClient(proxy.url) as client:
        started = time.monotonic()
        client.send(b"GET /health HTTP/1.1\r\nHo")  # and no more
        answer = closed_within(client.sock, 5)
    assert answer.startswith(b"HTTP/1.1 408 ")
    assert 0.3 < time.monotonic() - started < 3  # to within a sweep (a quarter of the timeout)
    assert limits.refused["head_timeout"] == 1


@pytest.mark.slow
def test_an_idle_keep_alive_connection_is_closed_but_a_slow_response_is_not(make_proxy, scripted):
    async def slow(reader, writer):
        await read_request(reader)
        await asyncio.sleep(1.5)  # three idle timeouts long
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        await reader.read()

    proxy = make_proxy(limits=(limits := fast()), to=scripted(slow).url)
    with RawClient(proxy.url) as client:
        client.send(b"GET /slow HTTP/1.1\r\nHost: a\r\n\r\n")
        assert client.response()[0] == 200
        started = time.monotonic()
        assert closed_within(client.sock, 5) == b""  # then idle: closed without a word
    assert 0.3 < time.monotonic() - started < 3  # to within a sweep (a quarter of the timeout)
    assert limits.refused["idle_timeout"] == 1


def test_what_the_proxy_refused_is_counted_in_its_metrics(make_proxy):
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from chaosproxy.control.api import ControlServer

    proxy = make_proxy(limits=ClientLimits(max_line=1024, max_head=4096))
    with RawClient(proxy.url) as client:
        client.send(b"GET /" + b"a" * 2000 + b" HTTP/1.1\r\nHost: a\r\n\r\n")
        assert closed_within(client.sock, 5).startswith(b"HTTP/1.1 431 ")
    scraped = generate_latest(ControlServer(proxy.engine).metrics.registry).decode()
    families = {family.name: family for family in text_string_to_metric_families(scraped)}
    refused = {sample.labels["reason"]: sample.value
               for sample in families["chaosproxy_client_connections_refused"].samples}
    assert refused == {"head_too_large": 1, "head_timeout": 0, "idle_timeout": 0, "out_of_files": 0}
