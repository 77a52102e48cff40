"""Reloading a running proxy's scenario file: on SIGHUP, and with `--watch` when the file changes.

The rule is the control API's: an invalid file, or one that changes the routes, is reported and the
scenario in force stays. The file is read and parsed in a worker thread, so traffic flows meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import AsyncIterator, Iterable
from pathlib import Path

from chaosproxy.engine.core import Engine
from chaosproxy.engine.named_files import read_capped
from chaosproxy.engine.scenario import ScenarioError, keep_routes, load_scenario, off_loop
from chaosproxy.telemetry.log import ops


async def reload_scenario(engine: Engine, path: Path, scenario_dirs: Iterable[Path] = ()) -> bool:
    """Put the file's scenario in force; False (and the old one stays) when it is invalid."""
    dirs = tuple(scenario_dirs)
    try:
        scenario = await off_loop(lambda: load_scenario(path, dirs), str(path))
        scenario = keep_routes(scenario, engine.start_routes, str(path))
    except ScenarioError as exc:
        ops.error("scenario not reloaded; the one in force stays:\n%s", exc)
        return False
    engine.load(scenario)
    engine.log.control(change="reload", scenario=str(path), rules=[rule.name for rule in scenario.rules])
    ops.info("scenario reloaded from %s (%d rules)", path, len(scenario.rules))
    return True


@contextlib.asynccontextmanager
async def reloading(engine: Engine, path: Path | None, *, watch: bool = False, interval: float = 1.0,
                    scenario_dirs: Iterable[Path] = ()) -> AsyncIterator[None]:
    """For the duration of the block: reload `path` on SIGHUP and, with `watch`, when it changes."""
    if path is None:
        yield
        return
    dirs = tuple(scenario_dirs)
    loop = asyncio.get_running_loop()
    reloads: set[asyncio.Task[bool]] = set()

    def on_sighup() -> None:
        task = asyncio.create_task(reload_scenario(engine, path, dirs))
        reloads.add(task)
        task.add_done_callback(reloads.discard)

    loop.add_signal_handler(signal.SIGHUP, on_sighup)
    watcher = asyncio.create_task(_watch(engine, path, dirs, await _content(path), interval)) if watch else None
    try:
        yield
    finally:
        loop.remove_signal_handler(signal.SIGHUP)
        for task in [*reloads, *([watcher] if watcher else [])]:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def _watch(engine: Engine, path: Path, dirs: tuple[Path, ...], last: str | None, interval: float) -> None:
    """Poll the file's content (scenario files are small): a save within one mtime tick is seen too."""
    while True:
        await asyncio.sleep(interval)
        now = await _content(path)
        if now != last and now is not None:  # a file missing for a moment (mid-save) is not a change
            await reload_scenario(engine, path, dirs)
        last = now


async def _content(path: Path) -> str | None:
    """The file's text; None while it is missing; the reason when it cannot be read (a reload then says it)."""
    try:
        return await asyncio.to_thread(read_capped, path)
    except ValueError as exc:
        return None if str(exc) == "does not exist" else f"cannot read: {exc}"
