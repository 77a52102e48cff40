"""Micro-benchmark: the cost of one `call` line in the perturbation log (budget: 5 µs).

Writes N call lines with the fields the HTTP adapter gives, to /dev/null and to a real file, with
the log's own batching (a write every CALL_FLUSH_S), and prints the best of several rounds in
microseconds of CPU per line. One listener (as with the control API's metrics) can be added with --listener.

    .venv/bin/python bench/log_line.py [--lines 200000] [--rounds 5] [--listener]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from chaosproxy.telemetry.log import CALL_FLUSH_S, PerturbationLog, open_log_file

BUDGET_US = 5.0
FIELDS = {"transport": "http", "session": "127.0.0.1", "route": "default", "http_method": "POST", "path": "/mcp",
          "status": 200, "outcome": "ok", "bytes_out": 231, "faults": [],
          "method": "tools/call", "tool": "search", "rpc_id": 17}


def per_line_us(path: Path, lines: int, listener: bool) -> float:
    log = PerturbationLog(open_log_file(path), run_id="0123456789ab", seed=42, path=path, batch_s=CALL_FLUSH_S)
    if listener:
        seen: list[int] = [0]
        log.subscribe(lambda fields: seen.__setitem__(0, seen[0] + 1))
    started = time.process_time()  # CPU time: the machine may be busy with other work
    for i in range(lines):
        log.call(**FIELDS, duration_ms=i / 1000)
    log.flush()
    took = time.process_time() - started
    log.close()
    return took / lines * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lines", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--listener", action="store_true", help="with one log listener subscribed")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        targets = {"/dev/null": Path(os.devnull), "a file": Path(folder) / "log.jsonl"}
        results = {name: min(per_line_us(path, args.lines, args.listener) for _ in range(args.rounds))
                   for name, path in targets.items()}
    for name, us in results.items():
        print(f"call line to {name}: {us:.2f} µs (best of {args.rounds} x {args.lines} lines; budget {BUDGET_US} µs)")
    return 0 if all(us <= BUDGET_US for us in results.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
