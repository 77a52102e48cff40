"""The control API over real HTTP on 127.0.0.1: swaps under traffic, rules, events, metrics, safety."""

from __future__ import annotations

import asyncio
import http.client
import json
import re
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from chaosproxy.client import ControlClient, ControlError
from chaosproxy.control.api import (
    ControlConfigError,
    ControlServer,
    is_loopback,
    scenario_json,
    serve_control,
)
from chaosproxy.control.reload import reload_scenario
from chaosproxy.engine.scenario import parse_scenario
from tests.helpers.support import RunningProxy, ServerLoop, free_port, rule, wait_listening

TOKEN = "s3cret-token"
FLAKY = {"name": "flaky", "match": {"path": "/echo/flaky"}, "fault": {"type": "http_error", "status": 503}}


class Controlled:
    """A proxy in front of the test tool server, with its control API and a client for it."""

    def __init__(self, proxy: RunningProxy, server: ControlServer, port: int, token: str | None) -> None:
        self.proxy = proxy
        self.server = server
        self.port = port
        self.control = ControlClient(f"http://127.0.0.1:{port}", token=token or "")

    def get(self, path: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
        """A raw request to the control API, with exactly the headers given (and Host)."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            conn.request("GET", path, headers=headers or {})
            response = conn.getresponse()
            body = response.read()
            return response.status, json.loads(body) if body.startswith(b"{") else {}
        finally:
            conn.close()


@pytest.fixture
def controlled(make_proxy: Any, server_loop: ServerLoop) -> Iterator[Any]:
    servers: list[ControlServer] = []

    def start(scenario: str | dict[str, Any] = "rules: []", *, token: str | None = None,
              event_queue: int = 1000) -> Controlled:
        proxy = make_proxy(scenario)
        server = ControlServer(proxy.engine, token=token, event_queue=event_queue)
        port = server_loop.run(server.start("127.0.0.1", 0))
        servers.append(server)
        return Controlled(proxy, server, port, token)

    yield start
    for server in servers:
        server_loop.run(server.stop())


def status_of(url: str) -> int:
    conn = http.client.HTTPConnection(url.removeprefix("http://"), timeout=10)
    try:
        conn.request("GET", "/api/weather?city=oslo")
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


# --- scenario swaps -----------------------------------------------------------------------------------

SWAPS = [
    {"rules": []},
    {"rules": [FLAKY, {"name": "slow", "match": {"path": "/api/*"},
                       "fault": {"type": "latency", "delay_ms": 2}}]},
    {"rules": [{**FLAKY, "probability": 0.5},
               {"name": "slow-reply", "match": {"path": "/api/*"},
                "fault": {"type": "latency", "delay_ms": 1, "phase": "response"}}]},
    {"rules": [{"name": "elsewhere", "match": {"path": "/nowhere"}, "fault": {"type": "reset"}}]},
]


@pytest.mark.slow
async def test_scenario_swaps_mid_traffic_lose_and_fail_nothing_unasked(controlled):
    """Steady traffic while scenarios are swapped: every request is answered, only asked-for faults fail."""
    ctl = controlled(SWAPS[0])
    deadline = time.monotonic() + 1.5
    answers: list[tuple[str, int, bytes]] = []

    async def worker(path: str, method: str = "GET", fresh_connections: bool = False) -> None:
        connector = aiohttp.TCPConnector(force_close=fresh_connections)
        timeout = aiohttp.ClientTimeout(total=10)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as client:
            while time.monotonic() < deadline:
                body = {"query": "swap"} if method == "POST" else None
                async with client.request(method, ctl.proxy.url + path, json=body) as response:
                    answers.append((path, response.status, await response.read()))

    async def swapper() -> int:
        swaps = 0
        while time.monotonic() < deadline:
            await asyncio.to_thread(ctl.control.put_scenario, SWAPS[swaps % len(SWAPS)])
            with pytest.raises(ControlError):  # an invalid one in between changes nothing
                await asyncio.to_thread(ctl.control.put_scenario, "rules: [{name: x, fault: {type: nope}}]")
            swaps += 1
            await asyncio.sleep(0.02)
        return swaps

    *_, swaps = await asyncio.gather(worker("/api/weather?city=oslo"), worker("/api/search", "POST"),
                                     worker("/api/weather?city=lima", fresh_connections=True),
                                     worker("/echo/flaky"), swapper())

    assert swaps >= 10
    by_path = Counter(path for path, _, _ in answers)
    assert min(by_path.values()) >= 20, by_path
    for path, status, body in answers:
        if path.startswith("/api/"):
            assert status == 200, (path, status, body)
            assert json.loads(body)  # a whole JSON document, never a cut one
        else:
            assert status in (200, 503)
    flaky_failures = [body for path, status, body in answers if path == "/echo/flaky" and status == 503]
    # both kinds of scenario were in force
    assert flaky_failures and len(flaky_failures) < by_path["/echo/flaky"]
    assert all(json.loads(body)["error"]["code"] == 503 for body in flaky_failures)

    calls = ctl.proxy.events("call")
    assert len(calls) == len(answers)  # every request reached the proxy and was answered
    assert {call["outcome"] for call in calls} <= {"ok", "fault_response"}
    faults = [f for f in ctl.proxy.events("fault") if f["fault"] == "http_error"]
    assert len(faults) == len(flaky_failures) and {f["rule"] for f in faults} == {"flaky"}


def test_an_invalid_scenario_is_refused_with_file_and_line_and_the_old_stays(controlled):
    ctl = controlled(rule("down", {"type": "http_error", "status": 503}, match={"path": "/api/*"}))
    before = ctl.control.get_scenario()
    bad = ("rules:\n  - name: slow\n    fault:\n      type: latency\n      delay_ms: -5\n"
           "  - name: x\n    fault: {type: nope}\n")
    with pytest.raises(ControlError) as refused:
        ctl.control.put_scenario(bad, source="drill.yaml")
    assert refused.value.status == 400
    problems = refused.value.problems
    assert any(p.startswith("drill.yaml:5: rules[0].fault.delay_ms") for p in problems), problems
    assert any(p.startswith("drill.yaml:7: rules[1].fault") for p in problems), problems

    with pytest.raises(ControlError) as unparsable:
        ctl.control.put_scenario("rules: [unclosed")
    assert re.match(r"request:[12]: invalid YAML", unparsable.value.problems[0])  # libyaml: the end of input

    assert ctl.control.get_scenario() == before
    assert status_of(ctl.proxy.url) == 503  # the old scenario is still the one in force


def test_put_takes_yaml_or_json_and_get_gives_back_what_put_takes(controlled):
    ctl = controlled()
    text = """
    seed: 11
    rules:
      - name: slow
        match: {path: /api/*, header: {X-Tenant: a*}}
        probability: 0.25
        first: 3
        window: {duration_s: 60}
        fault: {type: latency, delay_ms: 10, distribution: lognormal}
      - name: down
        scope: global
        fault: {type: http_error, status: 502}
    """
    text = "\n".join(line.removeprefix("    ") for line in text.splitlines())
    shown = ctl.control.put_scenario(text)
    # the seed shown is the run's, in force since it started (issue 25): a new scenario cannot change it
    assert shown == ctl.control.get_scenario() == {**scenario_json(parse_scenario(text)), "seed": 7}
    assert shown["rules"][0] == {"name": "slow", "match": {"path": "/api/*", "header": {"X-Tenant": "a*"}},
                                 "probability": 0.25, "first": 3, "window": {"duration_s": 60.0},
                                 "fault": {"type": "latency", "delay_ms": 10.0, "distribution": "lognormal"}}
    assert ctl.control.put_scenario(shown) == shown  # JSON in, the same scenario out
    assert ctl.proxy.engine.scenario == parse_scenario(text).model_copy(update={"seed": 7})


# --- rules and state ------------------------------------------------------------------------------------

def test_patch_a_rule_enables_disables_and_changes_probability(controlled):
    ctl = controlled(rule("down", {"type": "http_error", "status": 503}, match={"path": "/api/*"}))
    assert status_of(ctl.proxy.url) == 503

    assert ctl.control.patch_rule("down", enabled=False)["enabled"] is False
    assert status_of(ctl.proxy.url) == 200

    changed = ctl.control.patch_rule("down", enabled=True, probability=0)
    assert changed["probability"] == 0 and "enabled" not in changed  # back to the default: left out
    assert [status_of(ctl.proxy.url) for _ in range(5)] == [200] * 5

    ctl.control.patch_rule("down", probability=1)
    assert status_of(ctl.proxy.url) == 503
    assert ctl.control.get_scenario()["rules"][0]["fault"] == {"type": "http_error", "status": 503}


@pytest.mark.parametrize(("change", "reason"), [
    ({"probability": 1.5}, "down.probability: Input should be less than or equal to 1"),
    ({"enabled": "no"}, "down.enabled: Input should be a valid boolean"),
    ({"status": 500}, "down.status: Extra inputs are not permitted"),
    ({}, None),
])
def test_patch_refuses_bad_changes(controlled, change, reason):
    ctl = controlled(rule("down", {"type": "http_error"}))
    conn = http.client.HTTPConnection("127.0.0.1", ctl.port, timeout=10)
    conn.request("PATCH", "/rules/down", body=json.dumps(change))
    response = conn.getresponse()
    detail = json.loads(response.read())
    conn.close()
    assert response.status == 400
    if reason is not None:
        assert detail["problems"] == [reason]
    assert ctl.proxy.engine.scenario.rules[0].probability == 1 and ctl.proxy.engine.scenario.rules[0].enabled


def test_patch_an_unknown_rule_is_404(controlled):
    ctl = controlled(rule("down", {"type": "http_error"}))
    with pytest.raises(ControlError) as missing:
        ctl.control.patch_rule("nope", enabled=False)
    assert missing.value.status == 404 and "nope" in missing.value.message


def test_reset_starts_counters_over(controlled):
    ctl = controlled(rule("once", {"type": "http_error", "status": 503}, match={"path": "/api/*"}, first=1))
    assert [status_of(ctl.proxy.url) for _ in range(3)] == [503, 200, 200]
    ctl.control.reset()
    assert [status_of(ctl.proxy.url) for _ in range(2)] == [503, 200]


def test_fault_block_adds_a_rule_for_its_duration(controlled):
    ctl = controlled(rule("slow", {"type": "latency", "delay_ms": 1}))
    too_many = {"match": {"path": "/api/*"}, "fault": {"type": "http_error", "status": 429}}
    with ctl.control.fault(too_many) as name:
        assert [r["name"] for r in ctl.control.get_scenario()["rules"]] == [name, "slow"]
        assert status_of(ctl.proxy.url) == 429
        ctl.control.patch_rule("slow", enabled=False)  # a change made inside the block survives it
    assert ctl.control.get_scenario() == {"rules": [{"name": "slow", "enabled": False,
                                                     "fault": {"type": "latency", "delay_ms": 1.0}}]}
    assert status_of(ctl.proxy.url) == 200


# --- events -----------------------------------------------------------------------------------------------

def wait_until(condition: Any, timeout: float = 5) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_events_stream_the_log_live_and_unsubscribe_on_disconnect(controlled):
    ctl = controlled(rule("down", {"type": "http_error", "status": 503}, match={"path": "/api/*"}))
    listeners = len(ctl.proxy.engine.log._listeners)
    with ctl.control.events(["fault"], timeout=5) as faults, ctl.control.events(timeout=5) as everything:
        assert len(ctl.proxy.engine.log._listeners) == listeners + 2
        assert status_of(ctl.proxy.url) == 503
        fault = next(faults)
        assert (fault["event"], fault["rule"], fault["fault"], fault["component"]) == \
            ("fault", "down", "http_error", "transition")
        assert fault["run_id"] == "test" and fault["path"] == "/api/weather" and "ts" in fault
        assert [line["event"] for line in (next(everything), next(everything))] == ["fault", "call"]
        assert status_of(ctl.proxy.url) == 503
        assert next(faults)["match_index"] == 2  # the call line in between was not sent to this one
    wait_until(lambda: len(ctl.proxy.engine.log._listeners) == listeners)
    assert status_of(ctl.proxy.url) == 503  # the proxy goes on without its readers


def test_a_slow_event_reader_loses_lines_and_is_told(controlled, server_loop):
    ctl = controlled(event_queue=2)
    log = ctl.proxy.engine.log

    async def burst() -> None:  # ten lines before the stream's writer gets a turn
        for n in range(10):
            log.error(rule="r", fault="f", error=str(n))

    with ctl.control.events(timeout=5) as events:
        server_loop.run(burst())
        lines = [next(events) for _ in range(3)]
    assert [line.get("error") for line in lines[:2]] == ["0", "1"]
    assert lines[2] == {"event": "dropped", "count": 8}
    families = {f.name: f for f in text_string_to_metric_families(ctl.control.metrics())}
    assert families["chaosproxy_control_events_dropped"].samples[0].value == 8


def test_stopping_the_control_api_ends_open_event_streams(controlled, server_loop):
    ctl = controlled()
    events = ctl.control.events(timeout=5)
    started = time.monotonic()
    server_loop.run(ctl.server.stop())
    assert time.monotonic() - started < 0.9  # not the shutdown timeout
    assert list(events) == []  # a clean end of the stream


# --- metrics ----------------------------------------------------------------------------------------------

def test_metrics_parse_with_the_prometheus_parser_and_count_faults(controlled):
    ctl = controlled(rule("down", {"type": "http_error", "status": 503}, match={"path": "/api/*"}))
    statuses = [status_of(ctl.proxy.url) for _ in range(3)]
    for _ in range(2):
        conn = http.client.HTTPConnection(ctl.proxy.url.removeprefix("http://"), timeout=10)
        conn.request("GET", "/health")
        statuses.append(conn.getresponse().status)
        conn.close()
    assert statuses == [503, 503, 503, 200, 200]

    families = {f.name: f for f in text_string_to_metric_families(ctl.control.metrics())}
    [faults] = [s for s in families["chaosproxy_faults"].samples if s.name == "chaosproxy_faults_total"]
    assert faults.labels == {"fault": "http_error", "component": "transition", "rule": "down"}
    assert faults.value == 3
    calls = {(s.labels["status"], s.labels["outcome"]): s.value
             for s in families["chaosproxy_calls"].samples if s.name == "chaosproxy_calls_total"}
    assert calls == {("503", "fault_response"): 3, ("200", "ok"): 2}
    [count] = [s for s in families["chaosproxy_call_duration_seconds"].samples if s.name.endswith("_count")]
    assert count.value == 5 and count.labels == {"transport": "http"}
    assert families["chaosproxy_active_sessions"].samples[0].value == 1  # one client address
    assert families["chaosproxy_control_event_subscribers"].samples[0].value == 0


def test_each_control_api_counts_only_its_own_proxy(controlled):
    first = controlled(rule("down", {"type": "http_error"}))
    second = controlled()
    status_of(first.proxy.url)
    assert "chaosproxy_faults_total{" in first.control.metrics()
    assert "chaosproxy_faults_total{" not in second.control.metrics()


# --- safety -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("host", "loopback"), [
    ("127.0.0.1", True), ("127.3.2.1", True), ("localhost", True), ("LOCALHOST.", True), ("::1", True),
    ("[::1]", True), ("0.0.0.0", False), ("", False), ("::", False), ("10.0.0.5", False),
    ("192.168.1.20", False), ("proxy.internal", False),
])
def test_what_counts_as_loopback(host, loopback):
    assert is_loopback(host) is loopback


@pytest.mark.parametrize("host", ["0.0.0.0", "", "10.1.2.3", "chaos.internal"])
def test_refuses_to_start_off_loopback_without_a_token(make_proxy, server_loop, host):
    engine = make_proxy().engine
    server = ControlServer(engine)
    with pytest.raises(ControlConfigError, match="--control-token or set CHAOSPROXY_CONTROL_TOKEN"):
        server_loop.run(server.start(host, 0))  # refused before anything is bound
    assert len(engine.log._listeners) == 0


async def test_serve_control_takes_the_token_from_the_environment(make_proxy, monkeypatch):
    engine = make_proxy().engine
    async with serve_control(engine, None, None) as nothing:
        assert nothing is None
    with pytest.raises(ControlConfigError):
        async with serve_control(engine, ("0.0.0.0", 0), None):
            pass
    monkeypatch.setenv("CHAOSPROXY_CONTROL_TOKEN", TOKEN)
    async with serve_control(engine, ("127.0.0.1", 0), None) as server:
        assert server is not None and server.token == TOKEN


async def test_serve_control_explains_a_busy_address(make_proxy):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ControlConfigError, match=f"cannot listen on 127.0.0.1:{port} for the control"):
            async with serve_control(make_proxy().engine, ("127.0.0.1", port), None):
                pass


def test_a_token_is_required_when_given(controlled):
    ctl = controlled(token=TOKEN)
    assert ctl.control.get_scenario() == {"rules": []}  # the client sends it
    status, detail = ctl.get("/scenario")
    assert status == 401 and "bearer token" in detail["error"]
    assert ctl.get("/scenario", {"Authorization": "Bearer wrong"})[0] == 401
    assert ctl.get("/scenario", {"Authorization": TOKEN})[0] == 401
    assert ctl.get("/scenario", {"Authorization": f"Bearer {TOKEN}"})[0] == 200
    assert ctl.get("/healthz") == (200, {"status": "ok"})  # liveness probes need no token
    assert ctl.get("/metrics")[0] == 401
    conn = http.client.HTTPConnection("127.0.0.1", ctl.port, timeout=10)
    conn.request("PUT", "/scenario", body=yaml.safe_dump(rule("x", {"type": "reset"})))
    assert conn.getresponse().status == 401
    conn.close()
    assert ctl.proxy.engine.scenario.rules == []


@pytest.mark.parametrize("headers", [
    {"User-Agent": "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 Chrome/126.0 Safari/537.36"},
    {"Origin": "https://evil.example"},
    {"Origin": "null"},
    {"Host": "evil.example:8801"},  # DNS rebinding: a page's own name resolved to 127.0.0.1
])
def test_browsers_and_cross_site_requests_are_refused(controlled, headers):
    ctl = controlled(token=TOKEN)
    status, detail = ctl.get("/scenario", {"Authorization": f"Bearer {TOKEN}", **headers})
    assert status == 403, detail
    assert ctl.get("/healthz", headers)[0] == 403


def test_same_origin_and_loopback_names_are_fine(controlled):
    ctl = controlled()
    assert ctl.get("/version", {"Origin": f"http://127.0.0.1:{ctl.port}"})[0] == 200
    assert ctl.get("/version", {"Host": f"localhost:{ctl.port}"})[0] == 200
    version = ctl.control.version()
    assert version["run_id"] == "test" and version["seed"] == 7


def test_routes_are_fixed_alike_for_put_and_reload(controlled, server_loop: ServerLoop, upstream: str,
                                                   tmp_path: Path):
    start = {"routes": {"/tools": upstream}, "rules": [FLAKY]}
    ctl = controlled(start)
    assert ctl.control.put_scenario({"rules": []})["routes"] == start["routes"]  # left out: they stay
    assert ctl.control.get_scenario()["routes"] == start["routes"]
    assert ctl.control.put_scenario(start)["rules"][0]["name"] == "flaky"  # the original goes back in
    moved = {**start, "routes": {"/tools": "http://127.0.0.1:9"}}
    with pytest.raises(ControlError) as refused:
        ctl.control.put_scenario(moved)
    assert refused.value.status == 400 and "routes are fixed when the proxy starts" in refused.value.problems[0]
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(moved))
    assert not server_loop.run(reload_scenario(ctl.proxy.engine, path))
    path.write_text(yaml.safe_dump({"rules": []}))
    assert server_loop.run(reload_scenario(ctl.proxy.engine, path))
    assert ctl.control.get_scenario() == {"routes": start["routes"], "rules": []}
    conn = http.client.HTTPConnection(ctl.proxy.url.removeprefix("http://"), timeout=10)
    conn.request("GET", "/tools/api/weather?city=oslo")  # traffic follows the routes shown
    assert conn.getresponse().status == 200
    conn.close()


def test_events_readers_are_capped(controlled):
    ctl = controlled()
    ctl.server.max_subscribers = 2
    readers = [socket.create_connection(("127.0.0.1", ctl.port)) for _ in range(2)]
    try:
        for reader in readers:
            reader.sendall(b"GET /events HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            assert reader.recv(100).startswith(b"HTTP/1.1 200")
        status, body = ctl.get("/events")
        assert status == 503 and "2 clients already read /events" in body["error"]
    finally:
        for reader in readers:
            reader.close()
    deadline = time.monotonic() + 5
    while ctl.server._streams and time.monotonic() < deadline:
        time.sleep(0.02)
    assert ctl.get("/healthz")[0] == 200 and not ctl.server._streams


@pytest.mark.slow
def test_the_token_comes_from_a_file_and_stays_out_of_ps(upstream: str, tmp_path: Path):
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    port, control = free_port(), free_port()
    proc = subprocess.Popen([sys.executable, "-m", "chaosproxy", "run", "--upstream", upstream, "--listen",
                             f"127.0.0.1:{port}", "--control", f"127.0.0.1:{control}", "--control-token-file",
                             str(token_file)], stderr=subprocess.PIPE)
    try:
        wait_listening(control, proc)
        assert TOKEN not in Path(f"/proc/{proc.pid}/cmdline").read_bytes().decode()
        with pytest.raises(ControlError) as refused:
            ControlClient(f"http://127.0.0.1:{control}", token="").get_scenario()
        assert refused.value.status == 401
        assert ControlClient(f"http://127.0.0.1:{control}", token=TOKEN).get_scenario() == {"rules": []}
    finally:
        proc.terminate()
        proc.wait(10)
    empty = tmp_path / "empty"
    empty.write_text("\n")
    done = subprocess.run([sys.executable, "-m", "chaosproxy", "run", "--upstream", upstream, "--control",
                           "127.0.0.1:0", "--control-token-file", str(empty)], capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 2 and "is empty" in done.stderr


def test_series_of_a_removed_rule_leave_the_metrics(controlled):
    ctl = controlled()
    names = []
    for _ in range(3):  # each block adds a rule under a new made-up name, as drills do
        with ctl.control.fault({"match": {"path": "/api/*"}, "fault": {"type": "http_error", "status": 503}}) as name:
            assert status_of(ctl.proxy.url) == 503
            assert f'rule="{name}"' in ctl.control.metrics()
            names.append(name)
    text = ctl.control.metrics()
    assert not any(f'rule="{name}"' in text for name in names), text
    with ctl.control.fault({"name": "kept", "fault": {"type": "http_error", "status": 503}}):
        assert status_of(ctl.proxy.url) == 503
        ctl.control.patch_rule("kept", probability=0.5)  # a rule still in the scenario keeps its series
        assert 'rule="kept"' in ctl.control.metrics()


def test_events_refuses_an_unknown_event_kind(controlled):
    ctl = controlled()
    status, body = ctl.get("/events?event=bogus")
    assert status == 400 and "'bogus'" in body["error"] and "fault" in body["error"]
