"""Carrying out drill runs: a proxy per run, the agent against it, an optional judge, all bounded in time.

Every process is started in its own process group and ended by it (SIGTERM, then SIGKILL after a
grace period), so an agent's children, and a stdio proxy it spawned, go with it. A hung agent is a
finding (`timeout`), never a stuck drill. On Linux each is also killed when the process that started
it dies (a drill killed outright, a lost Ray worker), so nothing is left behind serving or waiting.
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO

from yarl import URL

from chaosproxy.drill.config import DrillConfig, shown_upstream
from chaosproxy.drill.launcher import LaunchedProcess, Launcher, die_with_parent
from chaosproxy.drill.plan import RunSpec
from chaosproxy.records.logfile import read_events
from chaosproxy.telemetry.log_schema import Event, Key
from chaosproxy.telemetry.tracing import NO_TRACING, Tracing

PROXY_START_S = 20.0  # how long a proxy may take to start listening
GRACE_S = 3.0  # between SIGTERM and SIGKILL
_LISTENING = re.compile(rb"listening on http://127\.0\.0\.1:(\d+) ")
RUN_FILE = "run.json"
# A run's proxy uses no pydantic plugins; looking for them would scan every installed package (~20 ms a run).
PROXY_ENVIRONMENT = {"PYDANTIC_DISABLE_PLUGINS": "__all__"}
@dataclass(slots=True)
class RunResult:
    """One line of results.jsonl.

    `status` is passed, failed, timeout (the agent ran over) or error: the drill's own machinery failed
    (the proxy did not start or died, the judge hung), and the run counts for nothing.
    """

    run: str
    label: str
    kind: str
    seed: int
    status: str = "error"
    exit_code: int | None = None
    judge_exit: int | None = None
    duration_s: float = 0.0
    proxy_start_s: float | None = None  # from starting the run's proxy to its listening (--upstream runs)
    faults: dict[str, int] = field(default_factory=dict)
    components: dict[str, int] = field(default_factory=dict)
    error: str | None = None
    trace_id: str | None = None  # the run's trace, when spans are exported (chaosproxy.telemetry.tracing)

    @property
    def success(self) -> bool | None:
        return None if self.status == "error" else self.status == "passed"

    def record(self) -> dict[str, Any]:
        return {**asdict(self), "success": self.success}


def _environment() -> dict[str, str]:
    """The drill's environment without CHAOSPROXY_* variables: `chaosproxy run` and `stdio` read their
    options from those, and a run's proxy must have only the options the drill gives it."""
    return {key: value for key, value in os.environ.items() if not key.startswith("CHAOSPROXY_")}


class _RunError(Exception):
    """The drill's machinery failed for this run (not the agent)."""


def _signal_group(pgid: int, sig: int) -> bool:
    """Signal a process group; False when no process of it is left."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    return True


class _Group:
    """A process started as the leader of its own group, so it is stopped with all its children."""

    def __init__(self, proc: asyncio.subprocess.Process | LaunchedProcess) -> None:
        self.proc = proc
        self.ended = False

    @classmethod
    async def start(cls, argv: list[str], *, env: dict[str, str], stdout: Any, stderr: Any,
                    cwd: Path | None = None) -> _Group:
        try:
            proc = await asyncio.create_subprocess_exec(*argv, env=env, stdin=asyncio.subprocess.DEVNULL,
                                                        stdout=stdout, stderr=stderr, start_new_session=True,
                                                        cwd=cwd, preexec_fn=die_with_parent)
        except OSError as exc:
            raise _RunError(f"cannot start {argv[0]}: {exc.strerror or exc}") from None
        return cls(proc)

    async def wait(self, timeout: float) -> int | None:
        """The exit status, or None when the process is still running after `timeout` s."""
        try:
            return await asyncio.wait_for(self.proc.wait(), timeout)
        except TimeoutError:
            return None

    async def end(self) -> None:
        """SIGTERM the group; SIGKILL whatever of it is still there after the grace period."""
        if self.ended:
            return
        deadline = time.monotonic() + GRACE_S
        if _signal_group(self.proc.pid, signal.SIGTERM):
            await self.wait(GRACE_S)
            while _signal_group(self.proc.pid, 0) and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            _signal_group(self.proc.pid, signal.SIGKILL)
        await self.wait(GRACE_S)
        self.ended = True

    def kill(self) -> None:
        """At once, for a drill being interrupted."""
        if not self.ended:
            _signal_group(self.proc.pid, signal.SIGKILL)
            self.ended = True


class Run:
    """One run in its folder: scenario.yaml, log.jsonl, agent.stdout/.stderr, proxy.stderr, run.json."""

    def __init__(self, spec: RunSpec, folder: Path, config: DrillConfig, tracing: Tracing = NO_TRACING,
                 cwd: Path | None = None) -> None:
        self.spec = spec
        self.folder = folder.resolve()
        self.config = config
        self.cwd = cwd or config.workdir  # where the agent and judge run; None: here
        self.launcher: Launcher | None = None  # forks the run's proxy warm; None: a fresh process
        self.groups: list[_Group] = []
        self.tracing = tracing
        self.trace_env: dict[str, str] = {}  # TRACEPARENT and BAGGAGE for the agent and the proxy

    async def execute(self) -> RunResult:
        spec = self.spec
        result = RunResult(spec.name, spec.label, spec.kind, spec.seed)
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / "scenario.yaml").write_text(spec.scenario_text, encoding="utf-8")
        self._write_run_file(None)
        started = time.monotonic()
        baggage = {"chaosproxy.run": spec.name, "chaosproxy.engine.scenario": spec.label, "chaosproxy.seed": spec.seed}
        span = self.tracing.run_span(f"chaosproxy.drill {spec.name}", {**baggage, "chaosproxy.run.kind": spec.kind})
        self.trace_env, result.trace_id = span.environment(baggage), span.trace_id
        try:
            await self._carry_out(result)
        except _RunError as exc:
            result.status, result.error = "error", str(exc)
        finally:
            for group in self.groups:
                group.kill()
            span.end(result.status)
        result.duration_s = round(time.monotonic() - started, 3)
        self._count_faults(result)
        self._write_run_file(result)
        return result

    async def _carry_out(self, result: RunResult) -> None:
        env = {**_environment(), **self.trace_env, "CHAOSPROXY_RUN": str(self.folder),
               "CHAOSPROXY_SEED": str(self.spec.seed)}
        proxy: _Group | None = None
        config = self.config
        if config.over_http:
            starting = time.monotonic()
            proxy, url = await self._start_proxy(config.upstream or "http://127.0.0.1/")
            result.proxy_start_s = round(time.monotonic() - starting, 3)
            env["CHAOSPROXY_URL"] = url
        else:
            server = [sys.executable, "-m", "chaosproxy", "replay", str(config.replay_cassette.resolve()), "--stdio"] \
                if config.replay_cassette is not None else shlex.split(config.stdio or "")
            env["CHAOSPROXY_STDIO_COMMAND"] = shlex.join(self._chaosproxy("stdio") + ["--", *server])
        agent = await self._start("agent", shlex.split(self.config.agent), env)
        result.exit_code = await agent.wait(self.config.timeout)
        await agent.end()
        if proxy is not None and proxy.proc.returncode is not None:
            raise _RunError(f"the proxy exited with status {proxy.proc.returncode} during the run; "
                            f"see {self.folder / 'proxy.stderr'}")
        try:  # the judge may still ask the proxy (its CHAOSPROXY_URL, the control API): stop it after
            await self._judge(result, env)
        finally:
            if proxy is not None:
                await proxy.end()

    async def _judge(self, result: RunResult, env: dict[str, str]) -> None:
        if result.exit_code is None:
            result.status = "timeout"
            return
        if self.config.judge is None:
            result.status = "passed" if result.exit_code == 0 else "failed"
            return
        judge = await self._start("judge", shlex.split(self.config.judge),
                                  {**env, "CHAOSPROXY_AGENT_EXIT": str(result.exit_code)})
        result.judge_exit = await judge.wait(self.config.timeout)
        await judge.end()
        if result.judge_exit is None:
            raise _RunError(f"the judge ran over {self.config.timeout} s")
        result.status = "passed" if result.judge_exit == 0 else "failed"

    def _chaosproxy(self, command: str) -> list[str]:
        # The copied scenario.yaml names files relative to the folder it was copied from.
        origin = ["--scenario-dir", self.spec.scenario_dir] if self.spec.scenario_dir else []
        return [sys.executable, "-m", "chaosproxy", command, "--scenario", str(self.folder / "scenario.yaml"),
                *origin, "--seed", str(self.spec.seed), "--log", str(self.folder / "log.jsonl")]

    async def _start(self, role: str, argv: list[str], env: dict[str, str]) -> _Group:
        out, err = self.folder / f"{role}.stdout", self.folder / f"{role}.stderr"
        with open(out, "wb") as stdout, open(err, "wb") as stderr:
            group = await _Group.start(argv, env=env, stdout=stdout, stderr=stderr, cwd=self.cwd)
        self.groups.append(group)
        return group

    async def _start_proxy(self, upstream: str) -> tuple[_Group, str]:
        """Start `chaosproxy run` on a port of its choosing; the URL the agent uses keeps upstream's path."""
        target = URL(upstream)
        replayed = self.config.replay_cassette
        source = ["--replay-cassette", str(replayed.resolve())] if replayed is not None else \
            ["--upstream", str(target.origin())]
        argv = self._chaosproxy("run") + [*source, "--listen", "127.0.0.1:0"]
        stderr_path = self.folder / "proxy.stderr"
        env = {**_environment(), **PROXY_ENVIRONMENT, **self.trace_env}
        proxy = None
        if self.launcher is not None:
            try:
                proxy = _Group(await self.launcher.launch(argv[3:], env, stderr_path))
            except OSError as exc:  # the launcher is gone (killed): slower, not wrong
                print(f"chaosproxy drill: warning: {exc}; {self.spec.name} starts its proxy afresh", file=sys.stderr)
        if proxy is None:
            with open(stderr_path, "wb") as err:
                proxy = await _Group.start(argv, env=env, stdout=subprocess.DEVNULL, stderr=err)
        self.groups.append(proxy)
        deadline = time.monotonic() + PROXY_START_S
        while (found := _LISTENING.search(stderr_path.read_bytes())) is None:
            if proxy.proc.returncode is not None or time.monotonic() > deadline:
                tail = stderr_path.read_text(errors="replace").strip().splitlines()[-3:]
                raise _RunError("the proxy did not start: " + (" | ".join(tail) or "no output"))
            await asyncio.sleep(0.01)
        path = target.raw_path if target.raw_path != "/" else ""
        query = f"?{target.raw_query_string}" if target.raw_query_string else ""
        return proxy, f"http://127.0.0.1:{int(found.group(1))}{path}{query}"

    def _count_faults(self, result: RunResult) -> None:
        log = self.folder / "log.jsonl"
        if not log.exists():
            return
        faults: collections.Counter[str] = collections.Counter()
        components: collections.Counter[str] = collections.Counter()
        for event in read_events(log):
            if event.get(Key.EVENT) == Event.FAULT:
                faults[event.get(Key.FAULT, "?")] += 1
                components[event.get(Key.COMPONENT, "?")] += 1
        result.faults, result.components = dict(sorted(faults.items())), dict(sorted(components.items()))

    def _write_run_file(self, result: RunResult | None) -> None:
        """What a replay needs, and (once known) how the run went."""
        spec, config = self.spec, self.config
        data = {"run": spec.name, "label": spec.label, "kind": spec.kind, "seed": spec.seed,
                "scenario_dir": spec.scenario_dir,
                "agent": config.agent, "judge": config.judge, "timeout": config.timeout,
                "upstream": shown_upstream(config.upstream), "stdio": config.stdio,
                "replay_cassette": str(config.replay_cassette) if config.replay_cassette is not None else None,
                "result": result.record() if result is not None else None}
        (self.folder / RUN_FILE).write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


class Progress:
    """One line on stderr: redrawn in place on a terminal, one line per finished run otherwise."""

    def __init__(self, total: int, stream: TextIO = sys.stderr) -> None:
        self.total = total
        self.stream = stream
        self.counts: collections.Counter[str] = collections.Counter()
        self.started = time.monotonic()
        self.tty = stream.isatty()

    def line(self) -> str:
        done = sum(self.counts.values())
        statuses = ", ".join(f"{self.counts[s]} {s}" for s in ("passed", "failed", "timeout", "error"))
        return f"drill: {done}/{self.total} runs ({statuses}) in {time.monotonic() - self.started:.0f} s"

    def update(self, result: RunResult) -> None:
        self.counts[result.status] += 1
        if self.tty:
            self.stream.write("\r\x1b[K" + self.line())
        else:
            self.stream.write(f"{self.line()}  {result.run} {result.label}: {result.status}\n")
        self.stream.flush()

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()


def append_result(results_path: Path, result: RunResult) -> None:
    """One line of results.jsonl, written whole as the run finishes."""
    with open(results_path, "a", encoding="utf-8") as out:
        out.write(json.dumps(result.record()) + "\n")


async def execute_all(runs: list[Run], jobs: int, results_path: Path | None,
                      progress: Progress) -> list[RunResult]:
    """Carry out the runs, `jobs` at a time; each result goes to results.jsonl as it comes. In run order."""
    slots = asyncio.Semaphore(jobs)

    async def one(run: Run) -> RunResult:
        async with slots:
            result = await run.execute()
        if results_path is not None:
            append_result(results_path, result)
        progress.update(result)
        return result

    # SIGTERM cancels the drill like Ctrl-C does, so every run ends its process groups on the way out.
    loop, drill = asyncio.get_running_loop(), asyncio.current_task()
    assert drill is not None
    loop.add_signal_handler(signal.SIGTERM, drill.cancel)
    launcher = None
    try:
        if any(run.config.over_http for run in runs):
            try:
                launcher = await Launcher.start(preexec_fn=die_with_parent)
            except OSError as exc:  # slower, not wrong: each run's proxy is then a fresh process
                print(f"chaosproxy drill: warning: no proxy launcher ({exc}); starting each proxy afresh",
                      file=sys.stderr)
            for run in runs:
                run.launcher = launcher
        return await asyncio.gather(*(one(run) for run in runs))
    finally:
        loop.remove_signal_handler(signal.SIGTERM)
        if launcher is not None:
            await launcher.close()
        progress.close()
