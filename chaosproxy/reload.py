"""Reloading a running proxy's scenario file: on SIGHUP, and with `--watch` when the file changes.

The rule is the control API's: an invalid file is reported and the scenario in force stays.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import AsyncIterator
from pathlib import Path

from chaosproxy.engine import Engine
from chaosproxy.log import ops
from chaosproxy.scenario import ScenarioError, load_scenario


def reload_scenario(engine: Engine, path: Path) -> bool:
    """Put the file's scenario in force; False (and the old one stays) when it is invalid."""
    try:
        scenario = load_scenario(path)
    except ScenarioError as exc:
        ops.error("scenario not reloaded; the one in force stays:\n%s", exc)
        return False
    engine.load(scenario)
    engine.log.control(change="reload", scenario=str(path), rules=[rule.name for rule in scenario.rules])
    ops.info("scenario reloaded from %s (%d rules)", path, len(scenario.rules))
    return True


@contextlib.asynccontextmanager
async def reloading(engine: Engine, path: Path | None, *, watch: bool = False,
                    interval: float = 1.0) -> AsyncIterator[None]:
    """For the duration of the block: reload `path` on SIGHUP and, with `watch`, when it changes."""
    if path is None:
        yield
        return
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGHUP, reload_scenario, engine, path)
    watcher = asyncio.create_task(_watch(engine, path, _content(path), interval)) if watch else None
    try:
        yield
    finally:
        loop.remove_signal_handler(signal.SIGHUP)
        if watcher is not None:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher


async def _watch(engine: Engine, path: Path, last: bytes | None, interval: float) -> None:
    """Poll the file's content (scenario files are small): a save within one mtime tick is seen too."""
    while True:
        await asyncio.sleep(interval)
        now = _content(path)
        if now != last and now is not None:  # a file missing for a moment (mid-save) is not a change
            reload_scenario(engine, path)
        last = now


def _content(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:
        return None
