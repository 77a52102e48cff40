#!/usr/bin/env python3
"""MCP tools/call round trips over streamable HTTP: direct, idle chaosproxy, chaosproxy with rules active.

    .venv/bin/python bench/mcp_calls.py [--rounds 3] [--seconds 3] [--out DIR]

The upstream is the bundled MCP server (Python SDK) in stateless JSON mode, so wrk can post tools/call
without a handshake. Targets: `direct`; `idle` (chaosproxy, no rules); `tools-list` (a rename_tool rule
on tools/list: the engine now parses every tools/call request to route renamed names, the replies are
watched); `jsonrpc` (an rpc_error rule matching a tool that is never called: every request and reply is
parsed and matched). Reported: p50 at c=1 and the proxy's CPU per request at c=16, median over rounds
that visit every target in turn. Budget (issue 3): idle within the HTTP budget (DESIGN.md); a rule
active costs at most 2x idle CPU.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from run import (
    MCP_PROBE,
    Bench,
    Procs,
    free_ports,
    log,
    start_mcp_upstream,
    start_scenarios,
)

SCENARIOS = {
    "idle": "rules: []\n",
    "tools-list": "rules:\n  - name: rename\n    fault: {type: rename_tool, tool: add, to: add_numbers}\n",
    "jsonrpc": "rules:\n  - name: never\n    match: {tool: no-such-tool}\n    fault: {type: rpc_error}\n",
}
TARGETS = ["direct", *SCENARIOS]




def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path(f"/tmp/chaosproxy-bench-mcp-{time.strftime('%Y%m%d-%H%M%S')}"))
    args = parser.parse_args()
    (args.out / "raw").mkdir(parents=True, exist_ok=True)
    (args.out / "logs").mkdir(exist_ok=True)
    procs = Procs(args.out / "logs")
    try:
        uport, *pports = free_ports(len(TARGETS))
        ports = dict(zip(TARGETS, [uport, *pports], strict=True))
        upstream = start_mcp_upstream(procs, uport)
        pids = start_scenarios(procs, args.out, uport, ports, SCENARIOS, MCP_PROBE)
        bench = Bench(args.out, ports, pids, upstream.pid)
        c1: dict[str, list[dict]] = {t: [] for t in TARGETS}
        c16: dict[str, list[dict]] = {t: [] for t in TARGETS}
        for r in range(args.rounds):
            for target in TARGETS:
                log(f"round {r + 1}: {target}")
                c1[target].append(bench.wrk(target, "c1", 1, 1, args.seconds, "wrk_mcp.lua", "/mcp"))
                c16[target].append(bench.wrk(target, "c16", 2, 16, args.seconds, "wrk_mcp.lua", "/mcp"))
    finally:
        procs.stop_all()

    rows = {}
    for target in TARGETS:
        p50 = statistics.median(run["lat_p50_us"] for run in c1[target]) / 1000
        cpu = statistics.median(run["proxy_cpu_s"] / max(run["requests"], 1) for run in c16[target]) * 1e6
        errors = sum(run["errors"] for run in c1[target] + c16[target])
        rows[target] = {"c1_p50_ms": p50, "cpu_us_c16": cpu if target != "direct" else None, "errors": errors,
                        "c16_rps": statistics.median(run["requests"] / (run["duration_us"] / 1e6)
                                                     for run in c16[target])}
    direct = rows["direct"]["c1_p50_ms"]
    idle_cpu = rows["idle"]["cpu_us_c16"]
    lines = ["| target | c1 p50 ms | added p50 ms | CPU µs/req c16 | × idle CPU | c16 req/s | errors |",
             "|---|---|---|---|---|---|---|"]
    for target, row in rows.items():
        cpu = row["cpu_us_c16"]
        lines.append(f"| {target} | {row['c1_p50_ms']:.3f} | {row['c1_p50_ms'] - direct:+.3f} | "
                     f"{'–' if cpu is None else f'{cpu:.0f}'} | {'–' if cpu is None else f'{cpu / idle_cpu:.2f}'} | "
                     f"{row['c16_rps']:.0f} | {row['errors']} |")
    table = "\n".join(lines)
    print(table)
    (args.out / "summary.md").write_text(table + "\n")
    (args.out / "results.json").write_text(json.dumps({"rows": rows, "c1": c1, "c16": c16}, indent=1))
    ok = all(rows[t]["cpu_us_c16"] <= 2 * idle_cpu for t in ("tools-list", "jsonrpc"))
    print(f"rules active cost at most 2x idle CPU: {'yes' if ok else 'NO'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
