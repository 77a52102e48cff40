"""Open files at the limit (issue 35): N concurrent SSE streams through `chaosproxy run`, started under
a soft limit of 1,024 open files, with a hard limit that allows them all or does not.

    python bench/fd_limits.py [--streams 2000] [--hard 8192]      # loopback only; about 30 s

Each stream holds two of the proxy's files (agent and upstream). The proxy raises its soft limit to the
hard one at start; when the hard limit is too low, every agent must still get an answer (200, or 502
from an upstream it could not open a file for) or wait in the kernel's queue, never a reset, and the
proxy must serve new agents once streams end. Prints what the agents got.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import resource
import subprocess
import sys
import threading
import time

HOLD_S = 6.0  # how long the upstream keeps each stream open


async def upstream(port: int, hold: float) -> asyncio.Server:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: 20\r\n\r\n"
                         b"data: first\n\n")
            await writer.drain()
            await asyncio.sleep(hold)
            writer.write(b"data: x")
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()
    return await asyncio.start_server(serve, "127.0.0.1", port, backlog=4096)


async def agent(port: int, results: collections.Counter[str], timeout: float) -> None:
    try:
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /events HTTP/1.1\r\nHost: a\r\n\r\n")
            status = await reader.readline()
            if not status:
                results["closed before answering"] += 1
                return
            code = status.split(b" ")[1].decode()
            await reader.readuntil(b"data: x" if code == "200" else b"}}")  # the stream's end, or the error's
            results[code] += 1
            writer.close()
    except TimeoutError:
        results["no answer in time"] += 1
    except ConnectionResetError:
        results["reset"] += 1
    except OSError as exc:
        results[f"error: {exc.strerror}"] += 1


async def run(streams: int, hard: int, proxy_port: int, upstream_port: int) -> None:
    server = await upstream(upstream_port, HOLD_S)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    limits = f"{1024}:{hard}"
    proxy = subprocess.Popen(["prlimit", f"--nofile={limits}", sys.executable, "-m", "chaosproxy", "run",
                              "--upstream", f"http://127.0.0.1:{upstream_port}", "--listen",
                              f"127.0.0.1:{proxy_port}", "--log", os.devnull], stderr=subprocess.PIPE, text=True,
                             env=env)
    said: list[str] = []  # the proxy's stderr, read as it comes (a full pipe would stop the proxy)
    reading = threading.Thread(target=lambda: said.extend(proxy.stderr), daemon=True)
    reading.start()
    try:
        while not any("listening on" in line for line in said):
            assert proxy.poll() is None, "the proxy did not start"
            await asyncio.sleep(0.05)
        print(f"  {next(line for line in said if 'listening on' in line).strip()}")
        results: collections.Counter[str] = collections.Counter()
        started = time.monotonic()
        await asyncio.gather(*(agent(proxy_port, results, HOLD_S * 3) for _ in range(streams)))
        print(f"  {streams} agents in {time.monotonic() - started:.1f} s: {dict(results)}")
        later: collections.Counter[str] = collections.Counter()
        await agent(proxy_port, later, HOLD_S * 2)
        print(f"  an agent after the streams ended: {dict(later)}")
    finally:
        proxy.terminate()
        proxy.wait(timeout=10)
        reading.join(timeout=10)
        server.close()
    limit = [line.strip() for line in said if "out of open files" in line]
    print(f"  the proxy said 'out of open files' {len(limit)} times" + (f": {limit[0]}" if limit else ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", type=int, default=2000)
    parser.add_argument("--hard", type=int, default=8192, help="the proxy's hard limit in the first run")
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # this process holds the agents' and upstream's ends
    for proxy_hard in (args.hard, 1024):
        print(f"soft limit 1024, hard limit {proxy_hard}:")
        asyncio.run(run(args.streams, proxy_hard, 18801, 18802))


if __name__ == "__main__":
    main()
