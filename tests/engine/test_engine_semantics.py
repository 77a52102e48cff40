"""Engine semantics on real sockets: counts that agree (log, /metrics, /stats), rule order as written,
sessions numbered when first seen, notifications that use up no gate, global counters apart from
sessions, and agents that name themselves (X-Chaosproxy-Agent) meeting the same faults however their
requests interleave, over plain HTTP, MCP (both eras) and the model API."""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import io
import itertools
import json
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mcp import Client
from mcp.client.sse import sse_client
from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client
from mcp.shared.exceptions import MCPError
from prometheus_client.parser import text_string_to_metric_families

from chaosproxy.adapters.http import HttpProxy
from chaosproxy.control.api import ControlServer
from chaosproxy.engine.core import Engine
from chaosproxy.engine.scenario import parse_scenario
from chaosproxy.engine.sessions import AGENT_HEADER
from chaosproxy.records.logfile import read_sessions
from chaosproxy.telemetry.log import PerturbationLog
from tests.helpers.llm_support import CHAT_TOOLS, PROMPT, ScriptedLlm, llm  # noqa: F401
from tests.helpers.support import ServerLoop, call_lines, free_port, http_exchange, log_events, wait_listening

DOWN = {"type": "http_error", "status": 503}
LOG_NUMBERS = itertools.count()  # each proxy's log file its own, however many a test starts


class Harness:
    """A proxy with its control API, in this process; requests to it over real sockets."""

    def __init__(self, url: str, engine: Engine, control_port: int, log_path: Path) -> None:
        self.url = url
        self.engine = engine
        self.control_port = control_port
        self.log_path = log_path

    def request(self, method: str, path: str, *, headers: dict[str, str] | None = None,
                body: bytes | None = None) -> tuple[int, bytes]:
        return http_exchange(self.url.removeprefix("http://"), method, path, headers=headers, body=body)

    def control(self, path: str, method: str = "GET") -> bytes:
        return http_exchange(f"127.0.0.1:{self.control_port}", method, path)[1]

    def stats(self) -> dict[str, Any]:
        return json.loads(self.control("/stats"))

    def events(self, kind: str) -> list[dict[str, Any]]:
        return log_events(self.log_path, kind)

    def counts(self) -> dict[str, dict[str, Any]]:
        """Per rule: faults in the log, in /metrics, and /stats' matched and fired."""
        self.engine.log.flush()
        logged = Counter(line["rule"] for line in self.events("fault"))
        metrics: Counter[str] = Counter()
        for family in text_string_to_metric_families(self.control("/metrics").decode()):
            for sample in family.samples:
                if sample.name == "chaosproxy_faults_total":
                    metrics[sample.labels["rule"]] += int(sample.value)
        stats = self.stats()
        assert stats["faults"] == sum(logged.values())
        return {rule["name"]: {"log": logged[rule["name"]], "metrics": metrics[rule["name"]],
                               "matched": rule["matched"], "fired": rule["fired"]} for rule in stats["rules"]}


@pytest.fixture
def harness(server_loop: ServerLoop, upstream: str, tmp_path: Path) -> Iterator[Any]:
    """Start a proxy (scenario dict, seed, Engine options such as max_sessions) with its control API."""
    with contextlib.ExitStack() as stack:
        def start(scenario: dict[str, Any], *, seed: int = 7, to: str | None = None, **options: Any) -> Harness:
            return stack.enter_context(running(server_loop, scenario, to or upstream, tmp_path, seed, **options))
        yield start


@contextlib.contextmanager
def running(server_loop: ServerLoop, scenario: dict[str, Any], upstream: str, folder: Path, seed: int = 7,
            **options: Any) -> Iterator[Harness]:
    log_path = folder / f"log-{next(LOG_NUMBERS)}.jsonl"
    log = PerturbationLog(io.FileIO(log_path, "w"), run_id="t", seed=seed)
    engine = Engine(parse_scenario(yaml.safe_dump(scenario)), seed=seed, log=log, **options)
    proxy = HttpProxy(engine, engine.scenario.routes or upstream)
    port = server_loop.run(proxy.start("127.0.0.1", 0))
    control = ControlServer(engine)
    control_port = server_loop.run(control.start("127.0.0.1", 0))
    try:
        yield Harness(f"http://127.0.0.1:{port}", engine, control_port, log_path)
    finally:
        server_loop.run(control.stop())
        server_loop.run(proxy.stop())
        log.close()


def rules(*entries: dict[str, Any]) -> dict[str, Any]:
    return {"rules": list(entries)}


def rpc(method: str, rpc_id: int | None = None, **params: Any) -> bytes:
    message: dict[str, Any] = {"jsonrpc": "2.0", "method": method, "params": params}
    if rpc_id is not None:
        message["id"] = rpc_id
    return json.dumps(message).encode()


# --- counts -----------------------------------------------------------------------------------------------

def test_stats_keep_the_counts_of_sessions_that_ended_or_were_evicted(harness):
    h = harness(rules({"name": "down", "match": {"path": "/api/*"}, "first": 1, "fault": DOWN}), max_sessions=5)
    for n in range(20):
        assert h.request("GET", "/api/weather?city=oslo", headers={"Mcp-Session-Id": f"s{n}"})[0] == 503
        if n % 2:  # every other session ends itself; the others are evicted past the cap of 5
            assert h.request("DELETE", "/echo/bye", headers={"Mcp-Session-Id": f"s{n}"})[0] == 200
    assert h.counts() == {"down": {"log": 20, "metrics": 20, "matched": 20, "fired": 20}}
    assert h.stats()["active_sessions"] <= 5


def test_a_reset_restarts_the_gates_and_keeps_the_totals(harness):
    h = harness(rules({"name": "once", "match": {"path": "/api/*"}, "first": 1, "fault": DOWN}))
    assert [h.request("GET", "/api/weather?city=oslo")[0] for _ in range(2)] == [503, 200]
    h.control("/reset", "POST")
    assert [h.request("GET", "/api/weather?city=oslo")[0] for _ in range(2)] == [503, 200]
    assert h.counts() == {"once": {"log": 2, "metrics": 2, "matched": 4, "fired": 2}}


async def test_a_renamed_tool_counts_each_fault_line_once_over_mcp(harness, mcp_http):
    h = harness(rules({"name": "renamed", "fault": {"type": "rename_tool", "tool": "weather", "to": "forecast"}}),
                to=mcp_http)
    async with Client(h.url + "/mcp", mode="legacy") as session:
        assert "forecast" in {tool.name for tool in (await session.list_tools()).tools}
        for city in ("Lima", "Oslo", "Rome"):
            assert not (await session.call_tool("forecast", {"city": city})).is_error
    # one tools/list renamed, three calls routed back: four times the agent got what upstream did not send
    assert h.counts() == {"renamed": {"log": 4, "metrics": 4, "matched": 4, "fired": 4}}


def test_a_tool_list_resent_each_turn_is_counted_each_turn_on_the_model_api(harness, llm: ScriptedLlm):
    h = harness(rules({"name": "renamed", "fault": {"type": "rename_tool", "tool": "get_weather", "to": "wx"}}),
                to=llm.url)
    agent = openai.OpenAI(base_url=h.url + "/v1", api_key="sk-test", max_retries=0)
    messages: list[dict[str, Any]] = [{"role": "user", "content": PROMPT}]
    for _ in range(2):
        reply = agent.chat.completions.create(model="gpt-test", messages=messages, tools=CHAT_TOOLS)
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True, exclude={"parsed"}))
        messages += [{"role": "tool", "tool_call_id": call.id, "content": "14 degrees"}
                     for call in message.tool_calls or []]
    [counts] = h.counts().values()
    assert counts["log"] >= 2 and counts["log"] == counts["metrics"] == counts["fired"] <= counts["matched"]


# --- order ------------------------------------------------------------------------------------------------

def test_rules_on_messages_and_on_the_wire_apply_in_the_order_written(harness, mcp_http):
    h = harness(rules({"name": "call-fails", "match": {"method": "tools/call"},
                       "fault": {"type": "rpc_error", "code": -32000, "message": "no"}},
                      {"name": "mcp-down", "match": {"path": "/mcp"}, "fault": DOWN}), to=mcp_http)
    headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
    status, body = h.request("POST", "/mcp", headers=headers, body=rpc("tools/call", 1, name="weather",
                                                                         arguments={"city": "Lima"}))
    assert (status, json.loads(body)["error"]["code"]) == (200, -32000)  # the first rule, which ends it
    assert h.request("POST", "/mcp", headers=headers, body=rpc("tools/list", 2))[0] == 503  # only the second
    assert {name: (c["matched"], c["fired"]) for name, c in h.counts().items()} == {
        "call-fails": (1, 1), "mcp-down": (1, 1)}


def test_validate_warns_where_the_order_written_is_not_the_order_applied(tmp_path: Path):
    scenario = tmp_path / "s.yaml"
    scenario.write_text("rules:\n"
                        "  - name: typos-in-prompts\n"
                        "    fault: {type: prompt_typos}\n"
                        "  - name: model-down\n"
                        "    match: {path: /v1/*}\n"
                        "    fault: {type: llm_error}\n"
                        "  - name: mcp-only\n"
                        "    match: {method: tools/call}\n"
                        "    fault: {type: http_error}\n")
    done = subprocess.run([sys.executable, "-m", "chaosproxy", "validate", str(scenario)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    warnings = done.stderr.strip().splitlines()
    assert len(warnings) == 1, done.stderr
    assert warnings[0].startswith(f"{scenario}:4: rules[1]: warning: ") and "typos-in-prompts" in warnings[0]


# --- numbering, gates, global counters --------------------------------------------------------------------

def test_an_unrelated_rule_changes_no_other_rules_draws(server_loop, upstream, tmp_path):
    flaky = {"name": "search-flaky", "match": {"path": "/api/search"}, "probability": 0.5, "fault": DOWN}
    slow = {"name": "weather-slow", "match": {"path": "/api/weather"}, "fault": {"type": "latency", "delay_ms": 1}}

    def statuses(scenario: dict[str, Any]) -> dict[str, list[int]]:
        seen: dict[str, list[int]] = {"a": [], "b": []}
        with running(server_loop, scenario, upstream, tmp_path) as h:
            h.request("GET", "/api/weather?city=oslo", headers={"Mcp-Session-Id": "a"})  # a is seen first
            for _ in range(16):
                for name in ("b", "a"):  # b's search comes first
                    seen[name].append(h.request("POST", "/api/search", body=b'{"query": "x"}',
                                                headers={"Mcp-Session-Id": name})[0])
        return seen

    alone = statuses(rules(flaky))
    assert alone == statuses(rules(flaky, slow)) == statuses(rules(slow, flaky))
    assert alone["a"] != alone["b"]


@pytest.mark.parametrize("gate", [{"every": 2}, {"after": 1}])
@pytest.mark.parametrize("fault", [{"type": "rpc_error", "code": -32000}, {"type": "timeout"}])
def test_notifications_use_up_no_gate_of_a_fault_that_cannot_change_them(harness, gate, fault):
    h = harness(rules({"name": "r", "match": {"path": "/echo/*"}, "fault": fault, **gate}))
    headers = {"Content-Type": "application/json"}
    first = h.request("POST", "/echo/mcp", headers=headers, body=rpc("tools/list", 1))[1]
    h.request("POST", "/echo/mcp", headers=headers, body=rpc("notifications/initialized"))
    second = h.request("POST", "/echo/mcp", headers=headers, body=rpc("tools/list", 2))[1]
    assert "error" not in json.loads(first)  # upstream's echo
    assert json.loads(second)["error"]["code"] in (-32000, -32001)  # the second request: its gate opens
    assert h.counts()["r"] == {"log": 1, "metrics": 1, "matched": 2, "fired": 1}


def test_a_session_named_star_leaves_global_counters_alone(harness):
    h = harness(rules({"name": "twice", "scope": "global", "first": 2, "match": {"http_method": "GET"},
                       "fault": DOWN}))
    star = {"Mcp-Session-Id": "*"}
    assert [h.request("GET", "/echo/x", headers=star)[0] for _ in range(3)] == [503, 503, 200]
    assert h.request("DELETE", "/echo/x", headers=star)[0] == 200  # the session named * ends
    assert [h.request("GET", "/echo/x", headers=other)[0] for other in ({}, star)] == [200, 200]


# --- agents that name themselves -------------------------------------------------------------------------

def test_agents_that_name_themselves_meet_the_same_faults_in_any_order(harness):
    scenario = rules({"name": "flaky", "match": {"path": "/api/*"}, "probability": 0.5, "fault": DOWN})

    def run(order: str) -> dict[str, list[int]]:
        h = harness(scenario)
        seen: dict[str, list[int]] = {"alpha": [], "beta": []}
        for name in order:
            agent = {"a": "alpha", "b": "beta"}[name]
            seen[agent].append(h.request("GET", "/api/weather?city=oslo", headers={AGENT_HEADER: agent})[0])
        return seen

    first = run("a" * 12 + "b" * 12)
    assert first == run("b" * 12 + "a" * 12) == run("ab" * 12) == run("abba" * 6)
    assert first["alpha"] != first["beta"] and {503, 200} <= set(first["alpha"])


def test_sessions_show_the_agent_and_the_name_their_draws_are_keyed_by(harness):
    h = harness(rules({"name": "slow", "match": {"path": "/api/*"}, "fault": {"type": "latency", "delay_ms": 1}}))
    h.request("GET", "/health", headers={AGENT_HEADER: "alpha"})  # no rule matches it: seen all the same
    h.request("GET", "/api/weather?city=oslo", headers={AGENT_HEADER: "alpha", "Mcp-Session-Id": "s1"})
    h.request("GET", "/api/weather?city=oslo")
    shown = {(entry["session"], entry["agent"], entry["draws"])
             for entry in json.loads(h.control("/sessions"))["sessions"]}
    assert shown == {("alpha", "alpha", "alpha#1"), ("s1", "alpha", "alpha#2"), ("127.0.0.1", None, "3")}


def test_an_agent_name_that_is_not_a_token_is_ignored(harness):
    h = harness(rules({"name": "once", "first": 1, "match": {"path": "/api/*"}, "fault": DOWN}))
    for bad in ("x" * 200, "two words", "quote\"d"):
        h.request("GET", "/api/weather?city=oslo", headers={AGENT_HEADER: bad})
    assert {line["session"] for line in call_lines(h, 3)} == {"127.0.0.1"}


MCP_FLAKY = rules({"name": "flaky", "match": {"tool": "weather"}, "probability": 0.5,
                   "fault": {"type": "rpc_error", "code": -32000, "message": "flaky"}})


async def weather_errors(url: str, agent: str, mode: str, calls: int, step: asyncio.Event | None = None,
                         turn: asyncio.Event | None = None) -> list[bool]:
    """Which of an agent's weather calls failed; with `step`/`turn`, it takes turns with another agent."""
    headers = {AGENT_HEADER: agent}
    target = sse_client(url, headers=headers) if url.endswith("/sse") else \
        streamable_http_client(url, http_client=create_mcp_http_client(headers=headers))
    failed = []
    async with Client(target, mode=mode) as session:
        for _ in range(calls):
            if turn is not None:
                await turn.wait()
                turn.clear()
            try:
                await session.call_tool("weather", {"city": "Lima"})
                failed.append(False)
            except MCPError as error:
                assert error.error.code == -32000
                failed.append(True)
            if step is not None:
                step.set()
    return failed


@pytest.mark.parametrize("server,path,mode", [("mcp_http", "/mcp", "auto"), ("mcp_http", "/mcp", "legacy"),
                                              ("mcp_sse", "/sse", "legacy")],
                         ids=["stateless-era", "handshake-era", "legacy-sse"])
async def test_mcp_agents_that_name_themselves_meet_the_same_faults_in_any_order(request, harness, server, path,
                                                                                mode):
    base = request.getfixturevalue(server)

    async def one_after_the_other(first: str, second: str) -> dict[str, list[bool]]:
        url = harness(MCP_FLAKY, to=base).url + path
        return {first: await weather_errors(url, first, mode, 10), second: await weather_errors(url, second, mode, 10)}

    async def taking_turns() -> dict[str, list[bool]]:
        url = harness(MCP_FLAKY, to=base).url + path
        alpha_done, beta_done = asyncio.Event(), asyncio.Event()
        beta_done.set()
        alpha, beta = await asyncio.gather(weather_errors(url, "alpha", mode, 10, alpha_done, beta_done),
                                           weather_errors(url, "beta", mode, 10, beta_done, alpha_done))
        return {"alpha": alpha, "beta": beta}

    async def at_once() -> dict[str, list[bool]]:
        url = harness(MCP_FLAKY, to=base).url + path
        alpha, beta = await asyncio.gather(weather_errors(url, "alpha", mode, 10),
                                           weather_errors(url, "beta", mode, 10))
        return {"alpha": alpha, "beta": beta}

    first = await one_after_the_other("alpha", "beta")
    assert first == await one_after_the_other("beta", "alpha") == await taking_turns() == await at_once()
    assert first["alpha"] != first["beta"]


def test_model_api_agents_that_name_themselves_meet_the_same_faults_in_any_order(harness, llm: ScriptedLlm):
    scenario = rules({"name": "flaky", "match": {"api": "openai-chat"}, "probability": 0.5,
                      "fault": {"type": "llm_error", "kind": "overloaded"}})

    def turns(url: str, agent: str, count: int) -> list[int]:
        client = openai.OpenAI(base_url=url + "/v1", api_key="sk-test", max_retries=0,
                               default_headers={AGENT_HEADER: agent})
        outcomes = []
        for n in range(count):
            try:
                client.chat.completions.create(model="gpt-test", messages=[{"role": "user", "content": f"hi {n}"}])
                outcomes.append(200)
            except openai.APIStatusError as error:
                outcomes.append(error.status_code)
        return outcomes

    def run(order: list[str]) -> dict[str, list[int]]:
        url = harness(scenario, to=llm.url).url
        seen: dict[str, list[int]] = {"alpha": [], "beta": []}
        for agent in order:
            seen[agent] += turns(url, agent, 1)
        return seen

    first = run(["alpha"] * 10 + ["beta"] * 10)
    assert first == run(["beta"] * 10 + ["alpha"] * 10) == run(["alpha", "beta"] * 10)
    assert first["alpha"] != first["beta"]


def test_run_warns_once_when_concurrent_clients_share_a_session(upstream: str, tmp_path: Path):
    scenario = tmp_path / "s.yaml"
    scenario.write_text(yaml.safe_dump(rules({"name": "slow", "match": {"path": "/api/*"},
                                              "fault": {"type": "latency", "delay_ms": 100}})))

    def proxy_stderr(headers_of: Any) -> str:
        port = free_port()
        proc = subprocess.Popen([sys.executable, "-m", "chaosproxy", "run", "--upstream", upstream, "--scenario",
                                 str(scenario), "--listen", f"127.0.0.1:{port}", "--log", str(tmp_path / "l.jsonl")],
                                stderr=subprocess.PIPE, text=True)
        try:
            wait_listening(port, proc)

            def agent(n: int) -> None:
                for _ in range(4):
                    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
                    conn.request("GET", "/api/weather?city=oslo", headers=headers_of(n))
                    assert conn.getresponse().status == 200
                    conn.close()

            threads = [threading.Thread(target=agent, args=(n,)) for n in range(3)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(30)
        finally:
            proc.terminate()
            _, stderr = proc.communicate(timeout=10)
        return stderr

    shared = proxy_stderr(lambda n: {})
    assert shared.count("were under way at once") == 1, shared
    assert "X-Chaosproxy-Agent" in shared
    named = proxy_stderr(lambda n: {AGENT_HEADER: f"agent-{n}"})
    assert "were under way at once" not in named, named


# --- the property: named agents meet the same faults in every interleaving, and every count agrees --------

AGENTS = ("alpha", "beta", "gamma")
REQUESTS = {"weather": ("GET", "/api/weather?city=oslo", None), "search": ("POST", "/api/search", b'{"query": "q"}'),
            "echo": ("GET", "/echo/a", None), "health": ("GET", "/health", None)}

# Rules an agent sees (each its own status), with per-session gates, in front of unrelated ones: rules
# that fire without changing what the agent gets (latency), on paths no agent asks for, or on a header
# no agent sends. Adding, or interleaving, the latter may change no agent's faults.
SEEN_RULES = st.lists(st.fixed_dictionaries({
    "match": st.sampled_from([{"path": "/api/*"}, {"path": "/api/search"}, {"path": "/echo/*"},
                              {"http_method": "GET"}]),
    "probability": st.sampled_from([0.3, 0.5, 1.0]),
    "after": st.integers(0, 2), "every": st.integers(1, 3), "first": st.sampled_from([None, 1, 3]),
}), min_size=1, max_size=3)
UNRELATED_RULES = st.lists(st.sampled_from([
    {"match": {"path": "/api/weather"}, "fault": {"type": "latency", "delay_ms": 1}},
    {"match": {"path": "/health"}, "probability": 0.5, "fault": {"type": "latency", "delay_ms": 1}},
    {"match": {"path": "/never/*"}, "fault": DOWN},
    {"match": {"header": {"x-never": "*"}}, "fault": DOWN},
]), min_size=1, max_size=3)


def seen_rule(i: int, gates: dict[str, Any]) -> dict[str, Any]:
    return {"name": f"seen{i}", **{key: value for key, value in gates.items() if value is not None},
            "fault": {"type": "http_error", "status": 500 + i}}


@st.composite
def agents_rules_and_orders(draw: st.DrawFn) -> dict[str, Any]:
    """Named agents with their requests, seen rules, unrelated rules mixed in among them, and an interleaving."""
    agents = {name: draw(st.lists(st.sampled_from(sorted(REQUESTS)), min_size=1, max_size=8))
              for name in AGENTS[:draw(st.integers(2, 3))]}
    seen = [seen_rule(i, gates) for i, gates in enumerate(draw(SEEN_RULES))]
    mixed = list(seen)
    for i, unrelated in enumerate(draw(UNRELATED_RULES)):
        mixed.insert(draw(st.integers(0, len(mixed))), {"name": f"unrelated{i}", **unrelated})
    turns = [name for name, requests in agents.items() for _ in requests]
    return {"agents": agents, "seen": seen, "mixed": mixed, "order": draw(st.permutations(turns)),
            "seed": draw(st.integers(0, 2**32 - 1))}


def play(h: Harness, agents: dict[str, list[str]], order: list[str] | None) -> dict[str, list[int]]:
    """Each agent's requests, one at a time in `order` (agents by name), or all agents at once (None)."""
    seen: dict[str, list[int]] = {name: [] for name in agents}

    def send(name: str, step: int) -> None:
        method, path, body = REQUESTS[agents[name][step]]
        seen[name].append(h.request(method, path, body=body, headers={AGENT_HEADER: name})[0])

    if order is not None:
        for name in order:
            send(name, len(seen[name]))
        return seen
    def agent(name: str) -> None:
        for step in range(len(agents[name])):
            send(name, step)

    threads = [threading.Thread(target=agent, args=(name,)) for name in agents]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return seen


def assert_counts_agree(h: Harness, seen: dict[str, list[int]]) -> None:
    """The log, /metrics, /stats and the report count the same faults, and each agent met its own."""
    for rule, counts in h.counts().items():
        assert counts["log"] == counts["metrics"] == counts["fired"] <= counts["matched"], rule
    faults = h.events("fault")
    for session in read_sessions(h.log_path):
        assert Counter(f.rule for f in session.faults) == Counter(
            line["rule"] for line in faults if line["session"] == session.session)
    for name, statuses in seen.items():
        met = sorted(line["effect"]["status"] for line in faults
                     if line["session"] == name and line["rule"].startswith("seen"))
        assert met == sorted(status for status in statuses if status != 200), name


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(drill=agents_rules_and_orders())
def test_named_agents_meet_the_same_faults_in_every_interleaving_and_counts_agree(
        server_loop: ServerLoop, upstream: str, tmp_path: Path, drill: dict[str, Any]) -> None:
    agents, seed = drill["agents"], drill["seed"]
    runs = []
    for scenario_rules, order in ((drill["seen"], [name for name in agents for _ in agents[name]]),
                                  (drill["mixed"], drill["order"]), (drill["seen"], None)):
        with running(server_loop, {"rules": scenario_rules}, upstream, tmp_path, seed) as h:
            seen = play(h, agents, order)
            assert_counts_agree(h, seen)
        runs.append(seen)
    assert runs[0] == runs[1] == runs[2]
