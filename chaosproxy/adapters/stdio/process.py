"""The processes on either side of the relay: the server's, spawned in a process group of its own
under a guardian so that nothing it starts outlives the relay (`spawn`, `ServerProcess`), with its exit
status as a shell reports it; and this one's stdin and stdout, taken for the relay (`claim_stdio`)."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Sequence

from chaosproxy.errors import ChaosproxyError

KILL_GRACE = 2.0  # after SIGTERM, before SIGKILL; after SIGKILL, before giving up on it
EXIT_CRASHED = 1  # our exit status after a reset: the agent saw the server die
GUARDIAN = "trap '' HUP INT TERM; while read -r _; do :; done; kill -KILL 0"  # see ServerProcess


class SpawnError(ChaosproxyError):
    """The server command cannot run; `status` is what a shell would exit with (127, 126)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class ServerProcess(subprocess.Popen[bytes]):
    """The server command, in a process group of its own so that a signal reaches the server itself
    and not just a launcher in front of it (`sh -c`, a wrapper script, npx, uvx).

    The group's leader is a guardian: a shell, ignoring the signals we forward, that waits for the end
    of a pipe only the relay holds. However the relay ends (SIGKILL included), the pipe closes and the
    guardian kills the whole group: nothing the server started outlives the relay as an orphan.
    """

    def __init__(self, command: Sequence[str]) -> None:
        watched, self._lifeline = os.pipe()
        try:
            self._guardian = subprocess.Popen(["/bin/sh", "-c", GUARDIAN], stdin=watched,
                                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                              process_group=0)
        finally:
            os.close(watched)
        self.group = self._guardian.pid
        try:
            super().__init__(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0,
                             process_group=self.group)
        except BaseException:
            self.release()
            raise

    def signal_group(self, sig: int) -> None:
        """Send `sig` to the server and everything it started (the guardian ignores all but SIGKILL).
        A group that is gone, or holds only processes we may not signal, is no failure of the relay."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.group, sig)

    def release(self) -> None:
        """Let the guardian kill what is left of the group, and reap it: the relay is done with the server."""
        if self._lifeline >= 0:
            os.close(self._lifeline)
            self._lifeline = -1
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._guardian.wait(KILL_GRACE)


def spawn(command: Sequence[str]) -> ServerProcess:
    """Start the server with pipes for stdin and stdout; stderr and the environment are ours."""
    try:
        return ServerProcess(command)
    except FileNotFoundError:
        raise SpawnError(127, f"chaosproxy stdio: {command[0]}: command not found") from None
    except OSError as exc:
        raise SpawnError(126, f"chaosproxy stdio: cannot run {command[0]}: {exc.strerror or exc}") from None


def claim_stdio() -> tuple[int, int]:
    """Take fds 0 and 1 for the relay, leaving /dev/null and stderr in their place.

    Only protocol frames may reach the client, so a stray print from anywhere in the process lands
    on stderr; and closing the relay's copies really closes the client's pipes (it waits for EOF).
    """
    agent_in, agent_out = os.dup(0), os.dup(1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(2, 1)
    return agent_in, agent_out


def exit_status(returncode: int | None) -> int:
    """The child's exit code as a shell reports it (128 + N for death by signal N)."""
    if returncode is None:
        return EXIT_CRASHED
    return 128 - returncode if returncode < 0 else returncode
