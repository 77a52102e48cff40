"""Proxy start-up: from asking for a `chaosproxy run` (a drill does, once per run) to its listening line.

  .venv/bin/python bench/startup.py [--runs 20] [--scenario FILE]

Two ways, side by side: a fresh process (`python -m chaosproxy run`, as anyone starts it), and a child
forked by the drill's warm launcher (chaosproxy/drill/launcher.py, how a local drill starts its runs'
proxies). Prints the median and spread of the wall time and of the process's own CPU time (user +
system, from /proc when it says it listens), and the share of the CPUs other processes used meanwhile:
on a busy machine the wall time grows with the load while the CPU time stays near what start-up costs.
The upstream is never called (nothing is sent); every proxy is stopped (SIGTERM, SIGKILL after 5 s).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_SCENARIO = ROOT / "scenarios" / "transition" / "server_error.yaml"
TICK = os.sysconf("SC_CLK_TCK")


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def _busy_jiffies() -> tuple[int, int]:
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return sum(values) - values[3] - values[4], sum(values)


def _argv(scenario: Path) -> list[str]:
    return [
        "run",
        "--upstream",
        "http://127.0.0.1:9",
        "--listen",
        "127.0.0.1:0",
        "--scenario",
        str(scenario),
        "--seed",
        "1",
        "--log",
        os.devnull,
    ]


def start_once(scenario: Path) -> tuple[float, float]:
    """Wall and CPU seconds from spawn to the `listening on` line."""
    started = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "chaosproxy", *_argv(scenario)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert proc.stderr is not None
        for line in proc.stderr:  # bounded: the proxy says it listens, or exits and the pipe closes
            if "listening on" in line:
                return time.perf_counter() - started, _cpu_s(proc.pid)
        raise RuntimeError(f"chaosproxy run exited with {proc.wait()} before listening")
    finally:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


async def launched(scenario: Path, runs: int, scratch: Path) -> list[tuple[float, float]]:
    """Wall and CPU seconds from asking the drill's launcher for a proxy to its `listening on` line."""
    sys.path.insert(0, str(ROOT))
    from chaosproxy.drill.launcher import Launcher

    launcher = await Launcher.start()
    times = []
    try:
        for n in range(runs + 1):  # the first one warms up
            stderr = scratch / f"proxy-{n}.stderr"
            started = time.perf_counter()
            child = await launcher.launch(_argv(scenario), dict(os.environ), stderr)
            async with asyncio.timeout(60):
                while re.search(rb"listening on", stderr.read_bytes()) is None:
                    await asyncio.sleep(0.001)
            times.append((time.perf_counter() - started, _cpu_s(child.pid)))
            os.kill(child.pid, 15)
            await asyncio.wait_for(child.wait(), 10)
    finally:
        await launcher.close()
    return times[1:]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--scenario", type=Path, default=DEFAULT_SCENARIO)
    args = parser.parse_args()
    start_once(args.scenario)  # warm the file cache and the bytecode

    def ms(values: tuple[float, ...]) -> str:
        return (
            f"median {statistics.median(values) * 1000:.0f} ms (min {min(values) * 1000:.0f}, "
            f"max {max(values) * 1000:.0f})"
        )

    with tempfile.TemporaryDirectory() as scratch:
        for way, measure in (
            ("a fresh process", lambda: [start_once(args.scenario) for _ in range(args.runs)]),
            (
                "forked by the drill's launcher",
                lambda: asyncio.run(launched(args.scenario, args.runs, Path(scratch))),
            ),
        ):
            busy0, total0 = _busy_jiffies()
            walls, cpus = zip(*measure(), strict=True)
            busy1, total1 = _busy_jiffies()
            others = (busy1 - busy0 - sum(cpus) * TICK) / max(total1 - total0, 1)
            print(
                f"chaosproxy run start-up to listening, {way}, {args.runs} runs: wall {ms(walls)}; "
                f"own CPU {ms(cpus)}; other processes used {max(others, 0) * 100:.0f}% of the CPUs meanwhile"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
