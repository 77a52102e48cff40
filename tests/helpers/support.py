"""Test support: a background server loop, a handle on a running proxy, scenario shorthands."""

from __future__ import annotations

import asyncio
import http.client
import json
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, Protocol

from chaosproxy.engine.core import Engine
from chaosproxy.telemetry.log import PerturbationLog


class ServerLoop:
    """An event loop in a daemon thread; `run` executes a coroutine there and returns its result."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run[T](self, coro: Coroutine[Any, Any, T], timeout: float = 30) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


class RunningProxy:
    """A chaosproxy HTTP proxy in front of the test tool server, with its perturbation log."""

    def __init__(self, url: str, engine: Engine, log_path: Path, log: PerturbationLog | None = None) -> None:
        self.url = url
        self.engine = engine
        self.log_path = log_path
        self.log = log

    def events(self, kind: str | None = None) -> list[dict[str, Any]]:
        return log_events(self.log_path, kind)


class MakeProxy(Protocol):
    """The `make_proxy` fixture: start a proxy with a scenario (YAML text or a dict), a seed, an upstream
    (`to`, default the test tool server) and HttpProxy options; it is stopped after the test."""

    def __call__(self, scenario: str | dict[str, Any] = "rules: []", *, seed: int = 7, to: str | None = None,
                 log_batch_s: float = 0.0, **options: Any) -> RunningProxy: ...


def http_exchange(address: str, method: str, path: str, *, headers: dict[str, str] | None = None,
                  body: bytes | None = None) -> tuple[int, bytes]:
    """One request to `address` (HOST:PORT) on a connection of its own: the status and the body."""
    conn = http.client.HTTPConnection(address, timeout=10)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def http_status(url: str, headers: dict[str, str] | None = None) -> int:
    """The status of a GET of `url`, an error's included: a plain client, as in a user's own test."""
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        error.close()
        return error.code


def log_events(path: Path, kind: str | None = None) -> list[dict[str, Any]]:
    """The complete lines of a perturbation log, of one `kind` or all. The proxy may be writing a batch
    while the test reads: a last line without its newline is not written yet, so it is left for later."""
    text = path.read_text()
    lines = [json.loads(line) for line in text[:text.rfind("\n") + 1].splitlines()]
    return [line for line in lines if kind is None or line["event"] == kind]


def call_lines(proxy: Any, count: int, timeout: float = 3.0) -> list[dict[str, Any]]:
    """The proxy's call lines once `count` are written (each is written as its exchange ends, which
    may be just after the client has read the last byte)."""
    deadline = time.monotonic() + timeout
    while len(lines := proxy.events("call")) < count and time.monotonic() < deadline:
        time.sleep(0.02)
    return lines


def rule(name: str, fault: dict[str, Any], **gates: Any) -> dict[str, Any]:
    """A one-rule scenario dict."""
    return {"rules": [{"name": name, "fault": fault, **gates}]}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_listening(port: int, proc: subprocess.Popen, timeout: float = 20) -> None:
    """Until something accepts connections on `port`; fails at once if `proc` exits first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else "exited"
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise AssertionError(f"nothing listening on {port}")
