"""The MCP 2026-07-28 scenario library (scenarios/mcp-2026/) and its drill suite: each scenario says what it
reproduces and which section of the specification grounds it, is filed under its faults' component, and
fires through a real proxy in front of an SDK server that uses the feature (tests/helpers/modern_server.py), met
by a scripted SDK client session that exercises every feature once. The suite's templates are the
scenarios' rules, with their values among its draws."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import anyio
import pytest
import yaml

from chaosproxy.drill.suite import load_suite
from chaosproxy.engine.scenario import load_scenario
from tests.faults.test_scenario_library import covers
from tests.helpers.modern_support import Asker, TasksClient, modern, serve_http

ROOT = Path(__file__).resolve().parents[3]
SCENARIOS = sorted((ROOT / "scenarios" / "mcp-2026").glob("*.yaml"))
SUITE = ROOT / "scenarios" / "suites" / "mcp-2026.yaml"
COMPONENTS = ("observation", "action", "reward", "transition")
MAX_SESSIONS = 8  # sessions a scenario gets to fire all its rules (its gates may draw against it)
STEP_S = 5.0  # the bound on each step of a session
QUIET_S = 0.5


def header(path: Path) -> str:
    return "\n".join(line for line in path.read_text(encoding="utf-8").splitlines() if line.startswith("#"))


@pytest.fixture(scope="module")
def server() -> Any:
    with serve_http() as url:
        yield url


async def session(url: str, name: str) -> list[str]:
    """One scripted session of everything 2026-07-28 adds; what went wrong at each step, in order."""
    failures: list[str] = []
    tasks = TasksClient()
    async with contextlib.AsyncExitStack() as stack:

        async def step(label: str, action: Any) -> Any:
            try:
                with anyio.fail_after(STEP_S):
                    return await action()
            except Exception as exc:  # noqa: BLE001 - what the agent meets is what the test looks at
                failures.append(f"{label}: {type(exc).__name__}")
                return None

        client = await stack.enter_async_context(modern(url, elicitation_callback=Asker(), extensions=[tasks],
                                                        input_required_max_rounds=3, read_timeout_seconds=STEP_S))
        await step("list", client.list_tools)
        await step("deploy", lambda: client.call_tool("deploy", {"target": "staging"}))
        await step("spawn", lambda: client.call_tool("spawn", {"name": name}))
        await step("relist", client.list_tools)

        async def listen() -> None:
            async with client.listen(tools_list_changed=True, resource_subscriptions=["note://greeting"]) as sub:
                await client.call_tool("retire", {"name": name})
                await client.call_tool("touch", {"uri": "note://greeting"})
                with anyio.move_on_after(QUIET_S):
                    async for _ in sub:
                        pass

        if client.protocol_version >= "2026":
            await step("listen", listen)
        await step("report", lambda: client.call_tool("report", {"polls": 1}))
        await step("weather", lambda: client.call_tool("weather", {"city": "Oslo"}))
    return failures


@pytest.mark.slow
@pytest.mark.parametrize("path", SCENARIOS, ids=lambda path: path.stem)
async def test_a_scenario_is_grounded_and_fires_with_its_component(make_proxy, server, path: Path):
    text = header(path)
    component = text.removeprefix("# Component: ").split(".")[0]
    assert component in COMPONENTS and "Reproduces:" in text and "Grounding:" in text
    assert "2026-07-28" in text or "io.modelcontextprotocol/tasks" in text  # the specification's section
    scenario = load_scenario(path)
    assert scenario.description and all(rule.fault.component == component for rule in scenario.rules)
    rules = {rule.name for rule in scenario.rules}
    proxy = make_proxy(path.read_text(encoding="utf-8"), to=server)
    for n in range(MAX_SESSIONS):
        await session(proxy.url + "/mcp", f"{path.stem}_{n}")
        if {event["rule"] for event in proxy.events("fault")} >= rules:
            break
    faults = proxy.events("fault")
    assert {event["rule"] for event in faults} >= rules, f"never fired in {MAX_SESSIONS} sessions"
    assert {event["component"] for event in faults} == {component}
    assert not proxy.events("error"), "a fault raised (and failed open)"


def test_the_suite_draws_every_library_rule_and_names_its_section():
    suite = load_suite(SUITE)
    assert suite.pick == 1
    templates = {template["name"]: template for template in suite.rules}
    for path in SCENARIOS:
        for rule in yaml.safe_load(path.read_text(encoding="utf-8"))["rules"]:
            template = templates[rule["name"]]
            assert template.get("match", {}) == rule.get("match", {}), rule["name"]
            assert covers(template["fault"], rule["fault"]), rule["name"]
    text = SUITE.read_text(encoding="utf-8").splitlines()
    for i, line in enumerate(text):  # each template follows the comment naming its section
        if line.startswith("  - name: "):
            assert text[i - 1].startswith("  # ") and ("basic/" in text[i - 1] or "server/" in text[i - 1]
                                                       or "io.modelcontextprotocol/tasks" in text[i - 1]), line
    for seed in range(30):
        assert len(suite.sample(seed)["rules"]) == 1
