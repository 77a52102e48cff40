"""A warm proxy launcher: a drill's proxies start in milliseconds instead of paying Python's imports each.

Every run of a drill has its own `chaosproxy run`, and most of a fresh one's start-up is importing
(the HTTP stack, pydantic, the fault registry). The launcher is one process per drill that imports all
that once, then forks a proxy per request: each child starts its own session, points its standard
streams where the run wants them, takes the run's environment and runs the same `chaosproxy` command
line a fresh process would. The child dies with the launcher, and the launcher with the drill.

The protocol is JSON lines: the drill writes {"id", "argv", "env", "stderr"}, the launcher answers
{"id", "pid"} (or {"id", "error"}) and, when a child ends, {"exited": pid, "status": code}.
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import signal
import sys
from pathlib import Path
from typing import Any

_PR_SET_PDEATHSIG = 1
_PRCTL = getattr(ctypes.CDLL(None), "prctl", None) if sys.platform == "linux" else None


def die_with_parent() -> None:
    """Be killed when the thread that started this process dies (Linux): the drill's processes never
    outlive it (a drill killed outright, a lost Ray worker). As a preexec_fn, or first thing in a child."""
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, signal.SIGKILL)


class LaunchedProcess:
    """A proxy the launcher forked, with what a drill uses of an asyncio subprocess: pid, returncode, wait."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._exited = asyncio.Event()

    def exited(self, status: int) -> None:
        self.returncode = status
        self._exited.set()

    async def wait(self) -> int:
        await self._exited.wait()
        assert self.returncode is not None
        return self.returncode


class Launcher:
    """The drill's side: starts the launcher, asks it for proxies, learns when they end."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.replies: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.children: dict[int, LaunchedProcess] = {}
        self.next_id = 0
        self.reader = asyncio.create_task(self._read())

    @classmethod
    async def start(cls, preexec_fn: Any = None) -> Launcher:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "chaosproxy.drill.fork_server",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            start_new_session=True,
            preexec_fn=preexec_fn,
        )
        launcher = cls(proc)
        try:
            await launcher._ask({})  # answered once everything is imported
        except OSError:
            await launcher.close()
            raise
        return launcher

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        while line := await self.proc.stdout.readline():
            message = json.loads(line)
            if "exited" in message:
                if (child := self.children.pop(message["exited"], None)) is not None:
                    child.exited(message["status"])
            elif (reply := self.replies.pop(message["id"], None)) is not None:
                reply.set_result(message)
        for reply in self.replies.values():  # the launcher is gone: nothing more will be answered
            reply.set_exception(OSError("the proxy launcher exited"))
        for child in self.children.values():
            child.exited(-signal.SIGKILL)  # its children died with it

    async def _ask(self, request: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.next_id += 1
        reply = self.replies[self.next_id] = asyncio.get_running_loop().create_future()
        self.proc.stdin.write(json.dumps({**request, "id": self.next_id}).encode() + b"\n")
        await self.proc.stdin.drain()
        return await reply

    async def launch(self, argv: list[str], env: dict[str, str], stderr: Path) -> LaunchedProcess:
        """`chaosproxy ARGV...` in a child of its own session; its stdout goes nowhere, its stderr to
        `stderr` (made empty now, so it is there to be read at once). Raises OSError when the launcher
        cannot fork it."""
        stderr.write_bytes(b"")
        reply = await self._ask({"argv": argv, "env": env, "stderr": str(stderr)})
        if "error" in reply:
            raise OSError(reply["error"])
        child = self.children[reply["pid"]] = LaunchedProcess(reply["pid"])
        return child

    async def close(self) -> None:
        """Ends the launcher (its children die with it) and waits for it."""
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            await asyncio.wait_for(self.proc.wait(), 5)
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()
        await self.reader
