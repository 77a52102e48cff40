#!/usr/bin/env python3
"""Replay against live relay: a recorded MCP tools/call served by `chaosproxy replay` beside the same call
relayed live by `chaosproxy run`, in one run.

    .venv/bin/python bench/replay.py [--rounds 3] [--seconds 3] [--out DIR]

The upstream is the bundled MCP server (Python SDK) in stateless JSON mode, so wrk can post tools/call
without a handshake (bench/wrk_mcp.lua). Targets: `live` (chaosproxy, no rules, in front of the
upstream); `recording` (the same with --record: what recording costs); `replay` (`chaosproxy replay
--no-delay` serving a cassette of that call recorded once through a recording proxy, the upstream
no longer asked); `replay-timed` (the same keeping the recorded timing). Reported: p50 at c=1, req/s
and the serving processes' CPU per request at c=16 (live: proxy and upstream; replay: itself), and the
proxy's or replay's own, median over rounds that visit every target in turn. Budget (DESIGN.md):
replay no slower than a live relay.
"""

from __future__ import annotations

import argparse
import http.client
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from run import (
    CHAOS,
    MCP_PROBE,
    Bench,
    Procs,
    cpu_s,
    free_ports,
    log,
    start_mcp_upstream,
    wait_ready,
)

TARGETS = ["live", "recording", "replay", "replay-timed"]


class ReplayBench(Bench):
    """Bench.wrk counting the CPU of every process that serves a target (a live relay's upstream too)."""

    def __init__(self, out: Path, ports: dict[str, int], serving: dict[str, list[int]], upstream_pid: int) -> None:
        super().__init__(out, ports, {target: pids[0] for target, pids in serving.items()}, upstream_pid)
        self.serving = serving

    def run(self, target: str, test: str, threads: int, conns: int, seconds: float) -> dict:
        before = sum(sum(cpu_s(pid)) for pid in self.serving[target])
        result = self.wrk(target, test, threads, conns, seconds, "wrk_mcp.lua", "/mcp")
        result["serving_cpu_s"] = sum(sum(cpu_s(pid)) for pid in self.serving[target]) - before
        return result


def record_once(procs: Procs, out: Path, upstream_port: int, port: int) -> Path:
    """A cassette of the benchmark's call, recorded through a proxy that is then stopped."""
    cassette = out / "cassette"
    shutil.rmtree(cassette, ignore_errors=True)
    proxy = procs.start("record-once", [CHAOS, "run", "--upstream", f"http://127.0.0.1:{upstream_port}", "--listen",
                                        f"127.0.0.1:{port}", "--record", str(cassette), "--log", "/dev/null"])
    wait_ready("record-once", port, proxy, 30, MCP_PROBE)  # the probe is the recorded call: cold,
    _answer(port)  # then warm (the replay answers the first call with the first, all others with the last)
    proxy.terminate()
    proxy.wait(10)
    return cassette


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=int, default=3)
    parser.add_argument("--out", type=Path,
                        default=Path(f"/tmp/chaosproxy-bench-replay-{time.strftime('%Y%m%d-%H%M%S')}"))
    args = parser.parse_args()
    (args.out / "raw").mkdir(parents=True, exist_ok=True)
    (args.out / "logs").mkdir(exist_ok=True)
    procs = Procs(args.out / "logs")
    form = subprocess.run([CHAOS, "--version"], capture_output=True, text=True, check=True).stdout.strip()
    try:
        uport, once, *ports_ = free_ports(2 + len(TARGETS))
        ports = dict(zip(TARGETS, ports_, strict=True))
        upstream = start_mcp_upstream(procs, uport)
        cassette = record_once(procs, args.out, uport, once)
        upstream_url = f"http://127.0.0.1:{uport}"
        shutil.rmtree(args.out / "recorded", ignore_errors=True)
        argv = {"live": [CHAOS, "run", "--upstream", upstream_url],
                "recording": [CHAOS, "run", "--upstream", upstream_url, "--record", str(args.out / "recorded")],
                "replay": [CHAOS, "replay", str(cassette), "--no-delay"],
                "replay-timed": [CHAOS, "replay", str(cassette)]}
        serving: dict[str, list[int]] = {}
        for target in TARGETS:
            proc = procs.start(target, [*argv[target], "--listen", f"127.0.0.1:{ports[target]}",
                                        *(["--log", "/dev/null"] if target in ("live", "recording") else [])])
            wait_ready(target, ports[target], proc, 30, MCP_PROBE)
            serving[target] = [proc.pid, *([upstream.pid] if target in ("live", "recording") else [])]
        bench = ReplayBench(args.out, ports, serving, upstream.pid)
        c1: dict[str, list[dict]] = {t: [] for t in TARGETS}
        c16: dict[str, list[dict]] = {t: [] for t in TARGETS}
        for r in range(args.rounds):
            for target in TARGETS:
                log(f"round {r + 1}: {target}")
                c1[target].append(bench.run(target, "c1", 1, 1, args.seconds))
                c16[target].append(bench.run(target, "c16", 2, 16, args.seconds))
        same = _answer(ports["live"]) == _answer(ports["replay"])
    finally:
        procs.stop_all()

    rows = {}
    for target in TARGETS:
        rows[target] = {
            "c1_p50_ms": statistics.median(run["lat_p50_us"] for run in c1[target]) / 1000,
            "c16_rps": statistics.median(run["requests"] / (run["duration_us"] / 1e6) for run in c16[target]),
            "cpu_us_c16": statistics.median(run["serving_cpu_s"] / max(run["requests"], 1) for run in c16[target])
            * 1e6,
            "own_cpu_us_c16": statistics.median(run["proxy_cpu_s"] / max(run["requests"], 1) for run in c16[target])
            * 1e6,
            "errors": sum(run["errors"] for run in c1[target] + c16[target])}
    lines = [f"data plane: {form}", "",
             "| target | c1 p50 ms | c16 req/s | serving CPU µs/req c16 | its own CPU µs/req c16 | errors |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {target} | {row['c1_p50_ms']:.3f} | {row['c16_rps']:.0f} | {row['cpu_us_c16']:.0f} | "
              f"{row['own_cpu_us_c16']:.0f} | {row['errors']} |" for target, row in rows.items()]
    live, replay = rows["live"], rows["replay"]
    ok = same and replay["c1_p50_ms"] <= live["c1_p50_ms"] and replay["c16_rps"] >= live["c16_rps"] and \
        not replay["errors"]
    lines += ["", f"replay answers as live does: {'yes' if same else 'NO'}; "
                  f"replay no slower than a live relay (p50 at c=1, req/s at c=16): {'yes' if ok else 'NO'}"]
    table = "\n".join(lines)
    print(table)
    (args.out / "summary.md").write_text(table + "\n")
    (args.out / "results.json").write_text(json.dumps({"form": form, "rows": rows, "c1": c1, "c16": c16}, indent=1))
    return 0 if ok else 1


def _answer(port: int) -> bytes:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request(*MCP_PROBE)
        return conn.getresponse().read()
    finally:
        conn.close()


if __name__ == "__main__":
    sys.exit(main())
