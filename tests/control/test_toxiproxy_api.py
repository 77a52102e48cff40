"""The Toxiproxy-compatible API, driven by Toxiproxy's own clients and compared with a real Toxiproxy.

The Node client (`toxiproxy-node-client`, installed by tests/peers/install.sh) and the Go client (built
here from a fetched Toxiproxy v2.3.0 source) run the same script against chaosproxy and, where one is
built, against a real Toxiproxy 2.3 server, observing each step with a real HTTP client through the
proxy. A real Toxiproxy and the Go client are not on a fresh machine: those runs skip, saying why.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.support import wait_listening
from tests.peers.peers import NODE22, free_port

TESTS = Path(__file__).resolve().parents[1]
DRIVERS = TESTS / "peers" / "toxiproxy"
NODE_CLIENT = TESTS.parent / ".peers" / "node_modules" / "toxiproxy-node-client"
# Where shared/bench/build_toxiproxy.sh leaves Toxiproxy v2.3.0: its server, and its source in a GOPATH.
TOXIPROXY_SERVER = Path(os.environ.get("TOXIPROXY_SERVER", "/tmp/toxgo/toxiproxy-server"))
TOXIPROXY_GOPATH = Path(os.environ.get("TOXIPROXY_GOPATH", "/tmp/toxgo"))
GO_CLIENT = TOXIPROXY_GOPATH / "src" / "github.com" / "Shopify" / "toxiproxy" / "v2" / "client"


def _absent_toxiproxy() -> str | None:
    if not TOXIPROXY_SERVER.is_file():
        return (f"no Toxiproxy 2.3 server at {TOXIPROXY_SERVER} (TOXIPROXY_SERVER): build one from a fetched "
                "Toxiproxy v2.3.0 source with shared/bench/build_toxiproxy.sh")
    return None


def _absent_go_client() -> str | None:
    if shutil.which("go") is None:
        return "no Go toolchain (Debian's golang-go) to build Toxiproxy's Go client"
    if not (GO_CLIENT / "client.go").is_file():
        return (f"no Toxiproxy Go client source at {GO_CLIENT} (TOXIPROXY_GOPATH): lay a fetched Toxiproxy "
                "v2.3.0 source there with shared/bench/build_toxiproxy.sh")
    return None


@contextlib.contextmanager
def _api(kind: str, folder: Path) -> Iterator[str]:
    """A Toxiproxy API on loopback: chaosproxy's (`chaosproxy toxiproxy`) or a real Toxiproxy's; yields
    HOST:PORT."""
    port = free_port()
    if kind == "chaosproxy":
        command = [sys.executable, "-m", "chaosproxy", "toxiproxy", "--listen", f"127.0.0.1:{port}",
                   "--log", str(folder / "chaosproxy.jsonl")]
    else:
        if reason := _absent_toxiproxy():
            pytest.skip(reason)
        command = [str(TOXIPROXY_SERVER), "-host", "127.0.0.1", "-port", str(port)]
    with (folder / f"{kind}.err").open("wb") as err:
        proc = subprocess.Popen(command, stdout=err, stderr=err, start_new_session=True)
    try:
        wait_listening(port, proc)
        yield f"127.0.0.1:{port}"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(10)


def _upstream_address(upstream: str) -> str:
    return upstream.removeprefix("http://")


def _check(seen: dict[str, Any], kind: str) -> None:
    """What the drivers saw, as it must be on both servers."""
    assert seen["populated"]["status"] == 200 and seen["plain"]["status"] == 200
    assert seen["latency"]["status"] == 200 and seen["latency"]["ms"] >= 550  # latency 600 ms
    assert seen["after_latency"]["status"] == 200 and seen["after_latency"]["ms"] < 400
    assert "error" in seen["timeout"]  # the connection closes with no answer
    assert seen["after_timeout"]["status"] == 200
    assert seen["disabled_enabled"] is False and "error" in seen["disabled"]
    assert seen["enabled"]["status"] == 200
    assert seen["reset_enabled"] is True and seen["reset_toxics"] == 0 and seen["after_reset"]["status"] == 200
    assert seen["proxies"] == ["populated", "web"]
    latency = {"name": "slow", "type": "latency", "stream": "downstream", "toxicity": 1,
               "attributes": {"latency": 600, "jitter": 0}}
    assert seen["latency_toxic"] == latency, kind
    assert seen["timeout_toxic"] == {"name": "cut", "type": "timeout", "stream": "downstream", "toxicity": 1,
                                     "attributes": {"timeout": 300}}, kind


@pytest.mark.parametrize("kind", ["chaosproxy", "toxiproxy"])
def test_the_node_client_drives_the_api(kind: str, upstream: str, tmp_path: Path):
    if not (NODE_CLIENT.is_dir() and NODE22.is_file()):
        pytest.skip("toxiproxy-node-client not installed: run tests/peers/install.sh")
    with _api(kind, tmp_path) as api:
        done = subprocess.run([str(NODE22), str(DRIVERS / "drive.js"), f"http://{api}", _upstream_address(upstream)],
                              capture_output=True, text=True, timeout=90, cwd=tmp_path,
                              env={**os.environ, "NODE_PATH": str(NODE_CLIENT.parent)})
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    _check(seen, kind)
    assert seen["version"].startswith("2.3.0")


@pytest.fixture(scope="module")
def go_driver(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """drive.go built against Toxiproxy's Go client, in GOPATH mode with Debian's Go (no module downloads)."""
    if reason := _absent_go_client():
        pytest.skip(reason)
    binary = tmp_path_factory.mktemp("go") / "drive"
    env = {**os.environ, "GO111MODULE": "off", "GOPATH": str(TOXIPROXY_GOPATH), "GOFLAGS": "",
           "GOCACHE": str(binary.parent / "cache")}
    done = subprocess.run(["go", "build", "-o", str(binary), str(DRIVERS / "drive.go")], capture_output=True,
                          text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr
    return binary


@pytest.mark.parametrize("kind", ["chaosproxy", "toxiproxy"])
def test_the_go_client_drives_the_api(kind: str, go_driver: Path, upstream: str, tmp_path: Path):
    with _api(kind, tmp_path) as api:
        done = subprocess.run([str(go_driver), api, _upstream_address(upstream)], capture_output=True, text=True,
                              timeout=90)
    assert done.returncode == 0, done.stderr
    _check(json.loads(done.stdout), kind)


# Requests a client may get wrong, and what Toxiproxy 2.3 answers: status, and its JSON's error when it has one.
REFUSALS: list[tuple[str, str, Any, int, str | None]] = [
    ("GET", "/proxies/nope", None, 404, "proxy not found"),
    ("POST", "/proxies", {"listen": "127.0.0.1:0", "upstream": "127.0.0.1:1"}, 400, "missing required field: name"),
    ("POST", "/proxies", {"name": "x", "listen": "127.0.0.1:0"}, 400, "missing required field: upstream"),
    ("POST", "/proxies", {"name": "web", "listen": "127.0.0.1:0", "upstream": "127.0.0.1:1"}, 409,
     "proxy already exists"),
    ("POST", "/proxies/web/toxics", {"type": "latency", "stream": "sideways"}, 400,
     "stream was invalid, can be either upstream or downstream"),
    ("POST", "/proxies/web/toxics", {"type": "gremlins"}, 400, "invalid toxic type"),
    ("POST", "/proxies/web/toxics", {"name": "slow", "type": "latency"}, 409, "toxic already exists"),
    ("GET", "/proxies/web/toxics/nope", None, 404, "toxic not found"),
    ("DELETE", "/proxies/web/toxics/nope", None, 404, "toxic not found"),
    ("DELETE", "/proxies/nope", None, 404, "proxy not found"),
    ("POST", "/populate", [{"name": "p", "listen": "127.0.0.1:0"}], 400,
     "missing required field: upstream at proxy 1"),
    ("GET", "/proxies", None, 200, None),
    ("POST", "/reset", None, 204, None),
]


def _call(api: str, method: str, path: str, body: Any = None,
          headers: dict[str, str] | None = None) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(f"http://{api}{path}", data=data, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            status, text = response.status, response.read()
    except urllib.error.HTTPError as error:
        with error:
            status, text = error.code, error.read()
    return status, json.loads(text) if text.strip() else None


@pytest.mark.parametrize("kind", ["chaosproxy", "toxiproxy"])
def test_refusals_have_toxiproxys_status_and_shape(kind: str, upstream: str, tmp_path: Path):
    with _api(kind, tmp_path) as api:
        _call(api, "POST", "/proxies", {"name": "web", "listen": "127.0.0.1:0", "upstream": "127.0.0.1:1"})
        _call(api, "POST", "/proxies/web/toxics", {"name": "slow", "type": "latency"})
        for method, path, body, status, error in REFUSALS:
            got, answer = _call(api, method, path, body)
            assert got == status, (method, path, answer)
            if error is not None:
                extra = {"proxies": None} if path == "/populate" else {}  # (those it made: none)
                assert answer == {"error": error, "status": status, **extra}, (method, path)


def test_browsers_are_refused_as_toxiproxy_refuses_them(tmp_path: Path):
    with _api("chaosproxy", tmp_path) as api:
        assert _call(api, "GET", "/proxies", headers={"User-Agent": "Mozilla/5.0"})[0] == 403
        assert _call(api, "GET", "/proxies", headers={"Origin": "http://evil.example"})[0] == 403
        assert _call(api, "GET", "/proxies", headers={"Host": "evil.example"})[0] == 403


def test_the_toxiproxy_api_listens_on_loopback_only(tmp_path: Path):
    done = subprocess.run([sys.executable, "-m", "chaosproxy", "toxiproxy", "--listen", "0.0.0.0:0", "--log",
                           str(tmp_path / "l.jsonl")], capture_output=True, text=True, timeout=30)
    assert done.returncode == 2 and "loopback only" in done.stderr


def _get(url: str, timeout: float = 10) -> tuple[int | str, bytes, float]:
    start = time.monotonic()
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, response.read(), time.monotonic() - start
    except urllib.error.HTTPError as error:
        with error:
            return error.code, error.read(), time.monotonic() - start
    except (OSError, http.client.HTTPException) as error:
        return type(error).__name__, b"", time.monotonic() - start


@pytest.fixture
def web(upstream: str, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """chaosproxy's Toxiproxy API with a proxy `web` in front of the tool server: (API, proxy URL)."""
    with _api("chaosproxy", tmp_path) as api:
        status, proxy = _call(api, "POST", "/proxies", {"name": "web", "listen": "127.0.0.1:0",
                                                        "upstream": _upstream_address(upstream)})
        assert status == 201
        yield api, f"http://{proxy['listen']}"


def _toxic(api: str, toxic: dict[str, Any]) -> dict[str, Any]:
    status, answer = _call(api, "POST", "/proxies/web/toxics", toxic)
    assert status == 200, answer
    return answer


def test_bandwidth_and_slicer_drip_the_response(web):
    api, url = web
    _, body, plain = _get(url + "/big?bytes=20000")
    _toxic(api, {"name": "narrow", "type": "bandwidth", "attributes": {"rate": 50}})  # 50 KB/s: 20 kB in ~0.4 s
    status, dripped, seconds = _get(url + "/big?bytes=20000")
    assert (status, dripped) == (200, body) and seconds >= 0.25 > plain
    _call(api, "DELETE", "/proxies/web/toxics/narrow")
    _toxic(api, {"name": "sliced", "type": "slicer", "attributes": {"average_size": 5000, "delay": 100_000}})
    status, sliced, seconds = _get(url + "/big?bytes=20000")  # 4 slices, 0.1 s apart
    assert (status, sliced) == (200, body) and seconds >= 0.25


def test_limit_data_cuts_the_body_and_reset_peer_resets(web):
    api, url = web
    _toxic(api, {"name": "cut", "type": "limit_data", "attributes": {"bytes": 100}})
    status, _, _ = _get(url + "/big?bytes=20000")
    assert status != 200  # the body stops after 100 bytes: the client sees an incomplete read
    _call(api, "DELETE", "/proxies/web/toxics/cut")
    _toxic(api, {"name": "rst", "type": "reset_peer", "attributes": {"timeout": 200}})
    status, _, seconds = _get(url + "/health")
    assert status in ("ConnectionResetError", "RemoteDisconnected") and seconds >= 0.15


def test_toxicity_is_the_probability_and_updates_change_it(web):
    api, url = web
    _toxic(api, {"name": "never", "type": "reset_peer", "toxicity": 0})
    assert _get(url + "/health")[0] == 200
    status, toxic = _call(api, "PATCH", "/proxies/web/toxics/never", {"toxicity": 1})
    assert status == 200 and toxic["toxicity"] == 1 and toxic["attributes"] == {"timeout": 0}
    assert _get(url + "/health")[0] != 200


def test_chaosproxys_own_faults_are_namespaced_toxics(web):
    api, url = web
    toxic = _toxic(api, {"name": "down", "type": "chaosproxy.http_error", "attributes": {"status": 503}})
    assert toxic == {"name": "down", "type": "chaosproxy.http_error", "stream": "downstream", "toxicity": 1,
                     "attributes": {"status": 503}}
    assert _get(url + "/health")[0] == 503
    status, answer = _call(api, "POST", "/proxies/web/toxics", {"type": "chaosproxy.http_error",
                                                                "attributes": {"status": "loud"}})
    assert status == 400 and "status" in answer["error"]
    status, answer = _call(api, "POST", "/proxies/web/toxics", {"type": "chaosproxy.gremlins"})
    assert status == 400 and "gremlins" in answer["error"]
    status, answer = _call(api, "POST", "/proxies/web/toxics", {"type": "chaosproxy.reset", "attributes": {
        "after_ms": 10, "after_bytes": 10}})
    assert status == 400 and "not both" in answer["error"]


def test_what_an_http_proxy_cannot_do_is_refused_or_said(web):
    api, url = web
    status, answer = _call(api, "POST", "/proxies/web/toxics", {"type": "bandwidth", "stream": "upstream",
                                                                "attributes": {"rate": 1}})
    assert status == 400 and "response bodies only" in answer["error"]
    _toxic(api, {"name": "close", "type": "slow_close", "attributes": {"delay": 1000}})  # listed, no HTTP effect
    status, _, seconds = _get(url + "/health")
    assert status == 200 and seconds < 0.5
    assert [toxic["name"] for toxic in _call(api, "GET", "/proxies/web/toxics")[1]] == ["close"]


def test_run_serves_the_toxiproxy_api_beside_its_control_api(upstream: str, tmp_path: Path):
    """`run --toxiproxy-api`: a proxy made through Toxiproxy's API is one of the control API's, its calls
    and toxics' faults in the journal."""
    port, control, toxiproxy = free_port(), free_port(), free_port()
    with (tmp_path / "run.err").open("wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "chaosproxy", "run", "--upstream", upstream, "--listen", f"127.0.0.1:{port}",
             "--control", f"127.0.0.1:{control}", "--toxiproxy-api", f"127.0.0.1:{toxiproxy}",
             "--log", str(tmp_path / "run.jsonl")], stdout=err, stderr=err, start_new_session=True)
    try:
        wait_listening(toxiproxy, proc)
        api = f"127.0.0.1:{toxiproxy}"
        _, made = _call(api, "POST", "/proxies", {"name": "web", "listen": "127.0.0.1:0",
                                                  "upstream": _upstream_address(upstream)})
        _call(api, "POST", "/proxies/web/toxics", {"name": "down", "type": "chaosproxy.http_error",
                                                   "attributes": {"status": 502}})
        assert _get(f"http://{made['listen']}/health")[0] == 502
        _, listed = _call(f"127.0.0.1:{control}", "GET", "/proxies")
        assert [(proxy["name"], proxy["toxics"]) for proxy in listed["proxies"]] == [("web", ["down"])]
        _, journal = _call(f"127.0.0.1:{control}", "GET", "/journal?proxy=web&rule=down")
        assert [(line["event"], line.get("status")) for line in journal["lines"]] == [("fault", None),
                                                                                    ("call", 502)]
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(10)
