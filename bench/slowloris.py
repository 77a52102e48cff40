"""Hostile clients and the client limits (issue 35), side by side with nginx in one run, on loopback:

1. slowloris: N connections send a request head at one byte a second. Each proxy should close them at
   its head timeout (chaosproxy --client-header-timeout, nginx client_header_timeout; both set to
   --timeout here), while a normal client's p50 stays as it was; the proxy's memory should come back.
2. an unterminated 64 MiB header line: refused early (431), its memory given back once the client left.

    python bench/slowloris.py [--slow 500] [--timeout 10]     # about a minute; needs nginx (bench/README.md)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

NGINX_CONF = """
worker_processes 1; daemon off; pid {dir}/nginx.pid; error_log {dir}/error.log;
events {{ worker_connections 4096; }}
http {{
  access_log off; client_header_timeout {timeout}s; keepalive_timeout 75s;
  upstream tools {{ server 127.0.0.1:{upstream}; keepalive 32; }}
  server {{ listen 127.0.0.1:{port}; location / {{ proxy_pass http://tools; proxy_http_version 1.1;
           proxy_set_header Connection ""; proxy_buffering off; }} }}
}}
"""


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_port(port: int, proc: subprocess.Popen, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"exited with {proc.returncode}"
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listening on {port}")


async def p50_ms(port: int, seconds: float) -> float:
    """A normal client's median latency for GET /health over one keep-alive connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    took = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        started = time.perf_counter()
        writer.write(b"GET /health HTTP/1.1\r\nHost: a\r\n\r\n")
        await asyncio.wait_for(reader.readuntil(b"ok"), 5)
        took.append((time.perf_counter() - started) * 1000)
        await asyncio.sleep(0.01)
    writer.close()
    return statistics.median(took)


async def slow_head(port: int, closed_after: list[float], give_up: float) -> None:
    """A head at one byte a second; records when the server closed the connection."""
    started = time.monotonic()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return
    head = b"GET /health HTTP/1.1\r\nHost: a\r\nX-Slow: " + b"z" * 200
    try:
        async with asyncio.timeout(give_up):
            for byte in head:
                writer.write(bytes([byte]))
                await writer.drain()
                try:
                    if await asyncio.wait_for(reader.read(4096), 1.0) == b"":
                        break
                except TimeoutError:
                    continue
                while await reader.read(4096):  # an answer (408): read to the close
                    pass
                break
        closed_after.append(time.monotonic() - started)
    except (TimeoutError, ConnectionError):
        pass
    finally:
        writer.close()


async def slowloris(name: str, port: int, pid: int, slow: int, timeout: float) -> None:
    before = await p50_ms(port, 2)
    rss0 = rss_kib(pid)
    closed: list[float] = []
    attack = asyncio.gather(*(slow_head(port, closed, timeout * 3) for _ in range(slow)))
    await asyncio.sleep(1)
    during = await p50_ms(port, min(timeout - 2, 5))
    rss1 = rss_kib(pid)
    await attack
    await asyncio.sleep(1)
    after_rss = rss_kib(pid)
    share = f"{len(closed)}/{slow} closed" + (f", median at {statistics.median(closed):.1f} s" if closed else "")
    print(f"| {name} | {before:.3f} | {during:.3f} | {share} | {rss0 / 1024:.1f} | {rss1 / 1024:.1f} | "
          f"{after_rss / 1024:.1f} |")


def big_header(name: str, port: int, pid: int) -> None:
    rss0 = rss_kib(pid)
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    answer = b""
    started = time.monotonic()
    try:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: a\r\nX-Big: ")
        chunk = b"v" * (1 << 20)
        for _ in range(64):
            sock.sendall(chunk)
    except OSError:
        pass
    with contextlib.suppress(OSError):
        answer = sock.recv(200)
    took = time.monotonic() - started
    rss1 = rss_kib(pid)
    sock.close()
    time.sleep(1)
    status = answer.split(b"\r\n")[0].decode() or "closed"
    print(f"| {name} | {status} | {took:.2f} | {rss0 / 1024:.1f} | "
          f"{rss1 / 1024:.1f} | {rss_kib(pid) / 1024:.1f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--slow", type=int, default=500)
    parser.add_argument("--timeout", type=float, default=10.0)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="chaosproxy-slowloris-"))
    upstream_port, chaos_port, nginx_port = free_port(), free_port(), free_port()
    procs = [subprocess.Popen([sys.executable, "-m", "chaosproxy.demo.tool_server", "--port", str(upstream_port)],
                              start_new_session=True)]
    try:
        wait_port(upstream_port, procs[0])
        chaos = subprocess.Popen([sys.executable, "-m", "chaosproxy", "run", "--upstream",
                                  f"http://127.0.0.1:{upstream_port}", "--listen", f"127.0.0.1:{chaos_port}",
                                  "--client-header-timeout", str(args.timeout), "--log", os.devnull],
                                 stderr=subprocess.DEVNULL, start_new_session=True)
        procs.append(chaos)
        wait_port(chaos_port, chaos)
        targets = [("chaosproxy", chaos_port, chaos.pid)]
        if nginx := shutil.which("nginx"):
            (folder / "nginx.conf").write_text(NGINX_CONF.format(dir=folder, timeout=int(args.timeout),
                                                                 upstream=upstream_port, port=nginx_port))
            proc = subprocess.Popen([nginx, "-c", str(folder / "nginx.conf"), "-p", str(folder)],
                                    stderr=subprocess.DEVNULL, start_new_session=True)
            procs.append(proc)
            wait_port(nginx_port, proc)
            worker = int(subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True,
                                        timeout=10).stdout.split()[0])
            targets.append(("nginx", nginx_port, worker))
        print(f"slowloris: {args.slow} heads at 1 byte/s, head timeout {args.timeout:g} s\n")
        print("| proxy | p50 ms before | p50 ms during | slow heads | RSS MiB before | during | after |")
        print("|---|---|---|---|---|---|---|")
        for name, port, pid in targets:
            asyncio.run(slowloris(name, port, pid, args.slow, args.timeout))
        print("\nan unterminated 64 MiB header line\n")
        print("| proxy | answer | s | RSS MiB before | at the answer | after the client left |")
        print("|---|---|---|---|---|---|")
        for name, port, pid in targets:
            big_header(name, port, pid)
    finally:
        for proc in procs:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=10)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                os.killpg(proc.pid, signal.SIGKILL)
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
