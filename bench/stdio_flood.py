"""Benchmark: the stdio relay's peak memory when the server floods and the host stops reading.

The server answers one request with N notifications of 1 MiB each, written as fast as the pipe takes
them, then the reply. The host sends the request and reads nothing for --stall seconds, then reads
everything. Measured side by side in one run: the relay with no rules, and with every server message
delayed (`latency delay_ms: 100, phase: response`). Printed: the relay's peak RSS (VmHWM) while the host
stalls, and whether all N notifications and the reply arrived, in order, afterwards.

A held direction is bounded by LANE_BYTES of lines (chaosproxy/adapters/stdio.py) plus the line in
hand, so the delayed run's peak must stay under BOUND_MIB; the exit status says whether it did.

    .venv/bin/python bench/stdio_flood.py [--notes 300] [--stall 4]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

BOUND_MIB = 128  # the documented bound on the relay's RSS under a flood with a delay rule
WAIT = 120  # seconds: the bound on any one wait
NOTE_BYTES = 1 << 20

FLOOD_SERVER = '''\
import json, sys
request = json.loads(sys.stdin.buffer.readline())
out = sys.stdout.buffer
pad = "x" * {note_bytes}
for i in range({notes}):
    note = {{"jsonrpc": "2.0", "method": "notifications/message", "params": {{"level": "info", "data": [i, pad]}}}}
    out.write(json.dumps(note).encode() + b"\\n")
out.write(json.dumps({{"jsonrpc": "2.0", "id": request["id"], "result": {{}}}}).encode() + b"\\n")
out.flush()
sys.stdin.buffer.read()  # until the host hangs up
'''

DELAYED = "rules:\n  - name: late\n    fault: {type: latency, delay_ms: 100, phase: response}\n"


def peak_rss_mib(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text().splitlines()
    return int(next(line for line in status if line.startswith("VmHWM")).split()[1]) / 1024


def run(folder: Path, notes: int, stall: float, scenario: str | None) -> tuple[float, bool, float]:
    """One flood through a relay: (peak RSS in MiB while the host stalls, everything arrived, seconds
    the host took to read it all once it read)."""
    server = folder / "flood.py"
    server.write_text(FLOOD_SERVER.format(notes=notes, note_bytes=NOTE_BYTES))
    flags: list[str] = []
    if scenario is not None:
        (folder / "s.yaml").write_text(scenario)
        flags = ["--scenario", str(folder / "s.yaml")]
    relay = subprocess.Popen([sys.executable, "-m", "chaosproxy", "stdio", *flags, "--log", str(folder / "log"),
                              "--", sys.executable, str(server)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert relay.stdin is not None and relay.stdout is not None
    watchdog = threading.Timer(WAIT, relay.kill)  # bounded, whatever happens
    watchdog.start()
    try:
        relay.stdin.write(b'{"jsonrpc": "2.0", "id": 1, "method": "flood", "params": {}}\n')
        relay.stdin.flush()
        time.sleep(stall)  # the host reads nothing meanwhile
        peak = peak_rss_mib(relay.pid)
        started = time.monotonic()
        seen = [json.loads(relay.stdout.readline()) for _ in range(notes + 1)]
        read_s = time.monotonic() - started
        complete = ([m["params"]["data"][0] for m in seen[:-1]] == list(range(notes))
                    and seen[-1].get("id") == 1)
        relay.stdin.close()
        relay.wait(WAIT)
        return peak, complete, read_s
    finally:
        watchdog.cancel()
        if relay.poll() is None:
            relay.kill()
            relay.wait(WAIT)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--notes", type=int, default=300, help="notifications of 1 MiB the server floods")
    parser.add_argument("--stall", type=float, default=4.0, help="seconds the host reads nothing")
    args = parser.parse_args()
    results = {}
    for name, scenario in (("no rules", None), ("latency 100 ms at response", DELAYED)):
        with tempfile.TemporaryDirectory() as folder:
            results[name] = run(Path(folder), args.notes, args.stall, scenario)
    for name, (peak, complete, read_s) in results.items():
        print(f"{name:>28}: relay peak RSS {peak:6.0f} MiB with the host stalled {args.stall:g} s; "
              f"{args.notes} x 1 MiB then read in {read_s:.1f} s, {'all in order' if complete else 'INCOMPLETE'}")
    delayed_peak, delayed_complete, _ = results["latency 100 ms at response"]
    print(f"bound under a delay rule: {BOUND_MIB} MiB")
    return 0 if delayed_peak <= BOUND_MIB and all(done for _, done, _ in results.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
