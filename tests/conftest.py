"""Shared fixtures: a real tool server and real proxies on 127.0.0.1, run in a background event loop.

The servers live in their own thread and loop, so tests drive them with real clients from the test's
loop (aiohttp) or from plain sync code (http.client, hypothesis) exactly as an agent would.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from chaosproxy.adapters.http import HttpProxy
from chaosproxy.demo import tool_server
from chaosproxy.engine.core import Engine
from chaosproxy.engine.scenario import parse_scenario
from chaosproxy.telemetry.log import PerturbationLog
from tests.helpers.framing_support import Script, ScriptedUpstream
from tests.helpers.mcp_support import STRICT_SERVER, serve
from tests.helpers.support import MakeProxy, RunningProxy, ServerLoop


@pytest.fixture(scope="session")
def server_loop() -> Iterator[ServerLoop]:
    loop = ServerLoop()
    yield loop
    loop.close()


@pytest.fixture(scope="session")
def upstream(server_loop: ServerLoop) -> Iterator[str]:
    runner, port = server_loop.run(tool_server.start())
    yield f"http://127.0.0.1:{port}"
    server_loop.run(runner.cleanup())


@pytest.fixture
def make_proxy(server_loop: ServerLoop, upstream: str, tmp_path: Path) -> Iterator[MakeProxy]:
    """Start proxies in front of the test tool server (see MakeProxy); all are stopped after the test."""
    started: list[tuple[HttpProxy, PerturbationLog]] = []

    def start(scenario: str | dict[str, Any] = "rules: []", *, seed: int = 7, to: str | None = None,
              log_batch_s: float = 0.0, **options: Any) -> RunningProxy:
        text = scenario if isinstance(scenario, str) else yaml.safe_dump(scenario)
        log_path = tmp_path / f"log-{len(started)}.jsonl"
        log = PerturbationLog(io.FileIO(log_path, "w"), run_id="test", seed=seed, batch_s=log_batch_s)
        engine = Engine(parse_scenario(text), seed=seed, log=log)
        proxy = HttpProxy(engine, engine.scenario.routes or to or upstream, **options)
        port = server_loop.run(proxy.start("127.0.0.1", 0))
        started.append((proxy, log))
        return RunningProxy(f"http://127.0.0.1:{port}", engine, log_path, log)

    yield start
    for proxy, log in started:
        server_loop.run(proxy.stop())
        log.close()


# The bundled MCP tool server as real processes, one of each kind for the whole session: over
# streamable HTTP (answering POSTs with SSE, or with JSON) and over legacy HTTP+SSE.
@pytest.fixture(scope="session")
def mcp_http() -> Iterator[str]:
    with serve("http") as url:
        yield url


@pytest.fixture(scope="session")
def mcp_json() -> Iterator[str]:
    with serve("http", "--json-response") as url:
        yield url


@pytest.fixture(scope="session")
def mcp_sse() -> Iterator[str]:
    with serve("sse") as url:
        yield url


@pytest.fixture(scope="session")
def mcp_strict() -> Iterator[str]:
    """tests/helpers/strict_server.py: tools with strict output schemas (enums, formats, no extra keys)."""
    with serve("http", command=STRICT_SERVER) as url:
        yield url


@pytest.fixture(scope="session")
def mcp_paged() -> Iterator[str]:
    """tests/helpers/strict_server.py listing its tools two per page."""
    with serve("http", "--page-size", "2", command=STRICT_SERVER) as url:
        yield url


@pytest.fixture
def scripted(server_loop: ServerLoop) -> Iterator[Callable[[Script], ScriptedUpstream]]:
    """Start upstreams that play a script on each connection (hostile or odd HTTP); all stopped after."""
    started: list[ScriptedUpstream] = []

    def start(script: Script) -> ScriptedUpstream:
        upstream = ScriptedUpstream(server_loop, script)
        started.append(upstream)
        return upstream

    yield start
    for upstream in started:
        upstream.close()


# Markers by module, so that a quick inner loop exists: `pytest -m "not slow and not browser and not peers
# and not ray"`. `browser`: headless Chromium; `peers`: the independent npm peers (tests/peers/install.sh);
# `ray`: a Ray cluster; `slow`: drills, sessions of the docs, generated examples by the hundred.
MODULE_MARKS = {
    "browser": {"test_compare", "test_console", "test_console_seed", "test_report"},
    "peers": {"test_peers_direct", "test_peers_proxy", "test_cassette_peers", "test_toxiproxy_api"},
    "ray": {"test_ray"},
    "slow": {"test_a2a_drill", "test_ci_examples", "test_compiled", "test_docs", "test_drill", "test_fuzz_http",
             "test_inspect_harness", "test_library_drill", "test_readme", "test_scenario_library", "test_shards",
             "test_stdio_lanes", "test_stdio_process_group", "test_stdio_reliability", "test_oracle",
             "test_transparency", "test_engine_semantics", "test_mcp_modern_faults", "test_a2a", "test_otel",
             "test_llm_transparency", "test_llm_fault_oracle", "test_fidelity", "test_report_integrity",
             "test_mcp_stdio", "test_cassette_interop", "test_scopes", "test_proxies_on_demand", "test_sessions"},
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        module = item.path.stem
        for mark, modules in MODULE_MARKS.items():
            if module in modules:
                item.add_marker(getattr(pytest.mark, mark))
