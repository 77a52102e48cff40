"""A cassette served as an upstream from a background thread, for tests and scripts (the pytest plugin's
`chaosproxy_replay` fixture): `with EmbeddedReplay(path) as replay:` gives `replay.url`."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Self

from chaosproxy.cassette.reading import read_cassette
from chaosproxy.cassette.replay import ReplayServer

HOST = "127.0.0.1"


class EmbeddedReplay:
    """An HTTP cassette (a folder, or a VCR.py file) replayed on a free loopback port. `speed` None (the
    default here) answers at once; a number plays the recorded timing that many times as fast."""

    def __init__(self, source: str | Path, *, speed: float | None = None) -> None:
        cassette = read_cassette(Path(source))
        if cassette.kind != "http":
            raise ValueError(f"{cassette.source}: a {cassette.kind} cassette: replay it with "
                             "`chaosproxy replay DIR --stdio` as the server command")
        self.server = ReplayServer(cassette, speed=speed)
        self.url = ""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    @property
    def unmatched(self) -> list[str]:
        """Why each request the cassette does not hold went unanswered (the newest 100)."""
        return list(self.server.replay.unmatched)

    def start(self) -> Self:
        loop = self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=loop.run_forever, name="chaosproxy-replay", daemon=True)
        self._thread.start()
        port = asyncio.run_coroutine_threadsafe(self.server.start(HOST, 0), loop).result(10)
        self.url = f"http://{HOST}:{port}"
        return self

    def stop(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        self._loop = self._thread = None
        asyncio.run_coroutine_threadsafe(self.server.stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        if not thread.is_alive():
            loop.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()
