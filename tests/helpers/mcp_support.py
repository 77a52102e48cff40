"""Starting the bundled MCP tool server as a real process, and talking to it with the real SDK client."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

from mcp import Client
from mcp.client.sse import sse_client

from tests.helpers.support import free_port

SERVER = [sys.executable, "-m", "chaosproxy.demo.mcp_server"]
STRICT_SERVER = [sys.executable, "-m", "tests.helpers.strict_server"]


@contextlib.contextmanager
def serve(transport: str, *flags: str, command: list[str] = SERVER) -> Iterator[str]:
    """Run a tool server over `transport` (http or sse) on a free port; yields its base URL."""
    port = free_port()
    proc = subprocess.Popen([*command, transport, "--port", str(port), *flags],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 20
        while True:
            assert proc.poll() is None, "the MCP tool server exited"
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "the MCP tool server did not start"
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)


def client(url: str, mode: str = "auto", **kwargs: Any) -> Client:
    """An SDK client for a streamable HTTP URL (…/mcp) or a legacy SSE URL (…/sse)."""
    target = sse_client(url) if url.endswith("/sse") else url
    return Client(target, mode=mode, **kwargs)


def dump(result: Any) -> Any:
    """A result as plain data, without per-connection metadata, for comparing direct and proxied runs."""
    data = result.model_dump(mode="json", exclude_none=True)
    data.pop("meta", None)
    return data
