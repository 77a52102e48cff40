"""`chaosproxy demo`: the whole story in a few seconds, in one process, with no arguments.

One proxy, one bundled scenario (data/demo.yaml), three routes and three scripted agents: a REST tool
API (latency, an outage, a hang, a cut body and a cut feed), an MCP server (a duplicate and
a renamed tool in tools/list, typos in a result, a drifted input schema) and an agent's model API
(prompt typos, Anthropic's 529, a malformed tool call). Faults are shown as they fire; the run ends
with a robustness summary and an HTML report built from the perturbation log.
"""

from __future__ import annotations

import collections
import importlib.resources
import tempfile
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import aiohttp

from chaosproxy.adapters.http import HttpProxy
from chaosproxy.control.runtime import open_engine, run_async
from chaosproxy.demo import agents, llm_server, mcp_lite, tool_server
from chaosproxy.demo.agents import Outcomes
from chaosproxy.engine.core import Engine
from chaosproxy.engine.scenario import parse_scenario
from chaosproxy.telemetry.log_schema import Event, Key

ACTS = ("REST tool API", "MCP server", "model API")


Fired = collections.Counter[tuple[str, str]]  # faults fired, by (rule, fault type)
Acts = Callable[[Engine], Coroutine[Any, Any, tuple[dict[str, Outcomes], Fired]]]


def play(scenario: str, acts: Acts, log_path: Path | None) -> None:
    """Run a demo's acts under the bundled scenario `scenario` (in chaosproxy/data/); say what each act's
    agent met and where the log and its HTML report are."""
    text = importlib.resources.files("chaosproxy").joinpath(f"data/{scenario}").read_text()
    prefix = f"chaosproxy-{scenario.removesuffix('.yaml')}-"
    log_path = log_path or Path(tempfile.mkstemp(prefix=prefix, suffix=".jsonl")[1])
    with open_engine(scenario, scenario=parse_scenario(text, scenario), log_path=log_path) as engine:
        outcomes, fired = run_async(acts(engine))
        engine.log.flush()
    _summary(outcomes, fired)
    print(f"\nperturbation log: {log_path}  (one JSON line per fault and per call)")
    print(f"HTML report:      {_html_report(log_path)}")


def run_demo(log_path: Path | None = None) -> int:
    play("demo.yaml", _demo, log_path)
    print("run it again: the bundled scenario pins seed 42, so the same calls meet the same faults")
    print("\nnow try it on your own server: chaosproxy run --upstream http://HOST:PORT --scenario FILE,")
    print("  then point your agent at http://127.0.0.1:8800 (scenarios/ has one per fault; docs/getting-started.md)")
    return 0


async def _demo(engine: Engine) -> tuple[dict[str, Outcomes], Fired]:
    servers = [await tool_server.start(), await mcp_lite.start(), (await llm_server.start())[:2]]
    routes = {"/rest": f"http://127.0.0.1:{servers[0][1]}", "/mcp": f"http://127.0.0.1:{servers[1][1]}",
              "/llm": f"http://127.0.0.1:{servers[2][1]}"}
    proxy = HttpProxy(engine, routes)
    base = f"http://127.0.0.1:{await proxy.start('127.0.0.1', 0)}"
    print(f"chaosproxy {base}  (scenario demo.yaml, seed {engine.seed}), one route per act: "
          + ", ".join(f"{prefix} -> {url}" for prefix, url in routes.items()))
    fired: Fired = collections.Counter()

    def show_fault(event: dict[str, Any]) -> None:
        if event[Key.EVENT] == Event.FAULT:
            fired[event[Key.COMPONENT], event[Key.FAULT]] += 1
            where = event.get(Key.TOOL) or event.get(Key.API) or f"{event[Key.HTTP_METHOD]} {event[Key.PATH]}"
            print(f"      \u26a1 {event[Key.RULE]}: {event[Key.FAULT]} ({event[Key.COMPONENT]}) on {where}", flush=True)

    unsubscribe = engine.log.subscribe(show_fault)
    outcomes: dict[str, collections.Counter[str]] = {}
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=agents.TIMEOUT_S)) as client:
            print(f"\n== Act 1: {ACTS[0]}. The agent retries 5xx/429/timeouts ({agents.TIMEOUT_S:g} s) "
                  f"up to {agents.MAX_ATTEMPTS} times")
            outcomes[ACTS[0]] = await agents.rest_agent(client, base + "/rest")
            print(f"\n== Act 2: {ACTS[1]}. The agent lists the tools and calls what it is shown")
            outcomes[ACTS[1]] = await agents.mcp_agent(client, base + "/mcp/mcp")
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as client:
            print(f"\n== Act 3: {ACTS[2]}. A tool-calling agent with local functions, its base URL on the proxy")
            outcomes[ACTS[2]] = await agents.model_agent(client, base + "/llm")
    finally:
        unsubscribe()
        await proxy.stop()
        for runner, _ in servers:
            await runner.cleanup()
    return outcomes, fired


def _summary(outcomes: dict[str, Outcomes], fired: Fired) -> None:
    print("\n== Robustness summary")
    print(f"  {'act':15s} {'tasks':>5s} {'succeeded':>9s} {'recovered':>9s} {'failed':>6s}")
    for act, counts in outcomes.items():
        print(f"  {act:15s} {sum(counts.values()):5d} {counts['succeeded']:9d} {counts['recovered']:9d} "
              f"{counts['failed']:6d}")
    by_component: dict[str, list[str]] = collections.defaultdict(list)
    for (component, fault), count in sorted(fired.items()):
        by_component[component].append(f"{fault} x{count}")
    print("  faults fired: " + "; ".join(f"{component}: {', '.join(faults)}"
                                         for component, faults in sorted(by_component.items())))


def _html_report(log_path: Path) -> Path:
    from chaosproxy.report.build import build_report
    from chaosproxy.report.html import render_html

    path = log_path.with_suffix(".html")
    path.write_text(render_html(build_report(log_path)), encoding="utf-8")
    return path
