"""A proxy and its control API on free loopback ports, served from a background thread.

For tests and scripts that want chaos in-process, with no `chaosproxy run` to manage: the pytest
plugin's fixture is one of these. The proxy and the control API share the thread's event loop, as
the control API requires; the caller's code talks to both over real HTTP, as an agent would.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import yaml

from chaosproxy.adapters.http import HttpProxy
from chaosproxy.client import ControlClient
from chaosproxy.control.api import start_control
from chaosproxy.control.runtime import open_engine
from chaosproxy.engine.core import Engine
from chaosproxy.engine.scenario import Scenario, parse_scenario
from chaosproxy.telemetry.log_schema import Key

HOST = "127.0.0.1"


class ProxyView:
    """What a test holds of a proxy: where the agent connects (`url`, with `headers` on each request),
    the control API (`control`), and what the proxy recorded (`calls`, `faults`, `journal`)."""

    url: str
    control: ControlClient
    headers: dict[str, str]

    def fault(self, rule: Mapping[str, Any]) -> contextlib.AbstractContextManager[str]:
        """Add a rule for the duration of a `with` block (see ControlClient.fault)."""
        return self.control.fault(rule)

    def calls(self, **filters: str | int) -> list[dict[str, Any]]:
        """The call lines recorded, oldest first: `calls(tool="search")` (ControlClient.calls)."""
        return self.control.calls(**filters)

    def faults(self, **filters: str | int) -> list[dict[str, Any]]:
        """The fault lines recorded, oldest first: `faults(rule="down")` (ControlClient.faults)."""
        return self.control.faults(**filters)

    def journal(self, **filters: str | int) -> dict[str, Any]:
        return self.control.journal(**filters)

    def http_client(self, **options: Any) -> Any:
        """An httpx.Client for the agent's side: base URL and headers set (httpx must be installed)."""
        import httpx

        return httpx.Client(base_url=self.url, headers=self.headers, **options)

    def async_http_client(self, **options: Any) -> Any:
        """An httpx.AsyncClient, as http_client."""
        import httpx

        return httpx.AsyncClient(base_url=self.url, headers=self.headers, **options)


@dataclass
class ScopedProxy(ProxyView):
    """One scope of a proxy many tests share (control/scopes.py): its requests carry the scope header, its
    scenario and counters are its own. `close()` deletes the scope."""

    url: str
    control: ControlClient
    headers: dict[str, str] = field(default_factory=dict)

    @classmethod
    def open(cls, url: str, control: ControlClient, name: str,
             scenario: str | Mapping[str, Any] | None = None) -> ScopedProxy:
        scoped = control.scoped(name, scenario)
        return cls(url, scoped, scoped.headers)

    def close(self) -> None:
        self.control.delete_scope()


class EmbeddedProxy(ProxyView):
    """`with EmbeddedProxy(upstream) as proxy:` gives `proxy.url`, `proxy.control` and `proxy.fault(rule)`.

    The scenario may be YAML text, a mapping or a Scenario (invalid ones raise ScenarioError); the
    perturbation log goes to `log_path` (default: stderr).
    """

    def __init__(self, upstream: str, scenario: str | Mapping[str, Any] | Scenario | None = None, *,
                 seed: int | None = None, log_path: str | Path | None = None) -> None:
        self.upstream = upstream
        self.scenario = _as_scenario(scenario)
        self.seed = seed
        self.log_path = Path(log_path) if log_path is not None else None
        self.url = ""
        self.control_url = ""
        self.headers = {}
        self._stack = contextlib.ExitStack()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._engine: Engine | None = None
        self.control: ControlClient

    @property
    def engine(self) -> Engine:
        """The engine, for inspection. Change it through `control`: it lives on the proxy's thread."""
        assert self._engine is not None, "not started"
        return self._engine

    def start(self) -> Self:
        engine = self._stack.enter_context(open_engine(None, seed=self.seed, log_path=self.log_path,
                                                       scenario=self.scenario))
        self._engine = engine
        loop = self._loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, name="chaosproxy", daemon=True)
        thread.start()
        self._stack.callback(self._close_loop, loop, thread)
        try:
            proxy = HttpProxy(engine, self.upstream)
            self._stack.callback(lambda: self._run(proxy.stop()))
            port = self._run(proxy.start(HOST, 0))
            control, control_port = self._run(start_control(engine, HOST, 0))
            control.attach(proxy)
            self._stack.callback(lambda: self._run(control.stop()))
        except BaseException:
            self.stop()
            raise
        self.url = f"http://{HOST}:{port}"
        self.control_url = f"http://{HOST}:{control_port}"
        self.control = ControlClient(self.control_url, token="")
        return self

    def stop(self) -> None:
        """Stop listening, stop the thread and close the log; safe to call twice."""
        self._stack.close()

    def log_lines(self, event: str | None = None) -> list[dict[str, Any]]:
        """The perturbation log so far (`event`: only fault, call, run or error lines); needs `log_path`."""
        if self.log_path is None:
            raise ValueError("the log goes to stderr: give log_path to read it back")
        self.engine.log.flush()  # call lines are flushed in batches
        lines = (json.loads(line) for line in self.log_path.read_text().splitlines() if line)
        return [line for line in lines if event is None or line[Key.EVENT] == event]

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()

    def _run[T](self, coro: Coroutine[Any, Any, T], timeout: float = 30) -> T:
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    @staticmethod
    def _close_loop(loop: asyncio.AbstractEventLoop, thread: threading.Thread) -> None:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        if not thread.is_alive():
            loop.close()


def _as_scenario(scenario: str | Mapping[str, Any] | Scenario | None) -> Scenario:
    if scenario is None:
        return Scenario()
    if isinstance(scenario, Scenario):
        return scenario
    text = scenario if isinstance(scenario, str) else yaml.safe_dump(dict(scenario), sort_keys=False)
    return parse_scenario(text)

