"""Session churn: many short agent sessions through a proxy with a per-session rule; RSS stays flat
once the session cap is reached.

    flock /tmp/chaosproxy-bench.lock .venv/bin/python bench/session_churn.py --sessions 100000

Each session is one request with a fresh `Mcp-Session-Id` (the proxy keeps a counter per session for
the rule `first: 1`, and an ordinal and state per session) to the bundled REST tool server. The
proxy's RSS is sampled every --every sessions; the report gives it at the cap and at the end, and the
session count the control API shows (it must equal the cap).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).parent))
from soak import free_port, usage, wait_listening  # noqa: E402  # the soak's process helpers

SCENARIO = "rules:\n  - {name: once-per-session, first: 1, fault: {type: latency, delay_ms: 1}}\n"


async def churn(base: str, sessions: int, concurrency: int, every: int, pid: int) -> list[tuple[int, float]]:
    samples: list[tuple[int, float]] = []
    numbers = itertools.count(1)
    done = 0
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as client:
        async def worker() -> None:
            nonlocal done
            while (n := next(numbers)) <= sessions:
                async with client.get(f"{base}/api/weather?city=oslo", headers={"Mcp-Session-Id": f"churn-{n}"},
                                      timeout=aiohttp.ClientTimeout(total=30)) as response:
                    await response.read()
                done += 1
                if done % every == 0:
                    samples.append((done, usage(pid)[0]))

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return samples


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=100_000)
    parser.add_argument("--max-sessions", type=int, default=10_000, help="the proxy's cap (its default)")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--every", type=int, default=10_000, help="sample RSS every this many sessions")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="chaosproxy-churn-"))
    (folder / "s.yaml").write_text(SCENARIO)
    upstream_port, port, control = free_port(), free_port(), free_port()
    procs = [subprocess.Popen([sys.executable, "-m", "chaosproxy.demo.tool_server", "--port", str(upstream_port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    try:
        wait_listening(upstream_port, procs[0])
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "chaosproxy", "run", "--upstream", f"http://127.0.0.1:{upstream_port}",
             "--listen", f"127.0.0.1:{port}", "--control", f"127.0.0.1:{control}", "--scenario",
             str(folder / "s.yaml"), "--max-sessions", str(args.max_sessions), "--log", str(folder / "log.jsonl")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        wait_listening(port, procs[1])
        started = time.monotonic()
        samples = asyncio.run(churn(f"http://127.0.0.1:{port}", args.sessions, args.concurrency, args.every,
                                    procs[1].pid))
        took = time.monotonic() - started
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback, never a proxy
        with opener.open(f"http://127.0.0.1:{control}/sessions?limit=0", timeout=10) as reply:
            held = json.load(reply)["count"]
    finally:
        for proc in reversed(procs):
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)
    lines: dict[str, int] = {}  # the log's lines by event: a churn must not fill it with session lines
    for line in (folder / "log.jsonl").read_text().splitlines():
        event = json.loads(line)["event"]
        lines[event] = lines.get(event, 0) + 1
    at_cap = next((rss for n, rss in samples if n >= args.max_sessions), None)
    report = {"sessions": args.sessions, "max_sessions": args.max_sessions, "seconds": round(took, 1),
              "rss_mib_by_sessions": {n: round(rss, 1) for n, rss in samples},
              "rss_mib_at_cap": round(at_cap, 1) if at_cap else None,
              "rss_mib_at_end": round(samples[-1][1], 1) if samples else None,
              "sessions_held_at_end": held, "log_lines_by_event": lines}
    print(json.dumps(report, indent=2))
    return 0 if held == min(args.sessions, args.max_sessions) else 1


if __name__ == "__main__":
    raise SystemExit(main())
