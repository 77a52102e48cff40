#!/usr/bin/env python3
"""chaosproxy benchmark: direct vs chaosproxy (no faults) vs a minimal aiohttp proxy, side by side.

    .venv/bin/python bench/run.py [--quick] [--out DIR] [--targets direct,chaos,...]

Loopback only. Every process is started in its own session and stopped by its process group;
every wait has a deadline. Prints a Markdown table, writes results.json, raw wrk output and
process logs to --out. What each figure means: bench/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
PY = sys.executable
CHAOS = str(Path(PY).parent / "chaosproxy")
TICK = os.sysconf("SC_CLK_TCK")
MIB, GIB = 1 << 20, 1 << 30
SSE_EVENTS, SSE_GAP_MS = 20, 50
TARGETS = ["direct", "chaos", "chaos-log", "aiohttp", "aiohttp-uvloop"]
BUDGET = {"add_p50_ms": 0.3, "cpu_us_c64": 250, "sse_add_ttfe_ms": 2.0, "mib_ratio": 0.3, "gib_rss_growth_mib": 32}
PROFILES = {  # c1 rounds x seconds, c64 / 1 MiB seconds, SSE repetitions
    "full": {"rounds": 3, "c1_s": 5, "c64_s": 6, "mib_s": 5, "sse_reps": 5},
    "quick": {"rounds": 2, "c1_s": 2, "c64_s": 2, "mib_s": 2, "sse_reps": 2},
}


class Procs:
    """Background processes, each the leader of its own process group."""

    def __init__(self, logdir: Path) -> None:
        self.logdir = logdir
        self.running: dict[str, subprocess.Popen] = {}

    def start(self, name: str, argv: list[str]) -> subprocess.Popen:
        with open(self.logdir / f"{name}.log", "wb") as log:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        self.running[name] = proc
        return proc

    def stop_all(self) -> None:
        for proc in self.running.values():
            _killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 5
        for proc in self.running.values():
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def wait_ready(name: str, port: int, proc: subprocess.Popen, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode}; see its log")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{name} not ready on port {port} after {timeout:.0f} s")


def cpu_s(pid: int | None) -> float:
    """utime + stime of a process (all its threads), in seconds."""
    if pid is None:
        return 0.0
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


class Bench:
    def __init__(self, out: Path, ports: dict[str, int], pids: dict[str, int | None], upstream_pid: int) -> None:
        self.out, self.ports, self.pids, self.upstream_pid = out, ports, pids, upstream_pid

    def wrk(self, target: str, test: str, threads: int, conns: int, seconds: float, lua: str, path: str) -> dict:
        """One wrk run; adds the proxy's and the upstream's CPU seconds spent during it."""
        pid = self.pids[target]
        argv = ["wrk", f"-t{threads}", f"-c{conns}", f"-d{seconds}s", "--timeout", "5s", "-s", str(HERE / lua),
                f"http://127.0.0.1:{self.ports[target]}{path}"]
        p0, u0 = cpu_s(pid), cpu_s(self.upstream_pid)
        run = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 15)
        p1, u1 = cpu_s(pid), cpu_s(self.upstream_pid)
        with open(self.out / "raw" / f"{target}-{test}.txt", "a") as raw:
            raw.write(run.stdout + run.stderr)
        line = next((ln for ln in run.stdout.splitlines() if ln.startswith("JSON ")), None)
        if line is None:
            raise RuntimeError(f"wrk {test} on {target}: no result: {run.stderr.strip()}")
        result = json.loads(line[5:])
        result.update(proxy_cpu_s=p1 - p0, upstream_cpu_s=u1 - u0,
                      errors=sum(v for k, v in result.items() if k.startswith("err_")))
        time.sleep(0.3)  # let the sockets of this run close before the next
        return result

    def sse(self, target: str, reps: int) -> list[tuple[float | None, float | None, int]]:
        return [asyncio.run(sse_once(self.ports[target])) for _ in range(reps)]

    def gib(self, target: str) -> dict:
        """Stream 1 GiB through the target to curl (discarded), sampling the proxy's RSS every 20 ms."""
        pid = self.pids[target]
        assert pid is not None
        base = peak = rss_mib(pid)
        curl = subprocess.Popen(["curl", "-s", "-o", "/dev/null", "--max-time", "120", "-w",
                                 "%{http_code} %{size_download} %{time_total}",
                                 f"http://127.0.0.1:{self.ports[target]}/big?bytes={GIB}"],
                                stdout=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 125
            while curl.poll() is None and time.monotonic() < deadline:
                peak = max(peak, rss_mib(pid))
                time.sleep(0.02)
        finally:
            if curl.poll() is None:
                curl.kill()
            stdout = curl.communicate(timeout=5)[0]
        status, size, secs = stdout.split()
        return {"status": int(status), "bytes": int(size), "seconds": float(secs),
                "rss_base_mib": base, "rss_peak_mib": peak}


async def sse_once(port: int, timeout: float = 5.0) -> tuple[float | None, float | None, int]:
    """(ms to the first `data:`, ms to the last event, events seen) on a raw socket: no client buffering."""
    reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), timeout)
    request = (f"GET /sse?n={SSE_EVENTS}&interval_ms={SSE_GAP_MS} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
               "Accept: text/event-stream\r\nConnection: close\r\n\r\n").encode()
    buf, first, last = bytearray(), None, None
    t0 = time.perf_counter()
    writer.write(request)
    try:
        while (left := t0 + timeout - time.perf_counter()) > 0:
            chunk = await asyncio.wait_for(reader.read(65536), left)
            if not chunk:
                break
            buf += chunk
            seen = buf.count(b"data:")
            if first is None and seen:
                first = (time.perf_counter() - t0) * 1000
            if seen >= SSE_EVENTS:
                last = (time.perf_counter() - t0) * 1000
                break
    except TimeoutError:
        pass
    finally:
        writer.close()
    return first, last, buf.count(b"data:")


def measure(bench: Bench, targets: list[str], prof: dict) -> dict[str, dict]:
    res: dict[str, dict] = {t: {"c1": []} for t in targets}
    proxies = [t for t in targets if t != "direct"]
    log("warm-up")
    for t in targets:
        bench.wrk(t, "warmup", 2, 8, 1, "wrk_post.lua", "/echo/tool")
    for r in range(prof["rounds"]):  # interleaved, so every target sees the same noise
        log(f"c1 POST round {r + 1}/{prof['rounds']}")
        for t in targets:
            res[t]["c1"].append(bench.wrk(t, "c1", 1, 1, prof["c1_s"], "wrk_post.lua", "/echo/tool"))
    log("c64 POST")
    for t in targets:
        res[t]["c64"] = bench.wrk(t, "c64", 2, 64, prof["c64_s"], "wrk_post.lua", "/echo/tool")
    log("1 MiB GET, c8")
    for t in targets:
        res[t]["mib"] = bench.wrk(t, "mib", 2, 8, prof["mib_s"], "wrk_get.lua", f"/big?bytes={MIB}")
    log("SSE time to first event")
    for t in targets:
        res[t]["sse"] = bench.sse(t, prof["sse_reps"])
    for t in proxies:
        log(f"1 GiB GET through {t}")
        res[t]["gib"] = bench.gib(t)
    return res


def summarise(res: dict[str, dict]) -> dict[str, dict]:
    d = res["direct"]
    out: dict[str, dict] = {}
    for t, r in res.items():
        c1, c64, mib = r["c1"], r["c64"], r["mib"]
        c1_req = sum(x["requests"] for x in c1)
        ttfe = [x[0] for x in r["sse"] if x[0] is not None]
        total = [x[1] for x in r["sse"] if x[1] is not None]
        f = {
            "c1_p50_ms": statistics.median(x["lat_p50_us"] for x in c1) / 1000,
            "add_p50_ms": statistics.median((x["lat_p50_us"] - y["lat_p50_us"]) / 1000 for x, y in zip(c1, d["c1"])),
            "c1_rps": c1_req / sum(x["duration_us"] for x in c1) * 1e6,
            "c64_rps": c64["requests"] / c64["duration_us"] * 1e6,
            "mib_mibs": mib["bytes"] / mib["duration_us"] * 1e6 / MIB,
            "sse_ttfe_ms": statistics.median(ttfe) if ttfe else None,
            "sse_total_ms": statistics.median(total) if total else None,
            "sse_events_min": min(x[2] for x in r["sse"]),
            "errors": sum(x["errors"] for x in [*c1, c64, mib]),
        }
        f["c64_ratio"] = f["c64_rps"] / (d["c64"]["requests"] / d["c64"]["duration_us"] * 1e6)
        f["mib_ratio"] = f["mib_mibs"] / (d["mib"]["bytes"] / d["mib"]["duration_us"] * 1e6 / MIB)
        d_ttfe = [x[0] for x in d["sse"] if x[0] is not None]
        if ttfe and d_ttfe:
            f["sse_add_ttfe_ms"] = f["sse_ttfe_ms"] - statistics.median(d_ttfe)
        if t != "direct":
            f["cpu_us_c1"] = sum(x["proxy_cpu_s"] for x in c1) / c1_req * 1e6
            f["cpu_us_c64"] = c64["proxy_cpu_s"] / c64["requests"] * 1e6
            f["cpu_ms_per_mib"] = mib["proxy_cpu_s"] * 1000 / (mib["bytes"] / MIB)
            g = r["gib"]
            f.update(gib_ok=g["status"] == 200 and g["bytes"] == GIB, gib_mibs=g["bytes"] / MIB / g["seconds"],
                     gib_rss_base_mib=g["rss_base_mib"], gib_rss_peak_mib=g["rss_peak_mib"],
                     gib_rss_growth_mib=g["rss_peak_mib"] - g["rss_base_mib"])
        out[t] = f
    return out


def verdicts(f: dict) -> dict[str, bool]:
    return {
        "add_p50_ms": f["add_p50_ms"] <= BUDGET["add_p50_ms"],
        "cpu_us_c64": f["cpu_us_c64"] <= BUDGET["cpu_us_c64"],
        "sse_add_ttfe_ms": f.get("sse_add_ttfe_ms") is not None and f["sse_add_ttfe_ms"] <= BUDGET["sse_add_ttfe_ms"]
        and f["sse_events_min"] >= SSE_EVENTS,
        "mib_ratio": f["mib_ratio"] >= BUDGET["mib_ratio"],
        "gib_rss_growth_mib": f["gib_ok"] and f["gib_rss_growth_mib"] <= BUDGET["gib_rss_growth_mib"],
    }


COLUMNS = [  # key, header, format
    ("c1_p50_ms", "c1 p50 ms", "{:.3f}"), ("add_p50_ms", "added p50 ms", "{:+.3f}"),
    ("cpu_us_c1", "CPU µs/req c1", "{:.0f}"), ("cpu_us_c64", "CPU µs/req c64", "{:.0f}"),
    ("c64_rps", "c64 req/s", "{:.0f}"), ("c64_ratio", "c64 ×direct", "{:.2f}"),
    ("mib_mibs", "1 MiB MiB/s", "{:.0f}"), ("mib_ratio", "1 MiB ×direct", "{:.2f}"),
    ("cpu_ms_per_mib", "CPU ms/MiB", "{:.2f}"),
    ("sse_ttfe_ms", "SSE 1st event ms", "{:.2f}"), ("sse_add_ttfe_ms", "SSE added ms", "{:+.2f}"),
    ("sse_total_ms", "SSE last event ms", "{:.0f}"),
    ("gib_mibs", "1 GiB MiB/s", "{:.0f}"), ("gib_rss_peak_mib", "1 GiB peak RSS MiB", "{:.1f}"),
    ("gib_rss_growth_mib", "RSS growth MiB", "{:+.1f}"), ("errors", "errors", "{}"),
]


def table(summary: dict[str, dict], checks: dict[str, dict[str, bool]]) -> str:
    def cell(t: str, key: str, fmt: str) -> str:
        v = summary[t].get(key)
        text = "–" if v is None else fmt.format(v)
        return text + (" ✗" if checks.get(t, {}).get(key) is False else "")

    lines = ["| target | " + " | ".join(h for _, h, _ in COLUMNS) + " |", "|---" * (len(COLUMNS) + 1) + "|"]
    lines += [f"| {t} | " + " | ".join(cell(t, k, f) for k, _, f in COLUMNS) + " |" for t in summary]
    budget = (f"Budget (chaos*): added p50 ≤ {BUDGET['add_p50_ms']} ms, CPU ≤ {BUDGET['cpu_us_c64']} µs/req at c64, "
              f"SSE first event ≤ {BUDGET['sse_add_ttfe_ms']} ms after direct with all {SSE_EVENTS} events, "
              f"1 MiB ≥ {BUDGET['mib_ratio']}× direct, 1 GiB body with RSS growth ≤ "
              f"{BUDGET['gib_rss_growth_mib']} MiB. ✗ marks a miss.")
    verdict = ", ".join(f"{t}: {'PASS' if all(c.values()) else 'FAIL'}" for t, c in checks.items())
    return "\n".join(lines) + f"\n\n{budget}\n{verdict}\n"


T0 = time.monotonic()


def log(msg: str) -> None:
    print(f"[{time.monotonic() - T0:5.1f}s] {msg}", file=sys.stderr, flush=True)


def meta() -> dict:
    git = subprocess.run(["git", "-C", str(HERE.parent), "describe", "--always", "--dirty"],
                         capture_output=True, text=True, timeout=10).stdout.strip()
    versions = subprocess.run([PY, "-c", "import aiohttp, chaosproxy; print(aiohttp.__version__, chaosproxy.__version__)"],
                              capture_output=True, text=True, timeout=30).stdout.split()
    return {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "nproc": os.cpu_count(), "python": platform.python_version(),
            "aiohttp": versions[0], "chaosproxy": versions[1], "git": git,
            "wrk": subprocess.run(["wrk", "-v"], capture_output=True, text=True, timeout=10).stdout.split("\n")[0],
            "loadavg_start": Path("/proc/loadavg").read_text().split()[:3]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="shorter runs (about a minute)")
    ap.add_argument("--out", type=Path, help="results folder (default /tmp/chaosproxy-bench-DATE)")
    ap.add_argument("--targets", default=",".join(TARGETS), help=f"comma-separated subset of {','.join(TARGETS)}")
    args = ap.parse_args()
    targets = ["direct"] + [t for t in TARGETS[1:] if t in args.targets.split(",")]
    for tool in ("wrk", "curl"):
        if shutil.which(tool) is None:
            sys.exit(f"{tool} not found (apt-get install -y {tool})")
    out = args.out or Path(f"/tmp/chaosproxy-bench-{time.strftime('%Y%m%d-%H%M%S')}")
    (out / "raw").mkdir(parents=True, exist_ok=True)
    (out / "logs").mkdir(exist_ok=True)
    prof = PROFILES["quick" if args.quick else "full"]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the finally below on SIGTERM too

    info = meta()
    procs = Procs(out / "logs")
    uport, *pports = free_ports(len(TARGETS))
    ports = {"direct": uport, **dict(zip(TARGETS[1:], pports))}
    up = f"http://127.0.0.1:{uport}"
    argvs = {
        "chaos": [CHAOS, "run", "--upstream", up, "--listen", f"127.0.0.1:{ports['chaos']}", "--log", "/dev/null"],
        "chaos-log": [CHAOS, "run", "--upstream", up, "--listen", f"127.0.0.1:{ports['chaos-log']}",
                      "--log", str(out / "chaos-calls.jsonl")],
        "aiohttp": [PY, str(HERE / "aioproxy.py"), "--listen", f"127.0.0.1:{ports['aiohttp']}", "--upstream", up],
        "aiohttp-uvloop": [PY, str(HERE / "aioproxy.py"), "--listen", f"127.0.0.1:{ports['aiohttp-uvloop']}",
                           "--upstream", up, "--uvloop"],
    }
    try:
        upstream = procs.start("upstream", [PY, "-m", "chaosproxy.demo.tool_server", "--port", str(uport)])
        wait_ready("upstream", uport, upstream)
        pids: dict[str, int | None] = {"direct": None}
        for t in targets[1:]:
            proc = procs.start(t, argvs[t])
            wait_ready(t, ports[t], proc)
            pids[t] = proc.pid
        log(f"targets {', '.join(f'{t}:{ports[t]}' for t in targets)}; results in {out}")
        res = measure(Bench(out, ports, pids, upstream.pid), targets, prof)
    finally:
        procs.stop_all()
    summary = summarise(res)
    checks = {t: verdicts(f) for t, f in summary.items() if t.startswith("chaos")}
    info["loadavg_end"] = Path("/proc/loadavg").read_text().split()[:3]
    info.update(profile=prof, budget=BUDGET, elapsed_s=round(time.monotonic() - T0, 1))
    (out / "results.json").write_text(json.dumps(
        {"meta": info, "summary": summary, "checks": checks, "raw": res}, indent=1))
    report = table(summary, checks)
    (out / "summary.md").write_text(report)
    print(report)
    log(f"done; {out}/results.json")
    return 0 if all(all(c.values()) for c in checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
