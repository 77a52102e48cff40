#!/usr/bin/env python3
"""LLM-gateway mode: a ~200 KB Chat Completions request (a 40-turn tool-calling history, 50 tools) through
chaosproxy, CPU per request with no rule, with a tools-array rule and with a prompt rule.

    flock /tmp/chaosproxy-bench.lock .venv/bin/python bench/llm_gateway.py [--rounds 3] [--requests 200]

Upstream: the bundled scripted model (chaosproxy.demo.llm_server). Targets: `direct`; `no-rule`
(chaosproxy, empty scenario: the body is not parsed); `tools-array` (rename_tool on one of the 50 tools:
every request parsed, its tools array rewritten and re-serialised, replies watched for calls to undo);
`prompt` (prompt_typos: every request parsed, the newest user turn rewritten). Reported per target:
the proxy's CPU per request (sequential keep-alive requests, /proc ticks over the whole batch), added
p50 latency, and the time to the first streamed event of a streamed reply (the model pauses 20 ms
between events) against direct. Target (issue 9): a rule costs at most 1.5 ms CPU over no-rule, and
first-event latency is unchanged (streams no rule rewrites are not buffered).

Streamed replies (issue 24), from a second scripted model that does not pause: a small request whose
reply is a ~550-event stream, CPU per request through `stream:no-rule`, `stream:cannot-match` (every
model-API fault on a model the request does not name: the stream passes untouched) and
`stream:never-fires` (the same faults matching, held back by their gates: every event is read, none is
rebuilt). Target: cannot-match costs what no-rule costs, in the same run (within 5% or 0.05 ms).
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import sys
import time
from pathlib import Path

from run import PY, Procs, cpu_s, free_ports, log, start_scenarios, wait_ready

SCENARIOS = {
    "no-rule": "rules: []\n",
    "tools-array": "rules:\n  - name: rename\n    fault: {type: rename_tool, tool: tool_07, style: case}\n",
    "prompt": "rules:\n  - name: typos\n    fault: {type: prompt_typos, rate: 0.05}\n",
}
TARGETS = ["direct", *SCENARIOS]
MODEL_FAULTS = ["{type: malformed_tool_call, kind: wrong_types}", "{type: hallucinated_tool_call}",
                "{type: empty_completion}", "{type: llm_stream_error, after_events: 1}"]
STREAM_SCENARIOS = {
    "stream:no-rule": "rules: []\n",
    "stream:cannot-match": "rules:\n" + "".join(f"  - {{name: r{i}, match: {{model: other-model}}, fault: {fault}}}\n"
                                                for i, fault in enumerate(MODEL_FAULTS)),
    "stream:never-fires": "rules:\n" + "".join(f"  - {{name: r{i}, after: 1000000, fault: {fault}}}\n"
                                               for i, fault in enumerate(MODEL_FAULTS)),
}
STREAM_TARGETS = ["stream:direct", *STREAM_SCENARIOS]
PATH = "/v1/chat/completions"
HEADERS = {"Content-Type": "application/json", "Authorization": "Bearer sk-bench"}


def request_body(stream: bool = False) -> bytes:
    """A 40-turn conversation with 50 tools: each turn a user message, a tool call and a ~3.5 KB result."""
    tools = [{"type": "function", "function": {
        "name": f"tool_{i:02d}", "description": f"Look up records of kind {i} in the inventory service. " * 6,
        "parameters": {"type": "object", "properties": {
            "query": {"type": "string", "description": "What to look for, in plain words."},
            "limit": {"type": "integer", "description": "How many records to return at most."}},
            "required": ["query"]}}} for i in range(50)]
    messages: list[dict] = [{"role": "system", "content": "You are an inventory assistant."}]
    for turn in range(40):
        call_id = f"call_{turn:03d}"
        messages += [
            {"role": "user", "content": f"Turn {turn}: how many widgets of batch {turn} are in stock?"},
            {"role": "assistant", "content": None, "tool_calls": [{"id": call_id, "type": "function", "function": {
                "name": f"tool_{turn % 50:02d}", "arguments": json.dumps({"query": f"batch {turn}"})}}]},
            {"role": "tool", "tool_call_id": call_id, "content": json.dumps(
                {"records": [{"sku": f"W-{turn}-{k}", "count": k, "note": "stored in aisle 4, shelf B"}
                             for k in range(60)]})},
            {"role": "assistant", "content": f"Batch {turn} has plenty in stock."}]
    messages.append({"role": "user", "content": "Thanks. Now summarise the stock of every batch in one table."})
    return json.dumps({"model": "gpt-bench", "messages": messages, "tools": tools, "stream": stream}).encode()


def streamed_body() -> bytes:
    """A small request whose reply streams long: the scripted model says the ~4.4 KB prompt back, 8 characters
    an event."""
    prompt = " ".join(f"Item {i} is on shelf {i % 7} of aisle {i % 5}." for i in range(150))
    return json.dumps({"model": "gpt-bench", "stream": True, "messages": [{"role": "user", "content": prompt}],
                       "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {
                           "type": "object", "properties": {"city": {"type": "string"}}}}}]}).encode()


def batch(port: int, body: bytes, count: int) -> list[float]:
    """`count` sequential requests on one keep-alive connection: their latencies in ms."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    latencies = []
    try:
        for _ in range(count):
            started = time.perf_counter()
            conn.request("POST", PATH, body, HEADERS)
            response = conn.getresponse()
            response.read()
            assert response.status == 200, response.status
            latencies.append((time.perf_counter() - started) * 1000)
    finally:
        conn.close()
    return latencies


def first_event_ms(port: int, body: bytes) -> float:
    """Time from sending a streamed request to reading its first event's first byte."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        started = time.perf_counter()
        conn.request("POST", PATH, body, HEADERS)
        response = conn.getresponse()
        response.read1(1)
        took = (time.perf_counter() - started) * 1000
        response.read()
        return took
    finally:
        conn.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=200, help="requests per target per round")
    parser.add_argument("--stream-requests", type=int, default=100, help="long streamed replies per target per round")
    parser.add_argument("--out", type=Path, default=Path(f"/tmp/chaosproxy-bench-llm-{time.strftime('%Y%m%d-%H%M%S')}"))
    args = parser.parse_args()
    (args.out / "logs").mkdir(parents=True, exist_ok=True)
    body, streamed, long_stream = request_body(), request_body(stream=True), streamed_body()
    log(f"request body: {len(body) / 1024:.0f} KiB")
    procs = Procs(args.out / "logs")
    try:
        uport, fast_port, *pports = free_ports(2 + len(SCENARIOS) + len(STREAM_SCENARIOS))
        ports = {"direct": uport, "stream:direct": fast_port,
                 **dict(zip([*SCENARIOS, *STREAM_SCENARIOS], pports, strict=True))}
        probe = ("POST", PATH, json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}), HEADERS)
        upstream = procs.start("upstream", [PY, "-m", "chaosproxy.demo.llm_server", "--port", str(uport),
                                            "--event-delay-ms", "20"])
        fast = procs.start("fast-upstream", [PY, "-m", "chaosproxy.demo.llm_server", "--port", str(fast_port)])
        wait_ready("upstream", uport, upstream, 30, probe)
        wait_ready("fast-upstream", fast_port, fast, 30, probe)
        pids = start_scenarios(procs, args.out, uport, ports, SCENARIOS, probe)
        pids |= start_scenarios(procs, args.out, fast_port, ports, STREAM_SCENARIOS, probe)
        pids["stream:direct"] = None
        cpu: dict[str, list[float]] = {t: [] for t in [*TARGETS, *STREAM_TARGETS]}
        p50: dict[str, list[float]] = {t: [] for t in [*TARGETS, *STREAM_TARGETS]}
        first: dict[str, list[float]] = {t: [] for t in TARGETS}
        for r in range(args.rounds):
            for target in [*TARGETS, *STREAM_TARGETS]:
                log(f"round {r + 1}: {target}")
                payload, count = (long_stream, args.stream_requests) if target.startswith("stream:") \
                    else (body, args.requests)
                batch(ports[target], payload, 10)  # warm up
                before = sum(cpu_s(pids[target]))
                latencies = batch(ports[target], payload, count)
                cpu[target].append((sum(cpu_s(pids[target])) - before) / count * 1000)
                p50[target].append(statistics.median(latencies))
                if not target.startswith("stream:"):
                    first[target] += [first_event_ms(ports[target], streamed) for _ in range(10)]
    finally:
        procs.stop_all()

    rows = {t: {"cpu_ms": statistics.median(cpu[t]), "p50_ms": statistics.median(p50[t]),
                "first_event_ms": statistics.median(first[t])} for t in TARGETS}
    base = rows["no-rule"]["cpu_ms"]
    lines = [f"request: {len(body) / 1024:.0f} KiB, 40 turns, 50 tools; "
             f"{args.rounds} rounds x {args.requests} requests",
             "", "| target | CPU ms/req | over no-rule | p50 ms | added p50 ms | first event ms | vs direct |",
             "|---|---|---|---|---|---|---|"]
    for target, row in rows.items():
        own = "–" if target == "direct" else f"{row['cpu_ms']:.2f}"
        over = "–" if target == "direct" else f"{row['cpu_ms'] - base:+.2f}"
        lines.append(f"| {target} | {own} | {over} | {row['p50_ms']:.2f} | "
                     f"{row['p50_ms'] - rows['direct']['p50_ms']:+.2f} | {row['first_event_ms']:.2f} | "
                     f"{row['first_event_ms'] - rows['direct']['first_event_ms']:+.2f} |")
    streams = {t: {"cpu_ms": statistics.median(cpu[t]), "p50_ms": statistics.median(p50[t])} for t in STREAM_TARGETS}
    events = len(json.loads(long_stream)["messages"][0]["content"]) // 8
    lines += ["", f"streamed reply: ~{events} events (a {len(long_stream) / 1024:.1f} KiB request); "
                  f"{args.rounds} rounds x {args.stream_requests} requests",
              "", "| target | CPU ms/req | over stream:no-rule | p50 ms |", "|---|---|---|---|"]
    stream_base = streams["stream:no-rule"]["cpu_ms"]
    for target, row in streams.items():
        own = "–" if target == "stream:direct" else f"{row['cpu_ms']:.3f}"
        over = "–" if target == "stream:direct" else f"{row['cpu_ms'] - stream_base:+.3f}"
        lines.append(f"| {target} | {own} | {over} | {row['p50_ms']:.2f} |")
    table = "\n".join(lines)
    print(table)
    (args.out / "summary.md").write_text(table + "\n")
    (args.out / "results.json").write_text(json.dumps({"rows": rows, "streams": streams, "cpu": cpu, "p50": p50,
                                                       "first": first}, indent=1))
    ok = all(rows[t]["cpu_ms"] - base <= 1.5 for t in ("tools-array", "prompt"))
    print(f"a rule costs at most 1.5 ms CPU over no-rule: {'yes' if ok else 'NO'}")
    gap = streams["stream:cannot-match"]["cpu_ms"] - stream_base
    same = gap <= max(0.05 * stream_base, 0.05)
    print(f"a streamed reply under rules that cannot match costs what it costs with no rule "
          f"({gap:+.3f} ms): {'yes' if same else 'NO'}")
    return 0 if ok and same else 1


if __name__ == "__main__":
    sys.exit(main())
