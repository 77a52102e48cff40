"""mitmproxy mode: a real HTTPS tool server on loopback, real clients going through the proxy.

The tool server's certificate comes from a CA made here, for `localhost` and `127.0.0.1`. The
proxy intercepts `localhost` only, so a client that trusts mitmproxy's CA alone reaches
`https://localhost` (intercepted, faulted), and a client that trusts the test CA alone reaches
`https://127.0.0.1` (tunnelled: it sees the real certificate, so nothing was decrypted).
"""

from __future__ import annotations

import asyncio
import datetime
import io
import ipaddress
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from chaosproxy.adapters.http.heads import RULE_BODY_LIMIT
from chaosproxy.adapters.mitm import CA_CERT, HostPatterns, MitmProxy, ca_directory
from chaosproxy.demo import tool_server
from chaosproxy.engine.core import Engine
from chaosproxy.engine.scenario import parse_scenario
from chaosproxy.telemetry.log import PerturbationLog
from tests.helpers.support import ServerLoop, free_port, log_events, rule, wait_listening

TIMEOUT = aiohttp.ClientTimeout(total=10)
CHAOSPROXY = [sys.executable, "-m", "chaosproxy"]


# --- a CA and a server certificate for localhost and 127.0.0.1, made here -------------------------

def _certificate(subject: str, key: ec.EllipticCurvePrivateKey, issuer: x509.Name | None,
                 issuer_key: ec.EllipticCurvePrivateKey, *, ca: bool) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    builder = (x509.CertificateBuilder().subject_name(name).issuer_name(issuer or name)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(now + datetime.timedelta(days=2))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if ca:
        builder = builder.add_extension(x509.KeyUsage(
            digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
            key_encipherment=False, data_encipherment=False, key_agreement=False, encipher_only=False,
            decipher_only=False), critical=True)
    else:
        builder = builder.add_extension(x509.SubjectAlternativeName([
            x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


@pytest.fixture(scope="session")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("tls")
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = _certificate("chaosproxy test CA", ca_key, None, ca_key, ca=True)
    cert = _certificate("localhost", key, ca.subject, ca_key, ca=False)
    files = {"ca": folder / "ca.pem", "cert": folder / "server.pem", "key": folder / "server.key"}
    files["ca"].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    files["cert"].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    files["key"].write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()))
    return files


# --- the HTTPS tool server: the demo tool server's routes plus two JSON-RPC ones ------------------

async def _rpc(request: web.Request) -> web.Response:
    call = await request.json()
    result = {"content": [{"type": "text", "text": f"called {call['params']['name']}"}]}
    return web.json_response({"jsonrpc": "2.0", "id": call["id"], "result": result})


async def _rpc_stream(request: web.Request) -> web.StreamResponse:
    """A tools/call answered on an SSE stream: a progress notification, then the result."""
    call = await request.json()
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    note = {"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progress": 1}}
    result = {"jsonrpc": "2.0", "id": call["id"], "result": {"content": [{"type": "text", "text": "done"}]}}
    for message in (note, result):
        await response.write(b"event: message\ndata: " + json.dumps(message).encode() + b"\n\n")
    await response.write_eof()
    return response


async def _slow_text(request: web.Request) -> web.StreamResponse:
    """Chunked plain text, five pieces 0.2 s apart: a client sees the first long before the last."""
    response = web.StreamResponse(headers={"Content-Type": "text/plain"})
    response.enable_chunked_encoding()
    await response.prepare(request)
    for i in range(5):
        await response.write(f"line {i}\n".encode())
        await asyncio.sleep(0.2)
    await response.write_eof()
    return response


CHUNKED_JSON_BYTES = RULE_BODY_LIMIT + (2 << 20)


async def _chunked_json(request: web.Request) -> web.StreamResponse:
    """A JSON document past the rules' body limit, chunked (no Content-Length)."""
    response = web.StreamResponse(headers={"Content-Type": "application/json"})
    response.enable_chunked_encoding()
    await response.prepare(request)
    await response.write(b'{"pad": "')
    left = CHUNKED_JSON_BYTES - len(b'{"pad": ""}')
    while left > 0:
        piece = min(left, 1 << 20)
        await response.write(b"x" * piece)
        left -= piece
    await response.write(b'"}')
    await response.write_eof()
    return response


@pytest.fixture(scope="session")
def https_upstream(server_loop: ServerLoop, tls_files: dict[str, Path]) -> Iterator[int]:
    """The port of the HTTPS tool server on 127.0.0.1 (reach it as localhost or as 127.0.0.1)."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(tls_files["cert"], tls_files["key"])

    async def start() -> tuple[web.AppRunner, int]:
        app = tool_server.make_app()
        app.router.add_post("/rpc", _rpc)
        app.router.add_post("/rpc-stream", _rpc_stream)
        app.router.add_get("/slow-text", _slow_text)
        app.router.add_get("/chunked-json", _chunked_json)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
        await site.start()
        return runner, site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    runner, port = server_loop.run(start())
    yield port
    server_loop.run(runner.cleanup())


@pytest.fixture(scope="session")
def confdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CA directory of mitmproxy's own, made once for the session (as the first run does)."""
    return ca_directory(tmp_path_factory.mktemp("mitmproxy"))


class RunningMitm:
    def __init__(self, port: int, upstream_port: int, engine: Engine, log_path: Path, confdir: Path,
                 tls_files: dict[str, Path]) -> None:
        self.proxy = f"http://127.0.0.1:{port}"
        self.port = port
        self.intercepted = f"https://localhost:{upstream_port}"  # listed: decrypted and faulted
        self.tunnelled = f"https://127.0.0.1:{upstream_port}"  # not listed: passed through as TLS
        self.engine = engine
        self.log_path = log_path
        self.mitm_ca = ssl.create_default_context(cafile=confdir / CA_CERT)
        self.real_ca = ssl.create_default_context(cafile=tls_files["ca"])

    def events(self, kind: str | None = None) -> list[dict[str, Any]]:
        return log_events(self.log_path, kind)

    async def events_soon(self, kind: str, count: int, timeout: float = 5) -> list[dict[str, Any]]:
        """The log's `kind` lines once there are `count` (the call line follows the response by a little)."""
        deadline = time.monotonic() + timeout
        while len(found := self.events(kind)) < count and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        return found

    async def fetch(self, url: str, method: str = "GET", *, trust: ssl.SSLContext | None = None,
                    **kwargs: Any) -> tuple[int, dict[str, str], bytes]:
        async with aiohttp.ClientSession(timeout=TIMEOUT) as client:
            async with client.request(method, url, proxy=self.proxy, ssl=trust or self.mitm_ca, **kwargs) as response:
                return response.status, dict(response.headers), await response.read()


@pytest.fixture
def make_mitm(server_loop: ServerLoop, https_upstream: int, confdir: Path, tls_files: dict[str, Path],
              tmp_path: Path) -> Iterator[Any]:
    """Start a mitm proxy (intercepting localhost) with a scenario; stopped after the test."""
    started: list[tuple[MitmProxy, PerturbationLog]] = []

    def start(scenario: str | dict[str, Any] = "rules: []", *, hosts: str = "localhost", seed: int = 7) -> RunningMitm:
        text = scenario if isinstance(scenario, str) else yaml.safe_dump(scenario)
        log_path = tmp_path / f"log-{len(started)}.jsonl"
        log = PerturbationLog(io.FileIO(log_path, "w"), run_id="test", seed=seed)
        engine = Engine(parse_scenario(text), seed=seed, log=log)
        proxy = MitmProxy(engine, HostPatterns.parse(hosts), confdir=confdir, upstream_ca=tls_files["ca"])
        port = server_loop.run(proxy.start("127.0.0.1", 0))
        started.append((proxy, log))
        return RunningMitm(port, https_upstream, engine, log_path, confdir, tls_files)

    yield start
    for proxy, log in started:
        server_loop.run(proxy.stop())
        log.close()


# --- interception and passthrough -------------------------------------------------------------------

async def test_listed_host_is_intercepted_and_faulted_unlisted_host_tunnelled(make_mitm):
    mitm = make_mitm(rule("teapot", {"type": "http_error", "status": 418}, match={"path": "/api/*"}))
    status, _, _ = await mitm.fetch(mitm.intercepted + "/api/weather?city=oslo")
    assert status == 418
    status, _, body = await mitm.fetch(mitm.intercepted + "/health")
    assert (status, body) == (200, b"ok")
    # 127.0.0.1 is not listed: the client sees the real server's certificate (it trusts only the test CA)
    status, _, body = await mitm.fetch(mitm.tunnelled + "/api/weather?city=oslo", trust=mitm.real_ca)
    assert status == 200 and json.loads(body)["city"] == "oslo"
    with pytest.raises(aiohttp.ClientConnectorCertificateError):  # ...and not mitmproxy's
        await mitm.fetch(mitm.tunnelled + "/health")
    [fault] = mitm.events("fault")
    assert (fault["rule"], fault["transport"], fault["route"], fault["path"]) == (
        "teapot", "mitm", "localhost", "/api/weather")
    calls = await mitm.events_soon("call", 2)
    assert [(c["path"], c["status"], c["outcome"], c["faults"]) for c in calls] == [
        ("/api/weather", 418, "fault_response", ["teapot"]), ("/health", 200, "ok", [])]
    assert all(c["transport"] == "mitm" and c["route"] == "localhost" for c in calls)


async def test_a_scenario_put_in_force_is_asked_on_the_next_request(make_mitm, server_loop):
    """The addon judges each request by the engine's interest of the moment (Engine.interest): a
    scenario swapped in is asked at once, as under `chaosproxy run`."""
    mitm = make_mitm()
    status, _, body = await mitm.fetch(mitm.intercepted + "/health")
    assert (status, body) == (200, b"ok")

    async def swap() -> None:
        mitm.engine.load(parse_scenario(yaml.safe_dump(rule("teapot", {"type": "http_error", "status": 418}))))

    server_loop.run(swap())
    status, _, _ = await mitm.fetch(mitm.intercepted + "/health")
    assert status == 418 and [fault["rule"] for fault in mitm.events("fault")] == ["teapot"]


async def test_a_listed_ip_does_not_let_in_the_names_that_resolve_to_it(make_mitm):
    """--hosts 127.0.0.1: https://127.0.0.1 is intercepted, https://localhost (also 127.0.0.1) is not."""
    mitm = make_mitm(rule("teapot", {"type": "http_error", "status": 418}), hosts="127.0.0.1")
    status, _, _ = await mitm.fetch(mitm.tunnelled + "/health")  # 127.0.0.1: listed, mitmproxy's certificate
    assert status == 418
    status, _, body = await mitm.fetch(mitm.intercepted + "/health", trust=mitm.real_ca)  # localhost: real one
    assert (status, body) == (200, b"ok")
    with pytest.raises(aiohttp.ClientConnectorCertificateError):
        await mitm.fetch(mitm.intercepted + "/health")
    assert [fault["route"] for fault in mitm.events("fault")] == ["127.0.0.1"]


async def test_a_chunked_json_rpc_request_is_inspected(make_mitm):
    """A request body without Content-Length is read whole when it is JSON and a rule needs bodies."""
    mitm = make_mitm(rule("refuse", {"type": "rpc_error", "code": -32000}, match={"tool": "lookup"}))

    async def chunked(call: dict[str, Any]) -> Any:
        body = json.dumps(call).encode()
        yield body[:10]
        yield body[10:]

    call = {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "lookup", "arguments": {}}}
    status, _, body = await mitm.fetch(mitm.intercepted + "/rpc", "POST", data=chunked(call),
                                       headers={"Content-Type": "application/json"})
    assert status == 200 and json.loads(body)["error"]["code"] == -32000
    [fault] = mitm.events("fault")
    assert (fault["rule"], fault["tool"], fault["rpc_id"]) == ("refuse", "lookup", 7)


@pytest.mark.slow
async def test_a_chunked_json_request_past_the_rule_limit_streams_on_undecided(make_mitm):
    """Read whole for rules only up to RULE_BODY_LIMIT: a larger chunked body is passed on as it comes."""
    mitm = make_mitm(rule("refuse", {"type": "rpc_error", "code": -32000}, match={"tool": "lookup"}))
    body = json.dumps({"pad": "x" * (RULE_BODY_LIMIT + (1 << 20))}).encode()

    async def chunked() -> Any:
        for start in range(0, len(body), 1 << 20):
            yield body[start:start + (1 << 20)]

    status, _, echoed = await mitm.fetch(mitm.intercepted + "/echo/big", "POST", data=chunked(),
                                         headers={"Content-Type": "application/json"})
    assert status == 200 and echoed == body
    [skip] = mitm.events("skip")
    assert skip["path"] == "/echo/big" and "past" in skip["reason"] and "request" in skip["reason"]
    assert mitm.events("fault") == []


@pytest.mark.slow
async def test_a_chunked_json_response_past_the_rule_limit_streams_on_undecided(make_mitm):
    mitm = make_mitm(rule("typos", {"type": "typos", "rate": 1}, match={"path": "/chunked-json"}))
    status, _, body = await mitm.fetch(mitm.intercepted + "/chunked-json")
    assert status == 200 and len(body) == CHUNKED_JSON_BYTES and json.loads(body)["pad"].count("x") > RULE_BODY_LIMIT
    [skip] = mitm.events("skip")
    assert skip["path"] == "/chunked-json" and "response" in skip["reason"]
    assert mitm.events("fault") == []


@pytest.mark.slow
async def test_a_chunked_text_response_streams_past_an_unrelated_message_rule(make_mitm):
    """A rule on one MCP tool must not make every chunked text response wait for its last byte."""
    mitm = make_mitm(rule("typos", {"type": "typos", "rate": 1}, match={"tool": "search"}))
    async with aiohttp.ClientSession(timeout=TIMEOUT) as client:
        started = time.perf_counter()
        async with client.get(mitm.intercepted + "/slow-text", proxy=mitm.proxy, ssl=mitm.mitm_ca) as response:
            first = await response.content.readline()
            first_at = time.perf_counter() - started
            rest = await response.read()
    assert first == b"line 0\n" and rest.count(b"line") == 4
    assert first_at < 0.6  # the whole body takes 1 s: it was passed on as it came
    assert mitm.events("fault") == []


async def test_idle_proxy_is_transparent(make_mitm):
    mitm = make_mitm()
    body = bytes(range(256)) * 400
    status, headers, echoed = await mitm.fetch(mitm.intercepted + "/echo/a%20b?x=1", "POST", data=body,
                                               headers={"X-Custom": "Value", "Content-Type": "application/x-test"})
    assert (status, echoed) == (200, body)
    assert headers["X-Echo-Path"] == "/echo/a%20b?x=1"
    received = dict(json.loads(headers["X-Echo-Headers"]))
    assert received["X-Custom"] == "Value" and received["Content-Type"] == "application/x-test"
    status, _, big = await mitm.fetch(mitm.intercepted + "/big?bytes=3000000")  # streamed, not buffered
    assert status == 200 and len(big) == 3_000_000
    assert mitm.events("fault") == []


async def test_large_request_bodies_stream_and_still_meet_faults(make_mitm):
    """A body past the buffering limit is decided on its headers, then streamed (or never sent)."""
    mitm = make_mitm(rule("down", {"type": "http_error", "status": 503}, match={"path": "/echo/down"}))
    body = os.urandom(3_000_000)
    status, _, echoed = await mitm.fetch(mitm.intercepted + "/echo/up", "POST", data=body)
    assert status == 200 and echoed == body
    status, headers, _ = await mitm.fetch(mitm.intercepted + "/echo/down", "POST", data=body)
    assert status == 503 and "X-Echo-Method" not in headers


async def test_plain_http_through_http_proxy(make_mitm, upstream):
    """HTTP_PROXY traffic: faults on listed hosts (localhost), untouched elsewhere (127.0.0.1)."""
    mitm = make_mitm(rule("down", {"type": "http_error", "status": 503}))
    port = upstream.rsplit(":", 1)[1]
    async with aiohttp.ClientSession(timeout=TIMEOUT) as client:
        async with client.get(f"http://localhost:{port}/health", proxy=mitm.proxy) as response:
            assert response.status == 503
        async with client.get(f"http://127.0.0.1:{port}/health", proxy=mitm.proxy) as response:
            assert (response.status, await response.read()) == (200, b"ok")
    [fault] = mitm.events("fault")
    assert fault["route"] == "localhost"


@pytest.mark.slow
@pytest.mark.parametrize("at,minimum", [("request", 0.3), ("response", 0.3)])
async def test_latency(make_mitm, at, minimum):
    mitm = make_mitm(rule("slow", {"type": "latency", "delay_ms": 300, "at": at}, match={"path": "/api/*"}))
    started = time.perf_counter()
    status, _, _ = await mitm.fetch(mitm.intercepted + "/api/weather")
    assert status == 200 and time.perf_counter() - started >= minimum - 0.01
    started = time.perf_counter()
    await mitm.fetch(mitm.intercepted + "/health")
    assert time.perf_counter() - started < 0.25
    assert [e["phase"] for e in mitm.events("fault")] == [at]


@pytest.mark.slow
async def test_hang_until_the_client_gives_up(make_mitm):
    mitm = make_mitm(rule("stuck", {"type": "hang"}, match={"path": "/api/*"}))
    async with aiohttp.ClientSession() as client:
        with pytest.raises(asyncio.TimeoutError):
            async with client.get(mitm.intercepted + "/api/weather", proxy=mitm.proxy, ssl=mitm.mitm_ca,
                                  timeout=aiohttp.ClientTimeout(total=0.7)):
                pass
    status, _, _ = await mitm.fetch(mitm.intercepted + "/health")  # the proxy keeps serving
    assert status == 200
    calls = await mitm.events_soon("call", 2)
    assert sorted(c["outcome"] for c in calls) == ["hang", "ok"]


@pytest.mark.slow
async def test_hang_with_release_forwards_late(make_mitm):
    mitm = make_mitm(rule("stall", {"type": "hang", "release_after_ms": 300}))
    started = time.perf_counter()
    status, _, body = await mitm.fetch(mitm.intercepted + "/api/weather?city=oslo")
    assert status == 200 and b"oslo" in body and time.perf_counter() - started >= 0.29


async def test_reset_before_the_response(make_mitm):
    mitm = make_mitm(rule("crash", {"type": "reset"}, match={"path": "/api/*"}))
    with pytest.raises(aiohttp.ClientError):
        await mitm.fetch(mitm.intercepted + "/api/weather")
    assert (await mitm.fetch(mitm.intercepted + "/health"))[0] == 200
    calls = await mitm.events_soon("call", 2)  # aiohttp may retry an idempotent request once: reset again
    assert {(c["path"], c["outcome"]) for c in calls} == {("/api/weather", "reset"), ("/health", "ok")}


async def test_reset_mid_body(make_mitm):
    mitm = make_mitm(rule("crash-late", {"type": "reset", "after_bytes": 5000}))
    received = 0
    async with aiohttp.ClientSession(timeout=TIMEOUT) as client:
        async with client.get(mitm.intercepted + "/big?bytes=200000", proxy=mitm.proxy, ssl=mitm.mitm_ca) as response:
            assert response.status == 200
            with pytest.raises(aiohttp.ClientError):
                async for chunk in response.content.iter_any():
                    received += len(chunk)
    assert received <= 5000


@pytest.mark.parametrize("params,expected", [({"bytes": 1000}, 1000), ({"fraction": 0.25}, 25000)])
async def test_truncate_closes_after_the_limit(make_mitm, params, expected):
    mitm = make_mitm(rule("cut", {"type": "truncate", **params}))
    body = b""
    async with aiohttp.ClientSession(timeout=TIMEOUT) as client:
        async with client.get(mitm.intercepted + "/big?bytes=100000", proxy=mitm.proxy, ssl=mitm.mitm_ca) as response:
            assert response.headers["Content-Length"] == "100000"  # the promise the body then breaks
            with pytest.raises(aiohttp.ClientPayloadError):
                async for chunk in response.content.iter_any():
                    body += chunk
    assert len(body) == expected
    [call] = await mitm.events_soon("call", 1)
    assert (call["outcome"], call["bytes_out"]) == ("truncated", expected)


async def test_truncate_fraction_of_a_chunked_body(make_mitm):
    mitm = make_mitm(rule("cut", {"type": "truncate", "fraction": 0.5}, match={"path": "/sse"}))
    body = b""
    async with aiohttp.ClientSession(timeout=TIMEOUT) as client:
        async with client.get(mitm.intercepted + "/sse?n=4&interval_ms=1", proxy=mitm.proxy,
                              ssl=mitm.mitm_ca) as response:
            with pytest.raises(aiohttp.ClientPayloadError):
                async for chunk in response.content.iter_any():
                    body += chunk
    assert len(body) == 4 * len(b'id: 0\nevent: tick\ndata: {"n": 0}\n\n') // 2


@pytest.mark.slow
async def test_truncate_fraction_of_a_stream_that_does_not_end_relays_it_whole(make_mitm):
    """As under `chaosproxy run`: a body of unknown length is held to learn its size only for a while
    (the same executor, adapters/shaping.Fraction); then it goes on whole, and the log says why."""
    mitm = make_mitm(rule("cut", {"type": "truncate", "fraction": 0.5}, match={"path": "/sse"}))
    async with aiohttp.ClientSession(timeout=TIMEOUT) as client:
        async with client.get(mitm.intercepted + "/sse?n=1000&interval_ms=100", proxy=mitm.proxy,
                              ssl=mitm.mitm_ca) as response:
            started = time.perf_counter()
            first = await asyncio.wait_for(response.content.readuntil(b"\n\n"), 6)
    assert first.startswith(b"id: 0\n") and time.perf_counter() - started < 6
    [skip] = await mitm.events_soon("skip", 1)
    assert skip["fault"] == "truncate" and "did not end" in skip["reason"]


async def test_slow_body_drips(make_mitm):
    mitm = make_mitm(rule("drip", {"type": "slow_body", "chunk_bytes": 10, "delay_ms": 40}))
    started = time.perf_counter()
    arrivals = []
    async with aiohttp.ClientSession(timeout=TIMEOUT) as client:
        async with client.get(mitm.intercepted + "/api/weather?city=oslo", proxy=mitm.proxy,
                              ssl=mitm.mitm_ca) as response:
            body = b""
            async for chunk in response.content.iter_any():
                body += chunk
                arrivals.append(time.perf_counter())
    took = time.perf_counter() - started
    assert body.startswith(b'{"city": "oslo"')
    assert took >= (len(body) // 10 - 1) * 0.04 * 0.9
    assert len(arrivals) >= len(body) // 10 // 2  # piece by piece, not at once at the end
    # the connection is whole again afterwards: the next request on it is not dripped
    started = time.perf_counter()
    assert (await mitm.fetch(mitm.intercepted + "/health"))[0] == 200
    assert time.perf_counter() - started < 0.3


@pytest.mark.slow
async def test_sse_streams_through(make_mitm):
    """Events reach the client as upstream sends them, also when each one's JSON-RPC is looked at."""
    mitm = make_mitm(rule("flip", {"type": "flip_is_error"}, match={"tool": "never"}))
    assert mitm.engine.interest.acts(mitm.engine.scenario.rules[0].fault.phase, wire=False)
    async with aiohttp.ClientSession(timeout=TIMEOUT) as client:
        started = time.perf_counter()
        async with client.get(mitm.intercepted + "/sse?n=4&interval_ms=400", proxy=mitm.proxy,
                              ssl=mitm.mitm_ca) as response:
            assert response.headers["Content-Type"].startswith("text/event-stream")
            arrivals = []
            async for line in response.content:
                if line.startswith(b"event: tick"):
                    arrivals.append(time.perf_counter() - started)
    assert len(arrivals) == 4
    assert arrivals[0] < 0.3 and arrivals[-1] >= 1.1  # the first well before the last


async def test_stream_cut_after_events(make_mitm):
    mitm = make_mitm(rule("cut", {"type": "stream_cut", "after_events": 2}, match={"path": "/sse"}))
    status, _, body = await mitm.fetch(mitm.intercepted + "/sse?n=40&interval_ms=50")
    assert status == 200  # a clean end: the body was delimited by the connection's close
    assert body.count(b"event: tick") == 2 and body.endswith(b"\n\n")
    [call] = await mitm.events_soon("call", 1)
    assert (call["outcome"], call["bytes_out"], call["faults"]) == ("stream_cut", len(body), ["cut"])


@pytest.mark.slow
async def test_stream_cut_idle_starves_the_client(make_mitm):
    mitm = make_mitm(rule("starve", {"type": "stream_cut", "after_events": 1, "then": "idle"}))
    lines = []
    async with aiohttp.ClientSession() as client:
        with pytest.raises(asyncio.TimeoutError):
            async with client.get(mitm.intercepted + "/sse?n=5&interval_ms=10", proxy=mitm.proxy, ssl=mitm.mitm_ca,
                                  timeout=aiohttp.ClientTimeout(total=None, sock_read=0.5)) as response:
                async for line in response.content:
                    lines.append(line)
    assert lines.count(b"event: tick\n") == 1
    [call] = await mitm.events_soon("call", 1)
    assert call["outcome"] == "stream_idle"


# --- JSON-RPC messages in JSON bodies and SSE events ----------------------------------------------

CALL = {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "search", "arguments": {}}}


async def test_rpc_error_answers_a_call_in_place_of_upstream(make_mitm):
    mitm = make_mitm(rule("fail", {"type": "rpc_error", "code": -32000, "message": "boom"}, match={"tool": "search"}))
    status, _, body = await mitm.fetch(mitm.intercepted + "/rpc", "POST", json=CALL)
    assert status == 200 and json.loads(body) == {"jsonrpc": "2.0", "id": 7,
                                                  "error": {"code": -32000, "message": "boom"}}
    [fault] = mitm.events("fault")
    assert (fault["tool"], fault["method"], fault["rpc_id"]) == ("search", "tools/call", 7)
    [call] = await mitm.events_soon("call", 1)
    assert (call["tool"], call["rpc_id"], call["outcome"]) == ("search", 7, "fault_response")


async def test_reply_rewritten_in_a_json_body(make_mitm):
    mitm = make_mitm(rule("lost", {"type": "rpc_error", "phase": "response", "message": "lost"},
                          match={"tool": "search"}))
    status, headers, body = await mitm.fetch(mitm.intercepted + "/rpc", "POST", json=CALL)
    reply = json.loads(body)
    assert status == 200 and reply["error"]["message"] == "lost" and reply["id"] == 7
    assert int(headers["Content-Length"]) == len(body)
    [call] = await mitm.events_soon("call", 1)
    assert (call["rpc_id"], call["faults"]) == (7, ["lost"])  # the relay's decision is on the call line


async def test_reply_rewritten_per_sse_event(make_mitm):
    mitm = make_mitm(rule("lost", {"type": "rpc_error", "phase": "response", "message": "lost"},
                          match={"tool": "search"}))
    started = time.perf_counter()
    status, _, body = await mitm.fetch(mitm.intercepted + "/rpc-stream", "POST", json=CALL)
    assert status == 200 and time.perf_counter() - started < 5
    events = [json.loads(line[6:]) for line in body.splitlines() if line.startswith(b"data: ")]
    assert events[0]["method"] == "notifications/progress"  # the notification passes as it was
    assert events[1] == {"jsonrpc": "2.0", "id": 7, "error": {"code": -32603, "message": "lost"}}
    [call] = await mitm.events_soon("call", 1)
    assert (call["rpc_id"], call["faults"]) == (7, ["lost"])


async def test_garbled_reply(make_mitm):
    mitm = make_mitm(rule("garble", {"type": "malformed", "variant": "truncated"}, match={"tool": "search"}))
    status, _, body = await mitm.fetch(mitm.intercepted + "/rpc", "POST", json=CALL)
    assert status == 200
    with pytest.raises(json.JSONDecodeError):
        json.loads(body)


async def test_rewritten_request_reaches_upstream_with_a_true_length(make_mitm):
    mitm = make_mitm(rule("typo", {"type": "unknown_tool"}, match={"tool": "search"}))
    status, _, body = await mitm.fetch(mitm.intercepted + "/rpc", "POST", json=CALL)
    [fault] = mitm.events("fault")
    called = json.loads(body)["result"]["content"][0]["text"].removeprefix("called ")
    assert status == 200 and called != "search" and called == fault["effect"].get("name", called)


# --- host globs ------------------------------------------------------------------------------------

def test_host_globs():
    hosts = HostPatterns.parse("api.example.com, *.corp,[::1]")
    assert "api.example.com" in hosts and "API.Example.COM" in hosts
    assert "tools.eu.corp" in hosts and "corp" not in hosts and "api.example.com.evil" not in hosts
    assert "::1" in hosts and "127.0.0.1" not in hosts
    assert "anything" in HostPatterns.parse(None)  # no --hosts: every host
    assert HostPatterns.parse(None).allow_hosts == []
    [regex, *_] = hosts.allow_hosts  # mitmproxy matches "host:port"
    import re
    assert re.search(regex, "api.example.com:443") and not re.search(regex, "xapi.example.com:443")


@pytest.mark.parametrize("value,reason", [
    ("https://api.example.com", "not URLs"), ("api.example.com:443", "without a port"),
    ("api example.com", "invalid host glob"), ("a,,b", "empty entry"), ("", "empty"), ("[a]!", "invalid"),
])
def test_bad_host_globs_are_refused(value, reason):
    with pytest.raises(ValueError, match=reason):
        HostPatterns.parse(value)


# --- the command line, as a user runs it -----------------------------------------------------------





AGENT = """
import sys, urllib.request, urllib.error
try:
    with urllib.request.urlopen(sys.argv[1], timeout=10) as response:
        print(response.status, response.read().decode())
except urllib.error.HTTPError as exc:
    print(exc.code, exc.read().decode())
"""


def _agent(url: str, proxy_port: int, ca: Path) -> tuple[int, str]:
    """A plain Python agent configured as the README says: HTTPS_PROXY and SSL_CERT_FILE, nothing else."""
    env = {k: v for k, v in os.environ.items() if k.lower() not in ("no_proxy", "https_proxy", "http_proxy")}
    env |= {"HTTPS_PROXY": f"http://127.0.0.1:{proxy_port}", "SSL_CERT_FILE": str(ca)}
    done = subprocess.run([sys.executable, "-c", AGENT, url], env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    status, _, body = done.stdout.strip().partition(" ")
    return int(status), body


def _control(port: int, method: str, path: str, body: dict | None = None) -> Any:
    import urllib.request
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method,
                                     data=json.dumps(body).encode() if body is not None else None,
                                     headers={"Content-Type": "application/json"})
    with opener.open(request, timeout=10) as response:
        return json.loads(response.read())


@pytest.fixture
def stop_later() -> Iterator[list[subprocess.Popen]]:
    procs: list[subprocess.Popen] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(5)


@pytest.mark.slow
def test_mitm_command(https_upstream, confdir, tls_files, tmp_path, stop_later):
    scenario = tmp_path / "s.yaml"
    scenario.write_text("rules:\n  - name: teapot\n    match: {path: /api/*}\n"
                        "    fault: {type: http_error, status: 418}\n")
    port, control, log = free_port(), free_port(), tmp_path / "faults.jsonl"
    proc = subprocess.Popen([*CHAOSPROXY, "mitm", "--scenario", str(scenario), "--listen", f"127.0.0.1:{port}",
                             "--hosts", "localhost", "--confdir", str(confdir), "--upstream-ca", str(tls_files["ca"]),
                             "--log", str(log), "--seed", "5", "--control", f"127.0.0.1:{control}"],
                            stderr=subprocess.PIPE, text=True)
    stop_later.append(proc)
    wait_listening(port, proc)
    wait_listening(control, proc)
    ca = confdir / CA_CERT
    assert _agent(f"https://localhost:{https_upstream}/api/weather?city=lima", port, ca)[0] == 418
    status, body = _agent(f"https://localhost:{https_upstream}/health", port, ca)
    assert (status, body) == (200, "ok")
    # the same control API as `run`
    assert [r["name"] for r in _control(control, "GET", "/scenario")["rules"]] == ["teapot"]
    _control(control, "PATCH", "/rules/teapot", {"enabled": False})
    assert _agent(f"https://localhost:{https_upstream}/api/weather?city=lima", port, ca)[0] == 200
    os.kill(proc.pid, signal.SIGTERM)
    assert proc.wait(15) == 0
    stderr = proc.stderr.read()
    assert f"intercepting localhost; the agent trusts {ca}" in stderr
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert [e["event"] for e in lines if e["event"] != "call"] == ["run", "fault", "control"]
    calls = [e for e in lines if e["event"] == "call"]
    assert [(c["path"], c["status"]) for c in calls] == [("/api/weather", 418), ("/health", 200), ("/api/weather", 200)]
    assert all(e["seed"] == 5 for e in lines)


def _mitm_fails(*flags: str) -> subprocess.CompletedProcess:
    done = subprocess.run([*CHAOSPROXY, "mitm", "--listen", f"127.0.0.1:{free_port()}", *flags],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    return done


@pytest.mark.slow
def test_missing_ca_directory(tmp_path):
    done = _mitm_fails("--confdir", str(tmp_path / "nowhere"))
    assert done.returncode == 2 and "does not exist" in done.stderr


@pytest.mark.slow
def test_ca_directory_that_is_a_file(tmp_path):
    (tmp_path / "file").write_text("")
    done = _mitm_fails("--confdir", str(tmp_path / "file"))
    assert done.returncode == 2 and "is not a directory" in done.stderr


@pytest.mark.slow
def test_ca_directory_that_cannot_be_written(tmp_path):
    if os.geteuid() == 0:  # root writes anywhere on a normal file system; sysfs refuses it too
        folder = Path("/sys/kernel")
        if not folder.is_dir():
            pytest.skip("no /sys/kernel to stand for a read-only directory")
    else:
        folder = tmp_path / "ro"
        folder.mkdir(mode=0o500)
    done = _mitm_fails("--confdir", str(folder))
    assert done.returncode == 1 and "cannot keep mitmproxy's CA in" in done.stderr


@pytest.mark.slow
def test_bad_hosts_glob():
    done = _mitm_fails("--hosts", "api.example.com,https://tools.corp/v1")
    assert done.returncode == 2 and "not URLs: 'https://tools.corp/v1'" in done.stderr


@pytest.mark.slow
def test_port_in_use(confdir):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = subprocess.run([*CHAOSPROXY, "mitm", "--listen", f"127.0.0.1:{port}", "--confdir", str(confdir)],
                              capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in done.stderr and "in use" in done.stderr


@pytest.mark.slow
def test_run_does_not_import_mitmproxy():
    code = ("import socket, sys\n"
            "from chaosproxy import cli\n"
            "busy = socket.socket(); busy.bind(('127.0.0.1', 0)); busy.listen()\n"
            "port = busy.getsockname()[1]\n"
            "assert cli.main(['run', '--upstream', 'http://127.0.0.1:9', '--listen', f'127.0.0.1:{port}']) == 1\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'mitmproxy'))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
