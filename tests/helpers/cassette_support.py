"""Support for the cassette tests: a recording proxy and a replay server on loopback, in the test server loop."""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from chaosproxy.adapters.http import HttpProxy
from chaosproxy.cassette.format import CassetteWriter, new_header
from chaosproxy.cassette.reading import read_cassette
from chaosproxy.cassette.recorder import HttpRecorder
from chaosproxy.cassette.redact import Redactor
from chaosproxy.cassette.replay import ReplayServer
from chaosproxy.engine.core import Engine
from chaosproxy.engine.scenario import parse_scenario
from chaosproxy.telemetry.log import PerturbationLog
from tests.helpers.support import ServerLoop, log_events


class Proxy:
    """A proxy started by `proxy_to`: its URL and its perturbation log."""

    def __init__(self, url: str, log_path: Path) -> None:
        self.url = url
        self.log_path = log_path

    def faults(self) -> list[tuple[Any, ...]]:
        """The faults that fired, in order: (rule, fault type, method, tool)."""
        return [(line["rule"], line["fault"], line.get("method"), line.get("tool"))
                for line in log_events(self.log_path, "fault")]


@contextlib.contextmanager
def proxy_to(server_loop: ServerLoop, upstream: str, log_path: Path, *, record: Path | None = None,
             scenario: str | dict[str, Any] = "rules: []", seed: int = 7,
             redact: tuple[str, ...] = ()) -> Iterator[Proxy]:
    """A proxy in front of `upstream`, recording into `record` when given (the cassette is closed on exit)."""
    text = scenario if isinstance(scenario, str) else yaml.safe_dump(scenario)
    log = PerturbationLog(io.FileIO(log_path, "w"), run_id="test", seed=seed, batch_s=0.0)
    engine = Engine(parse_scenario(text), seed=seed, log=log)
    recorder = None
    if record is not None:
        redactor = Redactor(redact)
        recorder = HttpRecorder(CassetteWriter(record, new_header("http", redactor.policy(), upstreams=[upstream])),
                                redactor)
    proxy = HttpProxy(engine, upstream, recorder=recorder)
    port = server_loop.run(proxy.start("127.0.0.1", 0))
    try:
        yield Proxy(f"http://127.0.0.1:{port}", log_path)
    finally:
        server_loop.run(proxy.stop())
        if recorder is not None:
            server_loop.run(_close(recorder))
        log.close()


async def _close(recorder: HttpRecorder) -> None:
    recorder.close()  # on the loop whose callbacks feed it


@contextlib.contextmanager
def replaying(server_loop: ServerLoop, source: Path, *, speed: float | None = None) -> Iterator[ReplayServer]:
    """The cassette at `source` served on a free loopback port; `server.url` is set."""
    server = ReplayServer(read_cassette(source), speed=speed)
    port = server_loop.run(server.start())
    server.url = f"http://127.0.0.1:{port}"  # type: ignore[attr-defined]
    try:
        yield server
    finally:
        server_loop.run(server.stop())
