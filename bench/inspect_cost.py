"""What chaos costs an Inspect eval per sample-epoch: proxy start-up, and CPU per tool call.

  python bench/inspect_cost.py [--samples 40] [--repeat 3]

Start-up, each measured 50 times (median): the in-process proxy a sample-epoch gets (an engine and an
HttpProxy on the running loop, what chaosproxy.harness starts), the EmbeddedProxy (its own thread and
control API) for comparison, and one `chaosproxy stdio` session against the bare server command (time
to list the tools). CPU: the same eval (the naive scripted policy over the bundled MCP server, HTTP,
every sample-epoch clean so both do the same work) run plain, with Inspect's own mcp_server_http, and
as a chaos task; this process's CPU time (the MCP server runs apart) per sample-epoch and per HTTP
request the proxies relayed. Loopback only; nothing leaves the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from inspect_ai import eval
from inspect_ai.tool import mcp_server_http as plain_mcp_server_http
from inspect_ai.tool import mcp_server_stdio as plain_mcp_server_stdio

from chaosproxy.embedded import EmbeddedProxy
from chaosproxy.harness import ChaosPlan
from chaosproxy.harness.plan import Draw
from chaosproxy.harness.sample import SampleChaos, running
from chaosproxy.harness.tools import mcp_server_stdio

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("inspect_benchmark", ROOT / "examples" / "inspect_benchmark.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)  # type: ignore[union-attr]
CLEAN = Draw("clean", "clean", 1, "rules: []\n")
SERVER = [sys.executable, "-m", "chaosproxy.demo.mcp_server", "stdio"]


def _ms(samples: list[float]) -> str:
    return f"{statistics.median(samples) * 1000:.2f} ms (p90 {sorted(samples)[int(len(samples) * 0.9)] * 1000:.2f})"


async def in_process_start(url: str, folder: Path, n: int = 50) -> list[float]:
    times = []
    for i in range(n):
        chaos = SampleChaos(CLEAN, f"s{i}", Path(tempfile.mkdtemp(dir=folder)), tools=True, model=False)
        started = time.perf_counter()
        await chaos.proxy_url(url)
        times.append(time.perf_counter() - started)
        await chaos.aclose()
    return times


def embedded_start(url: str, folder: Path, n: int = 50) -> list[float]:
    times = []
    for i in range(n):
        started = time.perf_counter()
        proxy = EmbeddedProxy(url, seed=1, log_path=folder / f"embedded-{i}.jsonl").start()
        times.append(time.perf_counter() - started)
        proxy.stop()
    return times


async def stdio_listing(folder: Path, n: int = 10) -> tuple[list[float], list[float]]:
    """Seconds to list the tools over one stdio session: the bare command, and through `chaosproxy stdio`."""
    bare, proxied = [], []
    for i in range(n):
        started = time.perf_counter()
        async with plain_mcp_server_stdio(command=SERVER[0], args=SERVER[1:]) as server:
            await server.tools()
        bare.append(time.perf_counter() - started)
        chaos = SampleChaos(CLEAN, f"stdio{i}", Path(tempfile.mkdtemp(dir=folder)), tools=True, model=False)
        started = time.perf_counter()
        with running(chaos):
            source = mcp_server_stdio(command=SERVER[0], args=SERVER[1:])
            async with source:
                await source.tools()
        proxied.append(time.perf_counter() - started)
        await chaos.aclose()
    return bare, proxied


def eval_cpu(url: str, folder: Path, samples: int, chaos: bool) -> tuple[float, float, int]:
    """(CPU seconds, wall seconds, HTTP requests relayed) of one clean eval, plain or as a chaos task."""
    plan = ChaosPlan(baseline=1.0, seed=1, log_dir=folder / "proxy")
    task = bench.benchmark_task(plan, url=url, samples=samples, epochs=1)
    if not chaos:  # the same task, its tools Inspect's own: no proxy anywhere
        from inspect_ai import Task
        from inspect_ai.scorer import includes
        from inspect_ai.solver import generate, system_message, use_tools

        task = Task(dataset=bench.dataset(samples), scorer=includes(), name="plain", solver=[
            system_message(bench.SYSTEM), use_tools(plain_mcp_server_http(url=url)), generate()])
    cpu, wall = time.process_time(), time.perf_counter()
    [log] = eval(task, model=bench.policy_model("naive"), display="none", log_dir=str(folder / "inspect"),
                 max_samples=8)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    assert log.status == "success" and log.results.scores[0].metrics["accuracy"].value == 1.0
    requests = sum(1 for sample in log.samples for line in (sample.store.get("chaosproxy") or {}).get("log", [])
                   if line["event"] == "call")
    return cpu, wall, requests


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=40)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    server, url = bench.serve_mcp_http()
    folder = Path(tempfile.mkdtemp(prefix="inspect-cost-"))
    try:
        print(f"in-process proxy start (per sample-epoch): {_ms(asyncio.run(in_process_start(url, folder)))}")
        print(f"EmbeddedProxy start (thread + control API): {_ms(embedded_start(url, folder))}")
        bare, proxied = asyncio.run(stdio_listing(folder))
        print(f"stdio session to the tool list: bare {_ms(bare)}, through chaosproxy stdio {_ms(proxied)}")
        eval(bench.benchmark_task(ChaosPlan(baseline=1.0, log_dir=folder / "warm"), url=url, samples=2, epochs=1),
             model=bench.policy_model("naive"), display="none", log_dir=str(folder / "warm"))  # imports, caches
        runs = {kind: [eval_cpu(url, folder / f"{kind}{i}", args.samples, kind == "chaos")
                       for i in range(args.repeat)] for kind in ("plain", "chaos")}
        cpu = {kind: statistics.median(run[0] for run in results) / args.samples for kind, results in runs.items()}
        wall = {kind: statistics.median(run[1] for run in results) / args.samples for kind, results in runs.items()}
        requests = statistics.median(run[2] for run in runs["chaos"]) / args.samples
        added = cpu["chaos"] - cpu["plain"]
        print(f"eval of {args.samples} clean sample-epochs, median of {args.repeat}, per sample-epoch: CPU plain "
              f"{cpu['plain'] * 1000:.1f} ms, chaos {cpu['chaos'] * 1000:.1f} ms (+{added * 1000:.1f} ms); wall "
              f"plain {wall['plain'] * 1000:.1f} ms, chaos {wall['chaos'] * 1000:.1f} ms")
        print(f"HTTP requests relayed per sample-epoch: {requests:.1f} (one tool call, its tool listing and "
              f"their MCP sessions); added CPU per request {added / requests * 1e6:.0f} µs")
        print(json.dumps({"cpu_ms": {k: round(v * 1000, 2) for k, v in cpu.items()},
                          "wall_ms": {k: round(v * 1000, 2) for k, v in wall.items()},
                          "requests_per_sample": requests}))
    finally:
        server.terminate()
        server.wait(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
