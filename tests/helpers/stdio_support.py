"""Running `chaosproxy stdio` for the tests: its command line, scenarios, the processes it starts
(found through /proc), and an SDK transport whose host stops reading when told to."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import yaml
from mcp import StdioServerParameters
from mcp.client._transport import TransportStreams
from mcp.client.stdio import stdio_client
from mcp.shared.message import SessionMessage

from chaosproxy.adapters.stdio import GUARDIAN
from tests.helpers.mcp_support import SERVER

PROXY = [sys.executable, "-m", "chaosproxy", "stdio"]
MCP_SERVER = [*SERVER, "stdio"]  # the demo tool server
TEST_SERVER = [sys.executable, "-m", "tests.helpers.stdio_server"]  # the misbehaving one
WAIT = 60  # seconds: the bound on any one wait (servers start slowly on a loaded machine)


def rpc(rpc_id: int | str, method: str, **params: Any) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": rpc_id, "method": method, "params": params}).encode() + b"\n"


def scenario_file(tmp_path: Path, *rules: dict[str, Any]) -> Path:
    path = tmp_path / f"scenario-{len(list(tmp_path.glob('scenario-*')))}.yaml"
    path.write_text(yaml.safe_dump({"rules": list(rules)}))
    return path


def proxied(log: Path, *flags: str, server: list[str] = MCP_SERVER) -> StdioServerParameters:
    """The relay in front of `server`, as an MCP client config names it."""
    args = [*PROXY[1:], "--log", str(log), *flags, "--", *server]
    return StdioServerParameters(command=sys.executable, args=args)


def alive(pid: int) -> bool:
    """Running (a zombie is not: it is dead and waits only to be reaped)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not alive(pid)


def children(pid: int) -> list[int]:
    return [int(child) for task in Path(f"/proc/{pid}/task").iterdir()
            for child in (task / "children").read_text().split()]


def server_of(relay: int) -> int:
    """The pid of the server command a relay started (its other child is the guardian of its group)."""
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        for child in children(relay):
            with contextlib.suppress(FileNotFoundError):
                if GUARDIAN.encode() not in Path(f"/proc/{child}/cmdline").read_bytes():
                    return child
        time.sleep(0.05)
    raise AssertionError("the relay started no server")


def relay_pid(marker: str) -> int:
    """The pid of the relay this process started whose command line holds `marker` (e.g. its log path)."""
    for child in children(os.getpid()):
        with contextlib.suppress(FileNotFoundError):
            argv = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
            if b"chaosproxy" in argv and marker.encode() in argv:
                return child
    raise AssertionError(f"no relay with {marker} among this process's children")


def peak_rss_mib(pid: int) -> float:
    """The peak resident set size of a live process, in MiB."""
    status = Path(f"/proc/{pid}/status").read_text().splitlines()
    return int(next(line for line in status if line.startswith("VmHWM")).split()[1]) / 1024


@contextlib.asynccontextmanager
async def stalling_host(params: StdioServerParameters, stall_on: str, resume: anyio.Event
                        ) -> AsyncIterator[TransportStreams]:
    """The SDK's stdio transport, but the host stops reading at the first message with method `stall_on`
    until `resume` is set: the pipe from the relay fills, as with a host whose UI thread is busy."""
    async with stdio_client(params) as (read, write):
        passed, received = anyio.create_memory_object_stream[SessionMessage | Exception](0)

        async def forward() -> None:
            stalled = False
            async with passed:
                async for item in read:
                    if not stalled and isinstance(item, SessionMessage) and \
                            getattr(item.message, "method", None) == stall_on:
                        stalled = True
                        await resume.wait()
                    await passed.send(item)

        async with anyio.create_task_group() as group:
            group.start_soon(forward)
            yield received, write
            group.cancel_scope.cancel()
