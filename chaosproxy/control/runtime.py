"""Wiring a run together: scenario, seed, log and engine, and a clean stop on SIGINT/SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import signal
import sys
import uuid
from collections.abc import Coroutine, Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

from chaosproxy import __version__
from chaosproxy.engine.core import Engine, draw_seed
from chaosproxy.engine.scenario import Scenario, check_seed, load_scenario
from chaosproxy.engine.sessions import MAX_SESSIONS, SESSION_TTL_S
from chaosproxy.telemetry.log import CALL_FLUSH_S, PerturbationLog, name_run, open_log_file
from chaosproxy.telemetry.tracing import NO_TRACING
from chaosproxy.telemetry.tracing import from_environment as otel_tracing


@contextlib.contextmanager
def open_engine(scenario_path: str | Path | None, *, seed: int | None = None,
                log_path: str | Path | None = None, scenario: Scenario | None = None,
                otel: bool = False, scenario_dirs: Iterable[Path] = (), session_ttl: float = SESSION_TTL_S,
                max_sessions: int = MAX_SESSIONS, each_session: bool = False) -> Iterator[Engine]:
    """An engine for a run; the seed is the flag's, else the scenario's, else a fresh draw (logged).

    Spans are exported when `otel` (--otel) or the OTEL_* variables ask for it (chaosproxy.telemetry.tracing).
    Raises ScenarioError before anything is opened when the scenario is invalid, ValueError when the seed is.
    """
    if scenario is None:
        scenario = load_scenario(scenario_path, scenario_dirs) if scenario_path is not None else Scenario()
    seed = check_seed(seed) if seed is not None else scenario.seed if scenario.seed is not None else draw_seed()
    path = Path(log_path) if log_path is not None else None
    stream: BinaryIO = open_log_file(path) if path is not None else sys.stderr.buffer
    log = PerturbationLog(stream, run_id=uuid.uuid4().hex[:12], seed=seed, path=path, batch_s=CALL_FLUSH_S,
                          each_session=each_session)
    name_run(log.run_id)
    tracing = NO_TRACING
    try:
        tracing = otel_tracing(otel, run_id=log.run_id, seed=seed)
        log.run(version=__version__, scenario=str(scenario_path) if scenario_path else None,
                rules=[rule.name for rule in scenario.rules])
        engine = Engine(scenario, seed=seed, log=log, session_ttl=session_ttl, max_sessions=max_sessions)
        engine.tracing = tracing
        yield engine
    finally:
        tracing.shutdown()
        log.close()


async def wait_for_stop_signal() -> None:
    """Return on SIGINT or SIGTERM, so the caller can stop listeners and flush the log."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


def raise_open_files_limit() -> int:
    """Raise this process's soft limit on open files to its hard limit, as Go's runtime does at start
    (a relayed stream holds two: the common soft limit of 1,024 caps a proxy near 500 streams). Returns
    the limit in force (0 where the platform has none to tell)."""
    try:
        import resource
    except ImportError:  # not on this platform
        return 0
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):  # e.g. an unlimited hard limit the kernel will not grant as soft
            pass
    return soft if soft != resource.RLIM_INFINITY else 0


def settle_heap() -> None:
    """Once started, move the long-lived objects (pydantic models, the fault registry) out of the GC's
    sight and collect less often: at 64 requests in flight the default thresholds cost ~30 µs a request."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(10_000, 20, 50)


def run_async[T](main: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine on uvloop when it is installed (a third less CPU per request), else asyncio."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)
