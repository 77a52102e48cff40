"""Soak: chaosproxy under steady mixed load and faults, with its tool servers killed and restarted.

    flock /tmp/chaosproxy-bench.lock .venv/bin/python bench/soak.py --duration 600

64 clients (--concurrency) send requests for --duration seconds through one `chaosproxy run` to two
upstreams: the bundled REST tool server (GET /rest/api/...) and the bundled MCP server over
streamable HTTP (POST /tools/mcp, JSON-RPC tools/call and tools/list answered as SSE). The scenario
mixes latency, 503, resets, truncation, typos in MCP results and a duplicate tool. At a third and at
two thirds of the run both tool servers are killed (SIGKILL) and started again a second later.

Every request carries its own `Mcp-Session-Id`, so each log line names the request it is about
(and the proxy's session table churns through far more sessions than its cap). The report:

- requests sent, responses received (any status), faults logged;
- requests neither answered nor explained by a logged fault (a reset or truncation of that request)
  or a logged upstream failure: must be 0; client timeouts (--timeout) count as unexplained;
- call lines against requests: one per request (plus aiohttp's own second attempt of a GET whose
  pooled connection a reset broke, which follows a call line saying so);
- the proxy's RSS and open file descriptors at start (after a warm-up) and at the end, and its RSS
  every tenth of the run (the bounded tables fill in the first minute, then it should stay level);
- p50/p99 latency of requests no fault touched, and the share answered 502 while an upstream was down.

The exit status is 0 when both checks hold. Nothing here talks to anything but 127.0.0.1.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

PY = sys.executable
# Outcomes a client may see as an error: the logged reason when a request was not answered.
BREAKING = {"reset", "truncated", "hang", "stream_cut", "stream_idle", "upstream_error"}
SCENARIO = """\
rules:
  - {name: slow, probability: 0.2, fault: {type: latency, delay_ms: 20, jitter_ms: 10}}
  - {name: unavailable, probability: 0.03, fault: {type: http_error, status: 503}}
  - {name: reset, probability: 0.01, fault: {type: reset}}
  - {name: cut, probability: 0.01, fault: {type: truncate, fraction: 0.5}}
  - {name: typos, match: {route: tools, method: tools/call}, probability: 0.3, fault: {type: typos, rate: 0.05}}
  - {name: twin, match: {route: tools, method: tools/list}, fault: {type: duplicate_tool}}
"""
MCP_HEADERS = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
               "MCP-Protocol-Version": "2025-11-25"}
CALLS = [("search", {"query": "chaos"}), ("weather", {"city": "Lima"}), ("add", {"a": 2, "b": 3})]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_listening(port: int, proc: subprocess.Popen[bytes], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"a process exited before listening on {port}: {proc.args}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"nothing listening on {port}")


class Upstreams:
    """The two tool servers, restartable on their ports."""

    def __init__(self, folder: Path) -> None:
        self.rest_port, self.mcp_port = free_port(), free_port()
        self.folder = folder
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self) -> None:
        commands = {"rest": [PY, "-m", "chaosproxy.demo.tool_server", "--port", str(self.rest_port)],
                    "mcp": [PY, "-m", "chaosproxy.demo.mcp_server", "http", "--port", str(self.mcp_port),
                            "--stateless"]}
        for name, command in commands.items():
            with open(self.folder / f"{name}.log", "ab") as out:
                self.procs[name] = subprocess.Popen(command, stdout=out, stderr=out, start_new_session=True)
        wait_listening(self.rest_port, self.procs["rest"])
        wait_listening(self.mcp_port, self.procs["mcp"])

    def kill(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)


def usage(pid: int) -> tuple[float, int]:
    """RSS in MiB and open file descriptors of a process."""
    rss_kib = next(int(line.split()[1]) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                   if line.startswith("VmRSS"))
    return rss_kib / 1024, len(os.listdir(f"/proc/{pid}/fd"))


@dataclass
class Tally:
    sent: int = 0
    answered: int = 0
    statuses: Counter[int] = field(default_factory=Counter)
    failed: dict[str, str] = field(default_factory=dict)  # session -> what the client saw
    timeouts: list[str] = field(default_factory=list)
    latency: dict[str, float] = field(default_factory=dict)  # session -> seconds, answered requests
    rss_mib: list[float] = field(default_factory=list)  # the proxy's, every tenth of the run


async def one_request(client: aiohttp.ClientSession, base: str, session: str, n: int, rng: random.Random,
                      tally: Tally, timeout: float) -> None:
    if rng.random() < 0.5:
        method, url, body, headers = "GET", f"{base}/rest/api/weather?city=oslo", None, {}
    else:
        if rng.random() < 0.1:
            rpc = {"jsonrpc": "2.0", "id": n, "method": "tools/list"}
        else:
            name, arguments = rng.choice(CALLS)
            rpc = {"jsonrpc": "2.0", "id": n, "method": "tools/call", "params": {"name": name, "arguments": arguments}}
        method, url, body, headers = "POST", f"{base}/tools/mcp", json.dumps(rpc).encode(), MCP_HEADERS
    tally.sent += 1
    started = time.monotonic()
    try:
        async with client.request(method, url, data=body, headers={**headers, "Mcp-Session-Id": session},
                                  timeout=aiohttp.ClientTimeout(total=timeout)) as response:
            await response.read()
            tally.answered += 1
            tally.statuses[response.status] += 1
            tally.latency[session] = time.monotonic() - started
    except TimeoutError:
        tally.timeouts.append(session)
    except (aiohttp.ClientError, ConnectionError) as exc:
        tally.failed[session] = type(exc).__name__


async def load(base: str, duration: float, concurrency: int, timeout: float, upstreams: Upstreams | None,
               seed: int, prefix: str, proxy_pid: int) -> Tally:
    """Requests for `duration` seconds, sessions named PREFIX-N; with `upstreams`, killed and restarted twice.
    The proxy's RSS is sampled every tenth of the run."""
    tally = Tally()
    numbers = itertools.count(1)
    deadline = time.monotonic() + duration
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as client:
        async def worker(k: int) -> None:
            rng = random.Random(seed * 1000 + k)
            while time.monotonic() < deadline:
                n = next(numbers)
                await one_request(client, base, f"{prefix}-{n}", n, rng, tally, timeout)

        async def restarts() -> None:
            if upstreams is None:
                return
            for at in (duration / 3, 2 * duration / 3):
                await asyncio.sleep(max(0.0, deadline - duration + at - time.monotonic()))
                print(f"soak: killing the tool servers at {at:.0f} s", file=sys.stderr)
                upstreams.kill()
                await asyncio.sleep(1)
                await asyncio.to_thread(upstreams.start)

        async def sample_rss() -> None:
            for k in range(1, 10):
                await asyncio.sleep(max(0.0, deadline - duration + k * duration / 10 - time.monotonic()))
                tally.rss_mib.append(round(usage(proxy_pid)[0], 1))

        await asyncio.gather(*(worker(k) for k in range(concurrency)), restarts(), sample_rss())
    return tally


def read_log(path: Path) -> tuple[dict[str, list[dict]], dict[str, list[dict]], int]:
    calls: dict[str, list[dict]] = {}
    faults: dict[str, list[dict]] = {}
    total_faults = 0
    for line in path.read_text().splitlines():
        event = json.loads(line)
        if event["event"] == "call":
            calls.setdefault(event.get("session"), []).append(event)
        elif event["event"] == "fault":
            total_faults += 1
            faults.setdefault(event.get("session"), []).append(event)
    return calls, faults, total_faults


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else float("nan")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=600, help="seconds of load (default 600)")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--timeout", type=float, default=15, help="each request's client timeout (seconds)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", type=Path, help="keep the log and process output here (default: a temp folder)")
    args = parser.parse_args()
    folder = args.out or Path(tempfile.mkdtemp(prefix="chaosproxy-soak-"))
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "soak.yaml").write_text(SCENARIO)
    log = folder / "soak.jsonl"
    upstreams = Upstreams(folder)
    upstreams.start()
    port = free_port()
    with open(folder / "proxy.stderr", "wb") as err:
        proxy = subprocess.Popen(
            [PY, "-m", "chaosproxy", "run", "--route", f"/rest=http://127.0.0.1:{upstreams.rest_port}",
             "--route", f"/tools=http://127.0.0.1:{upstreams.mcp_port}", "--scenario", str(folder / "soak.yaml"),
             "--seed", str(args.seed), "--log", str(log), "--listen", f"127.0.0.1:{port}"],
            stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
    try:
        wait_listening(port, proxy)
        base = f"http://127.0.0.1:{port}"
        asyncio.run(load(base, min(5.0, args.duration / 10), args.concurrency, args.timeout, None, args.seed, "warm",
                         proxy.pid))
        start_rss, start_fds = usage(proxy.pid)
        started = time.monotonic()
        tally = asyncio.run(load(base, args.duration, args.concurrency, args.timeout, upstreams, args.seed, "soak",
                                 proxy.pid))
        took = time.monotonic() - started
        end_rss, end_fds = usage(proxy.pid)
        proxy.send_signal(signal.SIGTERM)
        proxy.wait(30)
    finally:
        if proxy.poll() is None:
            os.killpg(proxy.pid, signal.SIGKILL)
            proxy.wait(10)
        upstreams.kill()

    calls, faults, total_faults = read_log(log)
    soaked = {session: lines for session, lines in calls.items() if session and session.startswith("soak-")}
    call_lines = sum(len(lines) for lines in soaked.values())  # the warm-up's (warm-N) are not counted
    # aiohttp's client sends an idempotent request again when its pooled connection broke (a reset):
    # those second attempts are the client's, each after a call line saying why
    retries = sum(len(lines) - 1 for lines in soaked.values()
                  if len(lines) > 1 and all(call["outcome"] in BREAKING for call in lines[:-1]))
    every_request_logged = len(soaked) == tally.sent and call_lines == tally.sent + retries

    def explained(session: str) -> bool:
        return any(call["outcome"] in BREAKING for call in soaked.get(session, ())) or any(
            fault["rule"] in ("reset", "cut") for fault in faults.get(session, ()))

    unexplained = [s for s in tally.failed if not explained(s)] + tally.timeouts
    clean = [seconds for session, seconds in tally.latency.items() if session not in faults]
    report = {
        "duration_s": round(took, 1), "concurrency": args.concurrency,
        "requests_sent": tally.sent, "responses_received": tally.answered,
        "statuses": dict(sorted(tally.statuses.items())), "client_errors": dict(Counter(tally.failed.values())),
        "client_timeouts": len(tally.timeouts), "faults_logged": total_faults,
        "faults_by_rule": dict(Counter(f["rule"] for lines in faults.values() for f in lines)),
        "unexplained": len(unexplained),
        "unexplained_sessions": {s: tally.failed.get(s, "timeout") for s in unexplained[:20]},
        "call_lines": call_lines, "client_retries_after_a_reset": retries,
        "call_lines_equal_requests": every_request_logged,
        "proxy_rss_mib": [round(start_rss, 1), round(end_rss, 1)], "proxy_fds": [start_fds, end_fds],
        "proxy_rss_mib_every_tenth": tally.rss_mib,
        "unfaulted_p50_ms": round(percentile(clean, 50) * 1000, 2),
        "unfaulted_p99_ms": round(percentile(clean, 99) * 1000, 2),
        "requests_per_s": round(tally.sent / took, 1), "folder": str(folder),
    }
    print(json.dumps(report, indent=2))
    return 0 if not unexplained and every_request_logged else 1


if __name__ == "__main__":
    raise SystemExit(main())
