"""pytest plugin: a chaosproxy in front of your tool server, started in-process for one test.

    @pytest.mark.chaosproxy(upstream="http://127.0.0.1:9000")
    def test_agent_survives_a_503(chaosproxy):
        with chaosproxy.fault({"match": {"path": "/api/*"}, "fault": {"type": "http_error", "status": 503}}):
            assert run_agent(base_url=chaosproxy.url).succeeded

`chaosproxy` is an EmbeddedProxy: `.url` for the agent, `.control` (a ControlClient), `.fault(rule)`,
`.calls(tool=...)` and `.faults(rule=...)` (the journal), `.log_lines()`, `.http_client()`. The marker
takes `upstream` (or it comes from a `chaosproxy_upstream` fixture you define, which may start the
server), `scenario` (YAML text or a mapping) and `seed`. `chaosproxy_factory(upstream, scenario=None,
seed=None)` starts more.

Tests that share one proxy each get a scope of their own on it, named after the test (a ScopedProxy:
the same methods, and `.headers` to send with each request; `.http_client()` sends them): with
`@pytest.mark.chaosproxy(shared=True)`, one proxy per upstream serves the whole session; with
`--chaosproxy-proxy URL --chaosproxy-control URL` (a running `chaosproxy run --control ...`, e.g. a
staging sidecar), that one serves every test, pytest-xdist workers included. A scope's faults and gate
counters are its own. Proxies for stdio servers are not offered yet. Loaded through the `pytest11` entry
point; `-p no:chaosproxy` turns it off.

    @pytest.mark.chaosproxy_cassette("cassettes/search")    # a folder from --record, or a VCR.py file
    def test_agent_offline(chaosproxy_replay, chaosproxy_factory):
        proxy = chaosproxy_factory(chaosproxy_replay.url, {"rules": [...]})   # faults on replayed traffic
        assert run_agent(base_url=proxy.url).succeeded
        assert chaosproxy_replay.unmatched == []

`chaosproxy_replay` serves the marker's cassette (a path relative to the test's file, or absolute) as the
upstream: `.url`, `.unmatched`; it answers at once unless the marker gives `speed=N` (the recorded timing
N times as fast).
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:  # imported when first used: the plugin loads in every pytest run
    from chaosproxy.cassette.embedded import EmbeddedReplay
    from chaosproxy.embedded import EmbeddedProxy, ProxyView


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("chaosproxy")
    group.addoption("--chaosproxy-proxy", metavar="URL", help="a running chaosproxy every test shares, each in a "
                                                             "scope of its own (with --chaosproxy-control)")
    group.addoption("--chaosproxy-control", metavar="URL", help="that chaosproxy's control API")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "chaosproxy(upstream=None, scenario=None, seed=None, shared=False): how the chaosproxy "
                   "fixture starts (shared: a scope of a proxy the session shares)")
    config.addinivalue_line(
        "markers", "chaosproxy_cassette(path, speed=None): the cassette the chaosproxy_replay fixture serves")


@pytest.fixture
def chaosproxy_factory(tmp_path: Path) -> Iterator[Callable[..., EmbeddedProxy]]:
    """Start proxies (upstream URL, scenario, seed); each logs to tmp_path and is stopped after the test."""
    from chaosproxy.embedded import EmbeddedProxy

    started: list[EmbeddedProxy] = []

    def start(upstream: str, scenario: Any = None, *, seed: int | None = None) -> EmbeddedProxy:
        log_path = tmp_path / f"chaosproxy-{len(started)}.jsonl"
        proxy = EmbeddedProxy(upstream, scenario, seed=seed, log_path=log_path).start()
        started.append(proxy)
        return proxy

    yield start
    for proxy in reversed(started):
        proxy.stop()


@pytest.fixture
def chaosproxy_upstream() -> str:
    """Override this fixture (or give the chaosproxy marker an upstream) to say what the proxy fronts."""
    pytest.fail("the chaosproxy fixture needs an upstream: @pytest.mark.chaosproxy(upstream=URL), "
                "or a chaosproxy_upstream fixture returning the URL", pytrace=False)


@pytest.fixture(scope="session")
def _chaosproxy_shared() -> Iterator[Callable[[str], EmbeddedProxy]]:
    """The proxies tests marked `shared=True` share, by upstream, for the whole session."""
    from chaosproxy.embedded import EmbeddedProxy

    shared: dict[str, EmbeddedProxy] = {}

    def start(upstream: str) -> EmbeddedProxy:
        if upstream not in shared:
            shared[upstream] = EmbeddedProxy(upstream).start()
        return shared[upstream]

    yield start
    for proxy in shared.values():
        proxy.stop()


@pytest.fixture
def chaosproxy(request: pytest.FixtureRequest, chaosproxy_factory: Callable[..., EmbeddedProxy]) -> Iterator[ProxyView]:
    """A proxy in front of the marker's upstream (else chaosproxy_upstream's), with no faults unless asked:
    its own, or a scope of its own on a shared one (--chaosproxy-proxy, or the marker's `shared=True`)."""
    from chaosproxy.client import ControlClient
    from chaosproxy.embedded import ScopedProxy

    marker = request.node.get_closest_marker("chaosproxy")
    options = dict(marker.kwargs) if marker is not None else {}
    positional = marker.args if marker is not None else ()
    shared_url = request.config.getoption("chaosproxy_proxy")
    if shared_url is not None:  # a running proxy every test shares
        control = request.config.getoption("chaosproxy_control")
        if control is None:
            pytest.fail("--chaosproxy-proxy needs --chaosproxy-control (its control API)", pytrace=False)
        url, client = shared_url.rstrip("/"), ControlClient(control)
    else:
        upstream = options.pop("upstream", None) or (positional[0] if positional else None)
        if upstream is None:
            upstream = request.getfixturevalue("chaosproxy_upstream")
        if not options.pop("shared", False):
            yield chaosproxy_factory(upstream, **options)
            return
        proxy = request.getfixturevalue("_chaosproxy_shared")(upstream)
        url, client = proxy.url, proxy.control
    scoped = ScopedProxy.open(url, client, scope_name(request.node.nodeid), options.get("scenario"))
    yield scoped
    scoped.close()


def scope_name(node_id: str) -> str:
    """A test's scope: its name made a short token, unique by a digest of its id and the xdist worker."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    digest = hashlib.sha256(f"{worker}/{node_id}".encode()).hexdigest()[:10]
    return re.sub(r"[^A-Za-z0-9._~:@+=-]+", "-", node_id.rpartition("::")[2])[-100:] + "-" + digest


@pytest.fixture
def chaosproxy_replay(request: pytest.FixtureRequest) -> Iterator[EmbeddedReplay]:
    """The chaosproxy_cassette marker's cassette served as the upstream for this test (stopped after it)."""
    from chaosproxy.cassette.embedded import EmbeddedReplay

    marker = request.node.get_closest_marker("chaosproxy_cassette")
    if marker is None or not (marker.args or "path" in marker.kwargs):
        pytest.fail("chaosproxy_replay needs @pytest.mark.chaosproxy_cassette(PATH)", pytrace=False)
    path = Path(marker.kwargs.get("path") or marker.args[0])
    if not path.is_absolute():
        path = request.path.parent / path
    with EmbeddedReplay(path, speed=marker.kwargs.get("speed")) as replay:
        yield replay
