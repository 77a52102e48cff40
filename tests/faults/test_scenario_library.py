"""The scenario library: scenarios/<component>/*.yaml, and the drill suites built from it.

Every library scenario is valid (`chaosproxy validate`), is filed under the component of its faults,
says what it reproduces, and fires through a real proxy in front of a real MCP server. A scripted
session of the MCP Python SDK client (1 s read timeout, so a hang costs a second) lists the tools
(every page), calls up to six listed tools three times with arguments made from their input schemas,
listing again after each round, session after session, until every rule of the scenario has fired and
the client has seen something a clean run does not (or a budget of 12 sessions / 60 s runs out). Each
scenario runs in both protocol eras of the client unless its fault needs one (NEEDS). Every fault line
must carry the scenario's folder as its component, and no fault may fail open with an error.

Time values are scaled down here, not in the library: the delays, timeouts and hang releases of a
scenario are multiplied by TIME_SCALE (1/20) before it is loaded (the 5 s timeout becomes 250 ms, the
800 ms median latency 40 ms), so that the whole library runs in about 20 s. Nothing else is changed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from chaosproxy.drill.suite import Choice, Range, load_suite
from chaosproxy.engine.scenario import load_scenario
from tests.helpers.mcp_support import client, dump, serve
from tests.peers import peers

ROOT = Path(__file__).resolve().parents[2]
LIBRARY = ROOT / "scenarios"
COMPONENTS = ("observation", "action", "reward", "transition")
SCENARIOS = sorted(path for component in COMPONENTS for path in (LIBRARY / component).glob("*.yaml"))
SUITES = LIBRARY / "suites"

# The RobustBench-TC perturbation types (arXiv 2605.11928) a tool proxy can inject, by library file.
# Out of reach: query_paraphrase, and realistic_typos on the prompt (applied to results instead).
ROBUSTBENCH_TC = {
    "action/same_name_A": "same_name_A", "action/same_name_B": "same_name_B",
    "action/same_name_C": "same_name_C", "action/same_name_D": "same_name_D",
    "action/same_name_E": "same_name_E", "action/redundant": "redundant",
    "reward/CD": "CD", "reward/TD": "TD", "reward/CD_NT": "CD_NT", "reward/TD_NT": "TD_NT",
    "reward/CD_AB": "CD_AB", "reward/TD_AB": "TD_AB",
    "reward/paraphrase_tool_description": "paraphrase_tool_description",
    "reward/paraphrase_parameter_description": "paraphrase_parameter_description",
    "transition/timeout": "timeout", "transition/rate_limit": "rate_limit",
    "transition/auth_error": "auth_error", "transition/server_error": "server_error",
    "transition/malformed_response": "malformed_response", "transition/schema_drift": "schema_drift",
    "observation/realistic_typos": "realistic_typos",
}
# The real-world faults the library must carry besides, by the fault type that injects them.
REAL_WORLD = {
    "transition/hang": "hang", "transition/session_expire": "session_expire",
    "transition/stream_cut": "stream_cut", "transition/rpc_error": "rpc_error",
    "observation/oversize": "oversize", "observation/prompt_injection": "inject_text",
    "observation/noise": "noise", "observation/truncate_text": "truncate_text",
    "observation/wrong_data": "wrong_data", "action/rug_pull": "remove_tool",
    "action/tool_flood": "tool_flood", "action/rename_tool": "rename_tool",
    "action/unknown_tool": "unknown_tool", "reward/flip_is_error": "flip_is_error",
    "reward/error_in_success": "error_in_success", "reward/poison_description": "poison_description",
}

TIME_SCALE = 0.05
TIME_KEYS = {"latency": ("delay_ms", "jitter_ms", "max_ms"), "slow_body": ("delay_ms",),
             "hang": ("release_after_ms",), "timeout": ("after_ms",)}
TIMING_ONLY = {"latency", "slow_body"}  # their effect is time alone: nothing to compare with a clean run

READ_TIMEOUT = 1.0  # the client's: a hang or a cut stream costs one second, not forever
SESSION_BUDGET = 20.0
SCENARIO_BUDGET = 60.0
MAX_SESSIONS = 12
ROUNDS, CALLS_PER_ROUND = 3, 6
WORDS = ("Oslo", "Paris", "Lima")  # string arguments per round: results differ, so a stale replay shows


def key(path: Path) -> str:
    return f"{path.parent.name}/{path.stem}"


def scenario_data(path: Path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


ERAS = ("auto", "legacy")  # the SDK client's protocol eras: 2026-07-28 (stateless) and handshake (sessions)


@dataclass(frozen=True)
class Needs:
    """What a scenario's fault needs from the session that should meet it."""

    eras: tuple[str, ...] = ERAS  # each scenario runs once per era it can act in
    server: str = "bundled"  # or "everything": the reference server, whose parameters have descriptions
    calls: bool = True


NEEDS = {
    # 404 on an unknown Mcp-Session-Id: only handshake-era sessions have one.
    "transition/session_expire": Needs(eras=("legacy",)),
    # An SSE reply to cut: the bundled server streams its replies to POSTs in the handshake era only
    # (in the 2026-07-28 era it answers with plain JSON, and the fault rightly declines).
    "transition/stream_cut": Needs(eras=("legacy",)),
    # The bundled server's parameters carry no descriptions, so there is nothing to reword there: the
    # reference server (server-everything) has them. Its tools are not called (some are long-running).
    "reward/paraphrase_parameter_description": Needs(eras=("legacy",), server="everything", calls=False),
}
RUNS = [pytest.param(path, era, id=f"{key(path)}-{era}")
        for path in SCENARIOS for era in NEEDS.get(key(path), Needs()).eras]


# Static checks


def test_the_library_has_a_scenario_per_benchmark_type_and_per_real_world_fault():
    present = {key(path) for path in SCENARIOS}
    assert set(ROBUSTBENCH_TC) <= present
    assert set(REAL_WORLD) <= present
    for name, fault in REAL_WORLD.items():
        types = {rule["fault"]["type"] for rule in scenario_data(LIBRARY / f"{name}.yaml")["rules"]}
        assert fault in types, name


@pytest.mark.parametrize("path", SCENARIOS, ids=key)
def test_each_scenario_says_what_it_is_and_is_filed_under_its_faults_component(path: Path):
    text = path.read_text(encoding="utf-8")
    header = "\n".join(line for line in text.splitlines() if line.startswith("#"))
    assert header.startswith(f"# Component: {path.parent.name}."), "the header names the component first"
    assert "Reproduces:" in header and "Grounding:" in header
    if (benchmark := ROBUSTBENCH_TC.get(key(path))) is not None:
        assert f"RobustBench-TC: {benchmark}" in header
    scenario = load_scenario(path)
    assert scenario.description and scenario.rules
    for rule in scenario.rules:
        assert rule.fault.component == path.parent.name, (rule.name, rule.fault.type)


def test_rule_names_are_unique_across_the_library():
    names = [rule.name for path in SCENARIOS for rule in load_scenario(path).rules]
    assert len(names) == len(set(names))


def test_chaosproxy_validate_accepts_every_library_scenario():
    proc = subprocess.run([sys.executable, "-m", "chaosproxy", "validate", *map(str, SCENARIOS)],
                          check=False, capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert len([line for line in proc.stdout.splitlines() if ": ok (" in line]) == len(SCENARIOS)


def test_chaosproxy_validate_accepts_the_whole_tree_suites_included():
    files = sorted(str(path.relative_to(ROOT)) for path in LIBRARY.rglob("*.yaml"))
    proc = subprocess.run([sys.executable, "-m", "chaosproxy", "validate", *files],
                          check=False, capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    suites = [name for name in files if name.startswith("scenarios/suites/")]
    assert {"scenarios/suites/robustbench-tc.yaml", "scenarios/suites/real-world.yaml"} <= set(suites)
    assert all(f"{name}: ok (suite, " in proc.stdout for name in suites), proc.stdout  # read as suites


# The suites: every template mirrors a library scenario's rule


def covers(template: Any, value: Any) -> bool:
    """True when `value` is one of the values `template` can take."""
    match template:
        case Range(low, high):
            return isinstance(value, int | float) and low <= value <= high
        case Choice(options):
            return any(covers(option, value) for option in options)
        case dict():
            return isinstance(value, dict) and set(value) <= set(template) and all(
                covers(template[k], v) for k, v in value.items())
    return template == value


def mirrored(template: dict[str, Any], rule: dict[str, Any]) -> bool:
    """Same fault and match; every fault value of the library rule is among the template's draws."""
    return template.get("match", {}) == rule.get("match", {}) and covers(template["fault"], rule["fault"])


@pytest.mark.parametrize("suite,names", [("robustbench-tc", set(ROBUSTBENCH_TC)),
                                         ("real-world", {key(p) for p in SCENARIOS} - set(ROBUSTBENCH_TC))])
def test_a_suite_mirrors_its_library_scenarios_rule_for_rule(suite: str, names: set[str]):
    loaded = load_suite(SUITES / f"{suite}.yaml")  # every bound and option makes a valid rule
    assert loaded.pick == 1
    by_stem = {name.split("/")[1]: name for name in names}
    assert {template["name"] for template in loaded.rules} == set(by_stem), "one template per scenario"
    for template in loaded.rules:
        library = scenario_data(LIBRARY / f"{by_stem[template['name']]}.yaml")
        # each rule of the scenario is among the template's draws (a two-rule scenario: a choice)
        for rule in library["rules"]:
            assert mirrored(template, rule), (template["name"], rule["name"])
    for seed in range(40):
        assert len(loaded.sample(seed)["rules"]) == 1


# Every scenario through the proxy, against a real server


def scaled(data: dict[str, Any], folder: Path) -> dict[str, Any]:
    """The scenario with its times multiplied by TIME_SCALE (see the module docstring), and a relative
    `mapping:` file made absolute: it is relative to the scenario's folder, which the text loses."""
    rules = []
    for rule in data["rules"]:
        fault = dict(rule["fault"])
        if isinstance(fault.get("mapping"), str) and not Path(fault["mapping"]).is_absolute():
            fault["mapping"] = str(folder / fault["mapping"])
        for name in TIME_KEYS.get(fault["type"], ()):
            if fault.get(name) is not None:
                fault[name] = fault[name] * TIME_SCALE
        rules.append({**rule, "fault": fault})
    return {**data, "rules": rules}


def sample(schema: dict[str, Any], round_: int) -> Any:
    """An argument value of the shape `schema` asks for, different in each round."""
    if schema.get("enum"):
        return schema["enum"][0]
    match schema.get("type"):
        case "integer":
            return round_ + 2
        case "number":
            return round_ + 1.5
        case "boolean":
            return False
        case "array":
            return []
        case "object":
            return {}
    return WORDS[round_ % len(WORDS)]


def arguments(tool: Any, round_: int) -> dict[str, Any]:
    properties = (tool.input_schema or {}).get("properties") or {}
    return {name: sample(prop if isinstance(prop, dict) else {}, round_) for name, prop in properties.items()}


def seen(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def described(exc: BaseException) -> str:
    """What went wrong, with the errors inside an exception group (the SDK raises those) spelt out."""
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(described(inner) for inner in exc.exceptions)
    return f"{type(exc).__name__}: {exc}"[:300]


async def list_all(session: Any, refresh: bool) -> list[Any]:
    tools: list[Any] = []
    cursor = None
    for _ in range(20):  # pages
        page = await session.list_tools(cursor=cursor, cache_mode="refresh" if refresh else "use")
        tools += page.tools
        cursor = page.next_cursor
        if not cursor:
            break
    return tools


async def agent_session(url: str, era: str, calls: bool, observed: list[str], done: Callable[[], bool]) -> None:
    """One scripted session; everything the client sees (results, errors) is appended to `observed`.

    Returns early once `done()`; an error ends the step, not the session, unless the session is gone.
    """

    async def step(name: str, action: Any) -> Any:
        try:
            return await action
        except Exception as exc:  # noqa: BLE001 - whatever the client raises is what the agent sees
            observed.append(seen([name, described(exc)]))
            return None

    try:
        async with asyncio.timeout(SESSION_BUDGET), \
                client(url, era, read_timeout_seconds=READ_TIMEOUT) as session:
            for round_ in range(ROUNDS + 1):
                tools = await step("list", list_all(session, refresh=round_ > 0))
                if tools is not None:
                    observed.append(seen(["list", [dump(tool) for tool in tools]]))
                if done() or not calls or round_ == ROUNDS:
                    return
                for tool in (tools or [])[:CALLS_PER_ROUND]:
                    args = arguments(tool, round_)
                    result = await step("call", session.call_tool(tool.name, args))
                    if result is not None:
                        observed.append(seen(["call", tool.name, args, dump(result)]))
                    if done():
                        return
    except Exception as exc:  # noqa: BLE001 - a session that could not start, or died on its way out
        observed.append(seen(["session", described(exc)]))


@pytest.fixture(scope="module")
def servers() -> Iterator[Callable[[str], str]]:
    """The MCP endpoint of a server, started on first use and kept for the module: the bundled one
    (streamable HTTP; it streams its replies to POSTs as SSE in the handshake era), or the reference
    server-everything when a scenario needs it."""
    started: dict[str, str] = {}
    with contextlib.ExitStack() as stack:

        def get(name: str) -> str:
            if name not in started:
                if name == "bundled":
                    started[name] = stack.enter_context(serve("http")) + "/mcp"
                else:
                    if peers.missing() and not os.environ.get("CI"):
                        pytest.skip(f"MCP peers not installed: {peers.missing()}")
                    started[name] = stack.enter_context(peers.everything_http("streamableHttp")).url
            return started[name]

        yield get


@pytest.fixture(scope="module")
def clean_runs():
    """What the scripted client sees with no faults, per server and era."""
    return {}


async def clean(make_proxy, servers, clean_runs: dict[Any, set[str]], needs: Needs, era: str) -> set[str]:
    if (needs.server, needs.calls, era) not in clean_runs:
        upstream = servers(needs.server)
        proxy = make_proxy("rules: []", to=proxy_target(upstream))
        observed: list[str] = []
        await agent_session(proxy.url + path_of(upstream), era, needs.calls, observed, lambda: False)
        assert all(o.startswith(('["list"', '["call"')) for o in observed), observed  # no errors
        clean_runs[needs.server, needs.calls, era] = set(observed)
    return clean_runs[needs.server, needs.calls, era]


def proxy_target(url: str) -> str:
    return url.rsplit("/", 1)[0]


def path_of(url: str) -> str:
    return "/" + url.rsplit("/", 1)[1]


def took_their_time(events: list[dict[str, Any]]) -> bool:
    """For faults whose effect is time alone: every call they hit took at least the time they add
    (the shortest delay drawn; for a dripped body, its pieces but the first times the pause)."""
    faults = [event for event in events if event["event"] == "fault"]
    hit = [event for event in events if event["event"] == "call" and event["faults"]]
    if not faults or not hit:
        return False
    slack = 0.9  # timer granularity
    if faults[0]["fault"] == "latency":
        least = min(fault["effect"]["seconds"] for fault in faults)
        return all(call["duration_ms"] >= least * 1000 * slack for call in hit)
    size, pause = faults[0]["effect"]["chunk_bytes"], faults[0]["effect"]["delay"]
    return all(call["duration_ms"] >= (-(-call["bytes_out"] // size) - 1) * pause * 1000 * slack for call in hit)


@pytest.mark.parametrize("path,era", RUNS)
async def test_a_library_scenario_fires_through_the_proxy_with_its_component(make_proxy, servers, clean_runs,
                                                                             path: Path, era: str):
    component = path.parent.name
    needs = NEEDS.get(key(path), Needs())
    data = scaled(scenario_data(path), path.parent)
    load_scenario(path)  # the file itself, with its own folder as base for any file it names
    rules = {rule["name"] for rule in data["rules"]}
    baseline = await clean(make_proxy, servers, clean_runs, needs, era)
    upstream = servers(needs.server)
    proxy = make_proxy(yaml.safe_dump(data, sort_keys=False), to=proxy_target(upstream))
    observed: list[str] = []

    def fired() -> set[str]:
        return {event["rule"] for event in proxy.events("fault")}

    timing_only = {rule["fault"]["type"] for rule in data["rules"]} <= TIMING_ONLY

    def noticed() -> bool:
        return timing_only or any(o not in baseline for o in observed)

    def done() -> bool:
        return fired() >= rules and noticed()

    started = time.monotonic()
    sessions = 0
    while not done() and sessions < MAX_SESSIONS and time.monotonic() - started < SCENARIO_BUDGET:
        await agent_session(proxy.url + path_of(upstream), era, needs.calls, observed, done)
        sessions += 1

    events = proxy.events()
    faults = [event for event in events if event["event"] == "fault"]
    assert fired() >= rules, f"rules that never fired in {sessions} sessions: {sorted(rules - fired())}"
    assert all(event["component"] == component for event in faults), \
        {(event["fault"], event["component"]) for event in faults}
    assert {event["fault"] for event in faults} <= {rule["fault"]["type"] for rule in data["rules"]}
    assert not [event for event in events if event["event"] == "error"], "a fault raised (and failed open)"
    assert noticed(), "the client saw nothing the clean run did not"
    if timing_only:
        assert took_their_time(events), "the calls it hit were not slowed down by what it drew"
