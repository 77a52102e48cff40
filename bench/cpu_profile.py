#!/usr/bin/env python3
"""Where a proxy's CPU goes: py-spy samples it under wrk load (small JSON POST), loopback only.

    .venv/bin/python bench/cpu_profile.py [--target chaos] [--conns 64] [--seconds 10] [--top 25] [--out DIR]
    .venv/bin/python bench/cpu_profile.py --compare chaos,fastrelay [--rounds 3] [--seconds 3]
    add --upstream node for a Node http server upstream (its answers carry keep-alive lines)

Needs py-spy in the venv (.venv/bin/pip install py-spy). py-spy runs --nonblocking, so the target is
not slowed down and the measured CPU per request holds; each function's share of the samples is
turned into µs of CPU per request. DIR/TARGET-cCONNS.txt keeps the collapsed stacks (for
flamegraph.pl or speedscope).

--compare skips py-spy and only measures CPU per request (user and kernel) of several targets, taken
in turn for --rounds rounds: a quick before/after check of a change (bench/run.py is the full report).
"""

from __future__ import annotations

import argparse
import collections
import statistics
import sys
import time
from pathlib import Path

from run import TARGETS, Bench, Procs, log, start_targets

PYSPY = str(Path(sys.executable).parent / "py-spy")


def tops(stacks: Path, n: int) -> tuple[int, list[tuple[str, int]], list[tuple[str, int]]]:
    """Total samples, and the `n` frames with the most samples, self and inclusive."""
    own, incl, total = collections.Counter(), collections.Counter(), 0
    for line in stacks.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames, samples = stack.split(";"), int(count)
        total += samples
        own[frames[-1]] += samples
        for frame in set(frames):
            incl[frame] += samples
    return total, own.most_common(n), incl.most_common(n)


def compare(targets: list[str], conns: int, seconds: int, rounds: int, out: Path, upstream: str) -> int:
    """Median CPU µs per request (and its kernel part) of each target at `conns` connections."""
    procs = Procs(out / "logs")
    samples: dict[str, list[tuple[float, float, float]]] = {t: [] for t in targets}
    try:
        ports, pids, upstream_pid = start_targets(procs, ["direct", *targets], out, upstream)
        bench = Bench(out, ports, pids, upstream_pid)
        for target in targets:
            bench.wrk(target, "warmup", 2, 8, 1, "wrk_post.lua", "/echo/tool")
        for _ in range(rounds):
            for target in targets:
                r = bench.wrk(target, f"c{conns}", min(2, conns), conns, seconds, "wrk_post.lua", "/echo/tool")
                samples[target].append((r["proxy_cpu_s"] / r["requests"] * 1e6,
                                        r["proxy_sys_s"] / r["requests"] * 1e6,
                                        r["requests"] / r["duration_us"] * 1e6))
    finally:
        procs.stop_all()
    print(f"\n| target | CPU µs/req c{conns} | of it kernel | req/s |\n|---|---|---|---|")
    for target, rows in samples.items():
        cpu, sys_, rps = (statistics.median(col) for col in zip(*rows, strict=True))
        print(f"| {target} | {cpu:.1f} | {sys_:.1f} | {rps:.0f} |")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="chaos", choices=TARGETS[1:])
    ap.add_argument("--conns", type=int, default=64)
    ap.add_argument("--seconds", type=int, default=10)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--compare", help="comma-separated targets: CPU per request only, no py-spy")
    ap.add_argument("--rounds", type=int, default=3, help="with --compare: rounds over the targets")
    ap.add_argument("--upstream", choices=["python", "node"], default="python",
                    help="the demo tool server, or a Node http server (bench/node_upstream.mjs: keep-alive lines)")
    ap.add_argument("--out", type=Path,
                    default=Path(f"/tmp/chaosproxy-profile-{time.strftime('%Y%m%d-%H%M%S')}"))
    args = ap.parse_args()
    (args.out / "raw").mkdir(parents=True, exist_ok=True)
    (args.out / "logs").mkdir(exist_ok=True)
    if args.compare:
        return compare(args.compare.split(","), args.conns, args.seconds, args.rounds, args.out, args.upstream)
    stacks = args.out / f"{args.target}-c{args.conns}.txt"
    procs = Procs(args.out / "logs")
    try:
        ports, pids, upstream_pid = start_targets(procs, ["direct", args.target], args.out, args.upstream)
        bench = Bench(args.out, ports, pids, upstream_pid)
        bench.wrk(args.target, "warmup", 2, 8, 1, "wrk_post.lua", "/echo/tool")
        spy = procs.start("py-spy", [PYSPY, "record", "--nonblocking", "-r", "250", "-f", "raw", "-d",
                                     str(args.seconds), "-p", str(pids[args.target]), "-o", str(stacks)])
        time.sleep(1)  # py-spy attaches
        result = bench.wrk(args.target, f"c{args.conns}", min(2, args.conns), args.conns, args.seconds,
                           "wrk_post.lua", "/echo/tool")
        spy.wait(args.seconds + 15)
    finally:
        procs.stop_all()
    us_per_req = result["proxy_cpu_s"] / result["requests"] * 1e6
    total, own, incl = tops(stacks, args.top)
    log(f"{args.target} c{args.conns}: {result['requests'] / result['duration_us'] * 1e6:.0f} req/s, "
        f"{us_per_req:.0f} µs CPU/req, {total} samples; stacks in {stacks}")
    for title, rows in (("self", own), ("inclusive", incl)):
        print(f"\n{title:>9}  µs/req  function")
        for frame, samples in rows:
            print(f"{samples / total:8.1%}  {samples / total * us_per_req:6.1f}  {frame}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
