"""pytest plugin: a chaosproxy in front of your tool server, started in-process for one test.

    @pytest.mark.chaosproxy(upstream="http://127.0.0.1:9000")
    def test_agent_survives_a_503(chaosproxy):
        with chaosproxy.fault({"match": {"path": "/api/*"}, "fault": {"type": "http_error", "status": 503}}):
            assert run_agent(base_url=chaosproxy.url).succeeded

`chaosproxy` is an EmbeddedProxy: `.url` for the agent, `.control` (a ControlClient), `.fault(rule)`,
`.log_lines()`. The marker takes `upstream` (or it comes from a `chaosproxy_upstream` fixture you
define, which may start the server), `scenario` (YAML text or a mapping) and `seed`.
`chaosproxy_factory(upstream, scenario=None, seed=None)` starts more. Proxies for stdio servers are
not offered yet. Loaded through the `pytest11` entry point; `-p no:chaosproxy` turns it off.

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

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:  # imported when first used: the plugin loads in every pytest run
    from chaosproxy.cassette.embedded import EmbeddedReplay
    from chaosproxy.embedded import EmbeddedProxy


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "chaosproxy(upstream=None, scenario=None, seed=None): how the chaosproxy fixture starts")
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


@pytest.fixture
def chaosproxy(request: pytest.FixtureRequest,
               chaosproxy_factory: Callable[..., EmbeddedProxy]) -> EmbeddedProxy:
    """A proxy in front of the marker's upstream (else chaosproxy_upstream's), with no faults unless asked."""
    marker = request.node.get_closest_marker("chaosproxy")
    options = dict(marker.kwargs) if marker is not None else {}
    positional = marker.args if marker is not None else ()
    upstream = options.pop("upstream", None) or (positional[0] if positional else None)
    if upstream is None:
        upstream = request.getfixturevalue("chaosproxy_upstream")
    return chaosproxy_factory(upstream, **options)


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
