"""Scopes: tests sharing one listener each meet only their own faults, gate counters included.

The parallel test runs a real `chaosproxy run --control` and two pytest processes at once against it,
each test in a scope of its own through the plugin's --chaosproxy-proxy/--chaosproxy-control.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from chaosproxy.client import ControlClient, ControlError
from chaosproxy.embedded import EmbeddedProxy, ScopedProxy
from tests.helpers.support import free_port, wait_listening
from tests.helpers.support import http_status as status

pytest_plugins = ["pytester"]

# a global counter: without scopes, one test's first call would use up the other's fault
ROOT = Path(__file__).resolve().parents[2]
ONCE = {"rules": [{"name": "down", "scope": "global", "first": 1, "match": {"path": "/api/weather"},
                   "fault": {"type": "http_error", "status": 503}}]}

PARALLEL_TEST = textwrap.dedent("""
    import os, time
    from pathlib import Path
    import pytest
    from tests.helpers.support import http_status as status

    def meet(barrier: Path, me: str, other: str) -> None:
        (barrier / me).touch()
        deadline = time.monotonic() + 30
        while not (barrier / other).exists():
            assert time.monotonic() < deadline, "the other test never came"
            time.sleep(0.01)

    @pytest.mark.chaosproxy(scenario={scenario!r})
    def test_{me}(chaosproxy):
        barrier = Path(os.environ["BARRIER"])
        meet(barrier, "{me}-ready", "{other}-ready")  # both scopes exist: the calls below overlap
        statuses = [status(chaosproxy.url + "/api/weather", chaosproxy.headers) for _ in range(3)]
        meet(barrier, "{me}-done", "{other}-done")  # both have called: each journal is complete
        assert statuses == [503, 200, 200]
        [fault] = chaosproxy.faults()
        assert fault["rule"] == "down" and fault["scope"] == chaosproxy.control.scope
        assert [call["status"] for call in chaosproxy.calls()] == [503, 200, 200]
""")




@contextlib.contextmanager
def run_proxy(upstream: str, folder: Path, *flags: str) -> Iterator[tuple[str, str]]:
    """`chaosproxy run` with its control API, as a process of its own: (proxy URL, control URL)."""
    port, control = free_port(), free_port()
    with (folder / "run.err").open("wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "chaosproxy", "run", "--upstream", upstream, "--listen", f"127.0.0.1:{port}",
             "--control", f"127.0.0.1:{control}", "--log", str(folder / "run.jsonl"), *flags],
            stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
    try:
        wait_listening(port, proc)
        wait_listening(control, proc)
        yield f"http://127.0.0.1:{port}", f"http://127.0.0.1:{control}"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(10)


@pytest.fixture
def running_proxy(upstream: str, tmp_path: Path) -> Iterator[tuple[str, str]]:
    with run_proxy(upstream, tmp_path) as urls:
        yield urls


def test_two_test_processes_in_parallel_see_only_their_own_faults(running_proxy, tmp_path: Path):
    url, control = running_proxy
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    runs = []
    for me, other in (("alpha", "beta"), ("beta", "alpha")):
        folder = tmp_path / me
        folder.mkdir()
        (folder / f"test_{me}.py").write_text(PARALLEL_TEST.format(me=me, other=other, scenario=ONCE))
        runs.append(subprocess.Popen(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--chaosproxy-proxy={url}",
             f"--chaosproxy-control={control}", str(folder)],
            cwd=folder, env={**os.environ, "BARRIER": str(barrier), "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True))
    outputs = [run.communicate(timeout=90)[0] for run in runs]
    assert [run.returncode for run in runs] == [0, 0], "\n".join(outputs)
    # a call in no scope gets the proxy's own scenario (none), and the scopes are gone with their tests
    assert status(url + "/api/weather") == 200
    faults = ControlClient(control).faults()
    assert sorted(fault["scope"].split("-")[0] for fault in faults) == ["test_alpha", "test_beta"]
    with urllib.request.urlopen(control + "/scopes", timeout=10) as response:
        assert json.loads(response.read())["scopes"] == []


def test_a_scope_has_its_own_scenario_and_the_listener_keeps_its_own(upstream: str):
    listener_rule = {"rules": [{"name": "teapot", "match": {"path": "/api/weather"},
                                "fault": {"type": "http_error", "status": 418}}]}
    with EmbeddedProxy(upstream, listener_rule) as proxy:
        scoped = ScopedProxy.open(proxy.url, proxy.control, "t1", ONCE)
        weather = proxy.url + "/api/weather"
        assert [status(weather, scoped.headers) for _ in range(2)] == [503, 200]
        assert status(weather) == 418  # no scope: the listener's scenario
        assert status(weather, {"X-Chaosproxy-Scope": "nobody"}) == 418  # a scope that does not exist: the same
        assert scoped.control.get_scenario()["rules"][0]["name"] == "down"
        scoped.control.reset()  # its counters start over: its first call fails again
        assert status(weather, scoped.headers) == 503
        scoped.close()
        assert status(weather, scoped.headers) == 418
        with pytest.raises(ControlError) as gone:
            scoped.control.get_scenario()
        assert gone.value.status == 404


def test_a_scope_name_must_be_a_short_token(upstream: str):
    with EmbeddedProxy(upstream) as proxy, pytest.raises(ControlError) as refused:
        proxy.control.scoped("a b\r\nX-Injected: 1")
    assert refused.value.status in (400, 404)


def test_the_scope_header_is_configurable(upstream: str, tmp_path: Path):
    with run_proxy(upstream, tmp_path, "--scope-header", "X-Test-Scope") as (url, control):
        scoped = ControlClient(control).scoped("t1", ONCE)
        assert scoped.headers == {"x-test-scope": "t1"}
        assert status(url + "/api/weather", {"X-Chaosproxy-Scope": "t1"}) == 200  # the default name is not it
        assert status(url + "/api/weather", {"X-Test-Scope": "t1"}) == 503




def test_tests_marked_shared_share_one_proxy_each_in_its_own_scope(pytester, upstream: str, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # the test's own process imports the tests' helpers
    pytester.makepyfile(f"""
        import pytest
        from tests.helpers.support import http_status as status

        URLS = set()
        ONCE = {ONCE!r}

        @pytest.mark.parametrize("n", [1, 2])
        @pytest.mark.chaosproxy(upstream={upstream!r}, scenario=ONCE, shared=True)
        def test_each_meets_its_own_first_fault(chaosproxy, n):
            URLS.add(chaosproxy.url)
            assert [status(chaosproxy.url + "/api/weather", chaosproxy.headers) for _ in range(2)] == [503, 200]
            assert len(chaosproxy.faults()) == 1

        def test_they_shared_one_listener():
            assert len(URLS) == 1
    """)
    pytester.runpytest_subprocess("-p", "no:cacheprovider").assert_outcomes(passed=3)
