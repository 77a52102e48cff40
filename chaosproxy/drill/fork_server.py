"""The launcher process of `launcher.py`: imports once all a run's proxy would import, then forks one
proxy per request from the drill (`python -m chaosproxy.drill.fork_server`). Kept apart from the drill's
side, which the command line imports: this side runs the command line in each child."""

from __future__ import annotations

import contextlib
import gc
import json
import os
import selectors
import signal
import sys
from typing import Any

from chaosproxy.drill.launcher import die_with_parent


def _child(request: dict[str, Any], cli_main: Any) -> None:
    """In the forked child: become the proxy the request asks for. Never returns."""
    status = 1
    try:
        os.setsid()
        die_with_parent()
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        devnull = os.open(os.devnull, os.O_RDWR)
        stderr = os.open(request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        for fd, target in ((0, devnull), (1, devnull), (2, stderr)):
            os.dup2(target, fd)
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))  # the launcher's pipes are not the proxy's
        os.environ.clear()
        os.environ.update(request["env"])
        status = cli_main(request["argv"])
    except SystemExit as exc:
        status = exc.code if isinstance(exc.code, int) else 1
    except BaseException as exc:  # fail open: the child must never return into the launcher's loop (it exits 1)
        print(f"chaosproxy: the launched proxy failed: {exc!r}", file=sys.stderr)
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):  # fail open: a broken stream must not keep the child alive
                stream.flush()
        os._exit(status)


def _preload() -> None:
    """Import, once, all a run's proxy would import itself: what `chaosproxy run` loads on its way to
    listening, every fault (a proxy loads those its scenario names), and what serving loads on first use
    (the event loop, the IDNA codec and thread pool of address lookups, the output-schema checker)."""
    import concurrent.futures.thread  # noqa: F401
    import encodings.idna  # noqa: F401

    import jsonschema.validators  # noqa: F401
    import uvloop  # noqa: F401

    from chaosproxy.adapters import http  # noqa: F401
    from chaosproxy.faults import all_faults
    from chaosproxy.telemetry import tracing  # noqa: F401

    all_faults()
    gc.collect()
    gc.freeze()  # a child's own collections then leave these alone, and their pages shared with the launcher


def main() -> int:
    """Import the proxy once, then fork one per request until stdin closes."""
    _preload()
    from chaosproxy.cli import main as cli_main

    die_with_parent()
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    selector = selectors.DefaultSelector()
    selector.register(0, selectors.EVENT_READ)
    selector.register(wake_read, selectors.EVENT_READ)
    out = sys.stdout.buffer
    pending = b""

    def send(message: dict[str, Any]) -> None:
        out.write(json.dumps(message).encode() + b"\n")
        out.flush()

    while True:
        for key, _ in selector.select():
            if key.fd == wake_read:
                os.read(wake_read, 4096)
                while True:
                    try:
                        pid, status = os.waitpid(-1, os.WNOHANG)
                    except ChildProcessError:
                        break
                    if pid == 0:
                        break
                    send({"exited": pid, "status": os.waitstatus_to_exitcode(status)})
                continue
            chunk = os.read(0, 65536)
            if not chunk:
                return 0
            pending += chunk
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                request = json.loads(line)
                if "argv" not in request:
                    send({"id": request["id"]})  # the hello: ready
                    continue
                try:
                    pid = os.fork()
                except OSError as exc:
                    send({"id": request["id"], "error": f"cannot fork a proxy: {exc.strerror or exc}"})
                    continue
                if pid == 0:
                    selector.close()
                    _child(request, cli_main)
                send({"id": request["id"], "pid": pid})


if __name__ == "__main__":
    raise SystemExit(main())
