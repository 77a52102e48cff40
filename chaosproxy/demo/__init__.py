"""`chaosproxy demo`: a tool server, the proxy with a bundled scenario, and a scripted agent, in one process.

It shows what chaosproxy is for in half a minute: the agent's calls, the faults injected into them
as they fire, and the perturbation log that explains the run afterwards.
"""

from __future__ import annotations

import asyncio
import collections
import importlib.resources
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from chaosproxy.adapters.http import HttpProxy
from chaosproxy.demo import tool_server
from chaosproxy.runtime import open_engine, run_async
from chaosproxy.scenario import parse_scenario

QUERIES = ["weather in paris", "mcp spec", "retry budgets", "tokyo", "lima weather", "oslo", "chaos engineering"]
AGENT_TIMEOUT_S = 1.0
MAX_ATTEMPTS = 3


def run_demo(log_path: Path | None = None) -> int:
    text = importlib.resources.files("chaosproxy").joinpath("data/demo.yaml").read_text()
    log_path = log_path or Path(tempfile.mkstemp(prefix="chaosproxy-demo-", suffix=".jsonl")[1])
    with open_engine("demo.yaml", scenario=parse_scenario(text, "demo.yaml"), log_path=log_path) as engine:
        run_async(_demo(engine))
    print(f"\nperturbation log: {log_path}  (one JSON line per fault and per call)")
    print("run it again: the bundled scenario pins seed 42, so the same calls meet the same faults "
          "(only the token bucket follows the clock)")
    return 0


async def _demo(engine: Any) -> None:
    runner, tool_port = await tool_server.start()
    proxy = HttpProxy(engine, f"http://127.0.0.1:{tool_port}")
    port = await proxy.start("127.0.0.1", 0)
    base = f"http://127.0.0.1:{port}"
    print(f"tool server  http://127.0.0.1:{tool_port}\nchaosproxy   {base}  (scenario demo.yaml, seed {engine.seed})")
    print(f"agent        scripted: retries 5xx/429/timeouts up to {MAX_ATTEMPTS} attempts, {AGENT_TIMEOUT_S:.0f} s timeout\n")

    by_component: collections.Counter[str] = collections.Counter()

    def show_fault(event: dict[str, Any]) -> None:
        if event["event"] == "fault":
            by_component[f"{event['component']}/{event['fault']}"] += 1
            print(f"      \u26a1 {event['rule']}: {event['fault']} ({event['component']}, {event['level']}) "
                  f"on {event['http_method']} {event['path']}")

    unsubscribe = engine.log.subscribe(show_fault)
    outcomes: collections.Counter[str] = collections.Counter()
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=AGENT_TIMEOUT_S)) as client:
            for step, query in enumerate(QUERIES * 2, start=1):
                tool = "weather" if step % 2 else "search"
                outcomes[await _agent_step(client, base, step, tool, query)] += 1
            await _read_feed(client, base)
    finally:
        unsubscribe()
        await proxy.stop()
        await runner.cleanup()
    print(f"\nagent tasks: {dict(outcomes)}")
    print("faults fired: " + ", ".join(f"{k} x{v}" for k, v in sorted(by_component.items())))


async def _agent_step(client: aiohttp.ClientSession, base: str, step: int, tool: str, query: str) -> str:
    for attempt in range(1, MAX_ATTEMPTS + 1):
        started = time.perf_counter()
        try:
            if tool == "search":
                request = client.post(base + "/api/search", json={"query": query})
            else:
                request = client.get(base + "/api/weather", params={"city": query.split()[0]})
            async with request as response:
                payload = await response.read()
                status = response.status
        except (aiohttp.ClientError, TimeoutError) as exc:
            result = f"failed: {type(exc).__name__}"
            status = None
        else:
            result = f"{status}, {len(payload)} bytes"
        took = (time.perf_counter() - started) * 1000
        print(f"task {step:2d} {tool:7s} attempt {attempt}: {result} in {took:.0f} ms")
        if status == 200:
            return "succeeded" if attempt == 1 else "recovered"
        if status is not None and status not in (429, 500, 502, 503, 504):
            return "gave up"
        await asyncio.sleep(0.1 * attempt)
    return "gave up"


async def _read_feed(client: aiohttp.ClientSession, base: str) -> None:
    events = 0
    async with client.get(base + "/sse", params={"n": "5", "interval_ms": "20"}) as response:
        async for line in response.content:
            events += line.startswith(b"data:")
    print(f"feed    subscribed to /sse: {events} of 5 events arrived")
