"""Loading a page in a real headless Chromium (Debian's `chromium`) over the DevTools protocol.

The page's console errors, uncaught exceptions and failed loads are collected as they happen, and
JavaScript expressions are evaluated in it once it has loaded. Every step is bounded in time; the
browser runs in its own process group and is ended with it.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import os
import re
import shutil
import signal
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--remote-debugging-port=0"]
_DEVTOOLS = re.compile(rb"DevTools listening on (ws://127\.0\.0\.1:(\d+)/\S+)")


def require_chromium() -> str:
    """Chromium's path; a test without it is skipped on a developer's machine and fails in CI."""
    if CHROMIUM is None:
        message = "chromium is not installed (apt-get install -y chromium)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return CHROMIUM


@dataclass
class Page:
    problems: list[str]  # console errors, uncaught exceptions, failed loads, in order
    values: dict[str, Any]  # each expression's value


class _DevTools:
    """Commands by id, and the events that tell of a problem or of the page having loaded."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.ids = itertools.count(1)
        self.replies: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.problems: list[str] = []
        self.loaded = asyncio.Event()

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        message_id = next(self.ids)
        reply = self.replies[message_id] = asyncio.get_running_loop().create_future()
        await self.ws.send_json({"id": message_id, "method": method, "params": params})
        return await reply

    async def listen(self) -> None:
        async for message in self.ws:
            data = message.json()
            if "id" in data:
                self.replies.pop(data["id"]).set_result(data.get("result", data))
                continue
            params = data.get("params", {})
            match data.get("method"):
                case "Page.loadEventFired":
                    self.loaded.set()
                case "Runtime.exceptionThrown":
                    details = params["exceptionDetails"]
                    thrown = details.get("exception", {}).get("description") or details.get("text")
                    self.problems.append(f"exception: {thrown}")
                case "Runtime.consoleAPICalled" if params.get("type") in ("error", "assert"):
                    texts = [str(arg.get("value", arg.get("description"))) for arg in params.get("args", [])]
                    self.problems.append(f"console.{params['type']}: {' '.join(texts)}")
                case "Log.entryAdded" if params["entry"].get("level") == "error":
                    entry = params["entry"]
                    where = entry.get("url", "")
                    self.problems.append(f"{entry.get('source')} error: {entry.get('text')} {where}")


@contextlib.asynccontextmanager
async def _browser(chromium: str, timeout: float) -> AsyncIterator[int]:
    """A headless Chromium with a fresh profile; yields its DevTools port."""
    with tempfile.TemporaryDirectory() as profile:
        log = Path(profile) / "stderr.log"
        with open(log, "wb") as stderr:
            proc = await asyncio.create_subprocess_exec(
                chromium, *FLAGS, f"--user-data-dir={profile}/data", "about:blank",
                stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL, stderr=stderr,
                start_new_session=True)
        try:
            async with asyncio.timeout(timeout):
                while (found := _DEVTOOLS.search(log.read_bytes())) is None:
                    assert proc.returncode is None, log.read_text(errors="replace")
                    await asyncio.sleep(0.05)
            yield int(found.group(2))
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), 10)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                await asyncio.wait_for(proc.wait(), 10)


class Tab:
    """A page open in the browser: evaluate JavaScript in it, wait for a condition, take a screenshot."""

    def __init__(self, devtools: _DevTools) -> None:
        self._devtools = devtools

    @property
    def problems(self) -> list[str]:
        """Console errors, uncaught exceptions and failed loads so far, in order."""
        return self._devtools.problems

    async def evaluate(self, expression: str) -> Any:
        """The expression's value (a promise is awaited); an exception thrown in the page fails the test."""
        found = await self._devtools.call("Runtime.evaluate", expression=expression, returnByValue=True,
                                          awaitPromise=True)
        assert "exceptionDetails" not in found, found["exceptionDetails"]
        return found["result"].get("value")

    async def wait_for(self, expression: str, timeout: float = 20) -> Any:
        """Evaluate until the value is truthy (bounded); fails with the last value."""
        deadline = asyncio.get_running_loop().time() + timeout
        while not (value := await self.evaluate(expression)):
            assert asyncio.get_running_loop().time() < deadline, f"{expression} is still {value!r}"
            await asyncio.sleep(0.1)
        return value

    async def screenshot(self, path: Path, width: int = 1400, height: int = 900, clip: str | None = None) -> None:
        """The page at that size as a PNG; `clip`, an expression giving {x, y, width, height} in page pixels
        (evaluated once the page is laid out at that size): that part only."""
        await self._devtools.call("Emulation.setDeviceMetricsOverride", width=width, height=height,
                                  deviceScaleFactor=1, mobile=False)
        area = {"clip": {**await self.evaluate(clip), "scale": 1}, "captureBeyondViewport": True} if clip else {}
        shot = await self._devtools.call("Page.captureScreenshot", format="png", **area)
        path.write_bytes(base64.b64decode(shot["data"]))


@contextlib.asynccontextmanager
async def open_tab(url: str, *, timeout: float = 120) -> AsyncIterator[Tab]:
    """Open `url` in a fresh headless Chromium and wait for its load event; the whole visit is bounded."""
    chromium = require_chromium()
    async with _browser(chromium, timeout) as port, aiohttp.ClientSession() as http, asyncio.timeout(timeout):
        async with http.get(f"http://127.0.0.1:{port}/json/list") as response:
            targets = await response.json()
        page = next(target for target in targets if target["type"] == "page")
        async with http.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=0) as ws:
            devtools = _DevTools(ws)
            listener = asyncio.create_task(devtools.listen())
            try:
                for domain in ("Runtime", "Log", "Page"):
                    await devtools.call(f"{domain}.enable")
                await devtools.call("Page.navigate", url=url)
                await devtools.loaded.wait()
                yield Tab(devtools)
            finally:
                listener.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await listener


async def load(url: str, expressions: dict[str, str], *, timeout: float = 60, settle: float = 0.5) -> Page:
    """Open `url`, wait for its load event and `settle` seconds more, then evaluate `expressions`."""
    async with open_tab(url, timeout=timeout) as tab:
        await asyncio.sleep(settle)
        values = {name: await tab.evaluate(expression) for name, expression in expressions.items()}
        return Page(tab.problems, values)
