"""Drill runs as Ray tasks (`chaosproxy drill ... --executor ray`, `pip install 'chaosproxy[ray]'`).

Each run is one task, reserving `--ray-num-cpus` on the node it lands on. The task starts the run's
own proxy on a free loopback port of that node, runs the agent (and judge) exactly as the local
executor does, and either writes the run's folder straight into the drill's folder, when the node
sees the drill's folder (a shared path: the driver's node, or a shared file system), or returns the
folder's files to the driver, which writes them. Results come back as runs finish, with the same
progress line and the same results.jsonl as `--executor local`: the plan, and so every seed, is the
driver's.

A Ray worker process carries out many runs, one after another: it keeps one event loop and one warm
proxy launcher (chaosproxy/drill/launcher.py) for all of them, so a run's proxy is forked in
milliseconds, as in a local drill, instead of paying a fresh Python's imports on every run.

A lost node or worker is the cluster's failure, not the agent's: Ray carries the run out again
(a fresh folder, up to RETRIES times); a run still lost after that is a result with status `error`.
The agent's own failures are results like any other. Ray's dashboard and job API have no
authentication: keep a cluster on a private network, and a local one on loopback (as here).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import shutil
import signal
import tempfile
from pathlib import Path
from typing import Any

from chaosproxy.drill.config import DrillConfig
from chaosproxy.drill.launcher import Launcher, die_with_parent
from chaosproxy.drill.plan import RunSpec
from chaosproxy.drill.runner import Progress, Run, RunResult, append_result
from chaosproxy.records.drill_folder import DRILL_FILE
from chaosproxy.telemetry.tracing import exporting, propagated

RETRIES = 3  # times a run lost with its node or worker is carried out again


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


class _Worker:
    """What a Ray worker process keeps from one run to the next: its event loop and its proxy launcher."""

    loop: asyncio.AbstractEventLoop | None = None
    launcher: Launcher | None = None

    @classmethod
    def run(cls, run: Run) -> RunResult:
        if cls.loop is None:
            cls.loop = asyncio.new_event_loop()
        if run.config.over_http:
            run.launcher = cls.loop.run_until_complete(cls._launcher())
        return cls.loop.run_until_complete(run.execute())

    @classmethod
    async def _launcher(cls) -> Launcher | None:
        """The worker's launcher, started again if it has gone; None (fresh proxies) if it cannot start."""
        if cls.launcher is None or cls.launcher.proc.returncode is not None:
            try:
                cls.launcher = await Launcher.start(preexec_fn=die_with_parent)
            except OSError:
                cls.launcher = None
        return cls.launcher


def carry_out(
    spec: RunSpec, config: DrillConfig, folder: str, drill_digest: str, cwd: str, seed: int
) -> tuple[RunResult, dict[str, bytes] | None]:
    """One run on whichever node Ray chose: into the drill's folder if this node sees it (the same
    drill.json), else into a scratch folder whose files go back to the driver. Its root span is
    exported from here when the driver's OTEL_* variables (given to the task) ask for it."""
    target = Path(folder)
    drill_file = target.parent / DRILL_FILE
    shared = drill_file.is_file() and _digest(drill_file) == drill_digest
    with tempfile.TemporaryDirectory(prefix="chaosproxy-run-") as scratch:
        if not shared:
            target = Path(scratch) / spec.name
        if target.exists():
            shutil.rmtree(target)  # what an earlier try left before its worker was lost
        workdir = Path(cwd) if Path(cwd).is_dir() else None
        with exporting(run_id=Path(folder).parent.name, seed=seed) as tracing:
            result = _Worker.run(Run(spec, target, config, tracing, cwd=workdir))
        files = (
            None
            if shared
            else {
                str(path.relative_to(target)): path.read_bytes()
                for path in sorted(target.rglob("*"))
                if path.is_file()
            }
        )
    return result, files


def _lost(run: Run, exc: Exception) -> RunResult:
    reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return RunResult(
        run.spec.name,
        run.spec.label,
        run.spec.kind,
        run.spec.seed,
        status="error",
        error=f"the cluster lost this run {RETRIES + 1} times: {type(exc).__name__}: {reason}",
    )


def _write_files(folder: Path, files: dict[str, bytes]) -> None:
    if folder.exists():
        shutil.rmtree(folder)
    for name, data in files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def _connect(config: DrillConfig) -> Any:
    try:
        import ray
    except ImportError:
        raise ValueError("--executor ray needs Ray: pip install 'chaosproxy[ray]'") from None
    if config.ray_address is None and not os.environ.get("RAY_ADDRESS"):
        # A cluster of our own on this machine: on loopback, as a proxy is (Ray would pick a routable IP).
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    ray.init(
        address=config.ray_address,
        include_dashboard=False,
        log_to_driver=False,
        logging_level=logging.WARNING,
        configure_logging=True,
    )
    return ray


def execute_on_ray(
    runs: list[Run], config: DrillConfig, results_path: Path, progress: Progress, seed: int
) -> list[RunResult]:
    """Carry out the runs as Ray tasks; each result goes to results.jsonl as it comes. In run order.

    Raises ValueError when Ray is not installed or the cluster cannot be reached.
    """
    ray = _connect(config)
    exported = propagated()  # the tasks' runs export their spans as local runs would
    task = ray.remote(carry_out).options(
        num_cpus=config.ray_num_cpus, max_retries=RETRIES, retry_exceptions=False,
        **({"runtime_env": {"env_vars": exported}} if exported else {}),
    )
    digest, cwd = _digest(results_path.parent / DRILL_FILE), str(config.workdir or os.getcwd())
    refs = {task.remote(run.spec, run.config, str(run.folder), digest, cwd, seed): run for run in runs}
    results: dict[str, RunResult] = {}
    pending = list(refs)
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM stops it like Ctrl-C
    try:
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for ref in done:
                run = refs[ref]
                try:
                    result, files = ray.get(ref)
                except ray.exceptions.RayError as exc:  # the cluster's failure, retries used up
                    result, files = _lost(run, exc), None
                if files is not None:
                    _write_files(run.folder, files)
                append_result(results_path, result)
                progress.update(result)
                results[run.spec.name] = result
    except KeyboardInterrupt:
        for ref in pending:
            ray.cancel(ref, force=True)  # the tasks' workers die, and their agents and proxies with them
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)
        progress.close()
        ray.shutdown()
    return [results[run.spec.name] for run in runs]
