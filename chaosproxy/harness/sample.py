"""One sample-epoch's chaos: its proxies in front of the tool servers, its log, and what fired in it.

The HTTP proxies are the embedded proxy's parts (an engine and an HttpProxy) served on the event loop
the sample already runs on: no thread and no control API, so one starts in well under a millisecond
(EmbeddedProxy, with both, takes ~20 ms; a `chaosproxy run` process ~1.2 s). A stdio server is run
through `chaosproxy stdio`, one process per MCP session as Inspect opens them, each with a seed drawn
from the sample-epoch's and the session's number (one seed for all would give every session the same
draws: a retry in a new session would meet exactly the fault it retries). Every proxy of the sample
appends to the sample's own log, which is a drill run's log.jsonl once imported.
"""

from __future__ import annotations

import collections
import contextlib
import sys
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from pathlib import Path
from typing import Any

import orjson
from yarl import URL

from chaosproxy import __version__
from chaosproxy.adapters.http import HttpProxy
from chaosproxy.control.runtime import open_engine
from chaosproxy.drill.plan import CLEAN_SCENARIO, derive_seed
from chaosproxy.drill.runner import PROXY_ENVIRONMENT
from chaosproxy.harness.plan import HANDSHAKE, Draw
from chaosproxy.telemetry.log_schema import Event, Key

HOST = "127.0.0.1"
STORE_KEY = "chaosproxy"  # the sample's store entry, and the score metadata's key


class SampleChaos:
    """Made when a sample-epoch starts, closed when its solver ends (its proxies stop, its log is whole)."""

    def __init__(self, draw: Draw, agent: str, folder: Path, *, tools: bool, model: bool) -> None:
        self.draw = draw
        self.agent = agent
        self.folder = folder
        self.faults_tools, self.faults_model = tools, model
        self.log_path = folder / "log.jsonl"
        self.scenario_text = draw.scenario_text if tools else CLEAN_SCENARIO
        self.gateway_lines: list[dict[str, Any]] = []  # appended by the model gateway's listener
        self._stack = contextlib.AsyncExitStack()
        self._proxies: dict[str, str] = {}  # upstream origin -> this sample's proxy
        self._runs: dict[str, str] = {}  # upstream origin -> its proxy's run id (on each of its log lines)
        self._stdio_sessions = 0
        self._read = 0  # bytes of the log read so far
        self._unclaimed: list[dict[str, Any]] = []  # fault lines no tool call has taken yet
        self.servers: dict[object, Any] = {}  # a tool source -> its Inspect server for this sample-epoch
        self.unavailable: set[object] = set()  # tool sources whose handshake a fault failed
        self.entered: set[object] = set()  # tool sources whose server session was entered (to be exited)
        (folder / "scenario.yaml").write_text(self.scenario_text, encoding="utf-8")

    async def proxy_url(self, upstream: str) -> str:
        """`upstream` through this sample's proxy (started on first use): same path and query."""
        target = URL(upstream)
        origin = str(target.origin())
        if origin not in self._proxies:
            scenario = Draw(self.draw.kind, self.draw.label, self.draw.seed, self.scenario_text,
                            self.draw.scenario_dir).scenario()
            engine = self._stack.enter_context(open_engine(None, seed=self.draw.seed, log_path=self.log_path,
                                                           scenario=scenario))
            proxy = HttpProxy(engine, origin)
            port = await proxy.start(HOST, 0)
            self._stack.push_async_callback(proxy.stop)
            self._proxies[origin] = f"http://{HOST}:{port}"
            self._runs[origin] = engine.log.run_id
        query = f"?{target.raw_query_string}" if target.raw_query_string else ""
        return self._proxies[origin] + (target.raw_path if target.raw_path != "/" else "") + query

    def stdio_command(self, command: str, args: list[str]) -> tuple[str, list[str], dict[str, str]]:
        """The command, arguments and extra environment that run `command` through `chaosproxy stdio`
        for the sample's next MCP session."""
        self._stdio_sessions += 1
        seed = derive_seed(self.draw.seed, f"stdio-{self._stdio_sessions}")
        origin = ["--scenario-dir", self.draw.scenario_dir] if self.draw.scenario_dir else []
        return sys.executable, ["-m", "chaosproxy", "stdio", "--scenario", str(self.folder / "scenario.yaml"),
                                *origin, "--seed", str(seed), "--log", str(self.log_path), "--",
                                command, *args], dict(PROXY_ENVIRONMENT)

    def faults_for(self, tool: str) -> list[dict[str, Any]]:
        """The fault lines logged since the last call ended that belong to a call of `tool`: those naming
        it, and those naming no tool (a fault on the HTTP exchange, the session, the handshake). Lines
        naming another tool wait for that tool's call (parallel calls)."""
        return self._claim(lambda line: line.get(Key.TOOL) in (None, tool))

    def handshake_faults(self, server: Callable[[dict[str, Any]], bool]) -> list[dict[str, Any]]:
        """The fault lines logged on an MCP handshake's messages (HANDSHAKE) of the server whose lines
        `server` tells, that no call has taken yet (another server's faults are not this one's reason)."""
        return self._claim(lambda line: line.get(Key.METHOD) in HANDSHAKE and server(line))

    def of_upstream(self, upstream: str) -> Callable[[dict[str, Any]], bool]:
        """Which log lines are of the proxy in front of `upstream` (an HTTP server): its run id's."""
        origin = str(URL(upstream).origin())
        return lambda line: line.get(Key.RUN_ID) == self._runs.get(origin)

    def _claim(self, mine: Callable[[dict[str, Any]], bool]) -> list[dict[str, Any]]:
        """The fault lines, logged since and left before, that are `mine`; the others are left for later."""
        self._unclaimed += [line for line in self._new_lines() if line.get(Key.EVENT) == Event.FAULT]
        claimed = [line for line in self._unclaimed if mine(line)]
        self._unclaimed = [line for line in self._unclaimed if not mine(line)]
        return claimed

    def _new_lines(self) -> list[dict[str, Any]]:
        """Whole lines appended to the sample's log since the last read (the proxies flush fault lines
        as they write them; stdio proxies are other processes appending to the same file)."""
        try:
            with open(self.log_path, "rb") as log:
                log.seek(self._read)
                data = log.read()
        except FileNotFoundError:
            return []
        whole = data[:data.rfind(b"\n") + 1]
        self._read += len(whole)
        return [orjson.loads(line) for line in whole.splitlines() if line.strip()]

    def lines(self) -> list[dict[str, Any]]:
        """Every line of the sample's log and of its model-API calls, in time order."""
        try:
            own = [orjson.loads(line) for line in self.log_path.read_bytes().splitlines() if line.strip()]
        except FileNotFoundError:
            own = []
        return sorted([*own, *self.gateway_lines], key=lambda line: str(line.get(Key.TS, "")))

    def record(self) -> dict[str, Any]:
        """What the sample's store keeps: the draw, what fired (by type and component), and the log."""
        lines = self.lines()
        faults = [line for line in lines if line.get(Key.EVENT) == Event.FAULT]
        return {"version": __version__, "agent": self.agent, "kind": self.draw.kind, "label": self.draw.label,
                "seed": self.draw.seed, "tools": self.faults_tools, "model": self.faults_model,
                "scenario": self.draw.scenario_text,
                "faulted": bool(faults), "faults": _count(faults, "fault"),
                "components": _count(faults, "component"), "log": lines}

    async def aclose(self) -> None:
        """Stop the sample's proxies; their logs are flushed and closed."""
        await self._stack.aclose()


def _count(lines: list[dict[str, Any]], key: str) -> dict[str, int]:
    return dict(sorted(collections.Counter(str(line.get(key, "?")) for line in lines).items()))



_CURRENT: ContextVar[SampleChaos | None] = ContextVar("chaosproxy_sample", default=None)


@contextlib.contextmanager
def running(chaos: SampleChaos) -> Iterator[None]:
    """`chaos` is the current sample-epoch's for the code run inside (its tool calls included)."""
    token = _CURRENT.set(chaos)
    try:
        yield
    finally:
        _CURRENT.reset(token)


def current_sample() -> SampleChaos:
    """The running sample-epoch's chaos; RuntimeError outside a sample of a chaos task."""
    chaos = _CURRENT.get()
    if chaos is None:
        raise RuntimeError("chaosproxy's MCP servers work inside a sample of a task wrapped with "
                           "chaosproxy.harness.chaos_task(task, plan)")
    return chaos
