#!/usr/bin/env python3
"""The data plane's own Python cost per request, without sockets: a quick before/after for a change.

    .venv/bin/python bench/plane_micro.py [--requests 20000] [--rounds 7] [--scenario FILE] [--httpx] [--node]
                                        [--profile]

Drives `HttpProxy`'s client and upstream Protocols with in-memory transports on uvloop: each round
feeds the benchmark's POST (bench/wrk_post.lua's body; --httpx: as httpx writes it, with its
`Connection: keep-alive`) into a client connection, and the demo tool
server's reply (--node: a reply as Node's server writes it, keep-alive lines and all) into the pooled
upstream connection the proxy wrote it to. What it prints is the CPU per request of the proxy's
Python code, best of --rounds (steady on a busy machine), without the system calls and the event loop
(bench/run.py and `cpu_profile.py --compare` measure those). --profile prints the top functions under
cProfile (slower, relative figures). Requests no rule could act on take the plain path
(`HttpProxy.relay_plain`), also with a --scenario whose rules never match them (the rule check is
asked once per kind of request head); a rule that may act on them sends them the general path.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path
from typing import Any

import uvloop

from chaosproxy.adapters.h1 import ClientConnection, UpstreamConnection
from chaosproxy.adapters.http import HttpProxy
from chaosproxy.control.runtime import settle_heap
from chaosproxy.engine.core import Engine
from chaosproxy.engine.scenario import Scenario, load_scenario
from chaosproxy.telemetry.log import PerturbationLog

BODY = (b'{"jsonrpc":"2.0","id":"req-000001","tool":"search_docs","arguments":{"query":"fault injection proxy '
        b'benchmark","limit":10,"filters":["docs","code"],"trace":"0123456789abcdef0123456789abcdef"}}')
REQUEST = (b"POST /echo/tool HTTP/1.1\r\nHost: 127.0.0.1:8800\r\nContent-Type: application/json\r\n"
           b"Content-Length: %d\r\n\r\n%b" % (len(BODY), BODY))
# as httpx (the OpenAI, Anthropic and MCP Python SDKs' client) writes it: with a keep-alive line
HTTPX_REQUEST = (b"POST /echo/tool HTTP/1.1\r\nHost: 127.0.0.1:8800\r\nAccept: */*\r\n"
                 b"Accept-Encoding: gzip, deflate\r\nConnection: keep-alive\r\nUser-Agent: python-httpx/0.28.1\r\n"
                 b"Content-Length: %d\r\n"
                 b"Content-Type: application/json\r\n\r\n%b" % (len(BODY), BODY))
RESPONSE = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
            b"Date: Mon, 30 Nov 2026 14:00:00 GMT\r\nServer: Python/3.12 aiohttp/3.11\r\n\r\n%b" % (len(BODY), BODY))
# as Node's http server (Express, the TypeScript MCP servers) answers: with its keep-alive lines
NODE_RESPONSE = (b"HTTP/1.1 200 OK\r\nX-Powered-By: Express\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\nDate: Mon, 30 Nov 2026 14:00:00 GMT\r\nConnection: keep-alive\r\n"
                 b"Keep-Alive: timeout=5\r\n\r\n%b" % (len(BODY), BODY))


class MemoryTransport(asyncio.Transport):
    """Counts the writes (each request and each response must go out as one)."""

    def __init__(self) -> None:
        super().__init__()
        self.written = 0
        self.closing = False

    def write(self, data: Any) -> None:
        self.written += 1

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 50000) if name == "peername" else default

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def abort(self) -> None:
        self.closing = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def can_write_eof(self) -> bool:
        return True


async def main(args: argparse.Namespace) -> None:
    scenario = load_scenario(args.scenario) if args.scenario else Scenario()
    with open("/dev/null", "wb") as sink:
        log = PerturbationLog(sink, run_id="micro", seed=1, batch_s=0.2)
        engine = Engine(scenario, seed=1, log=log)
        proxy = HttpProxy(engine, "http://127.0.0.1:9")
        pool = proxy.routes[0].pool
        upstream = UpstreamConnection(pool)
        to_upstream = MemoryTransport()
        upstream.connection_made(to_upstream)
        pool.release(upstream)
        client = ClientConnection(proxy)
        to_client = MemoryTransport()
        client.connection_made(to_client)
        settle_heap()

        request, response = HTTPX_REQUEST if args.httpx else REQUEST, NODE_RESPONSE if args.node else RESPONSE

        def one() -> None:
            client.data_received(request)  # relayed to the pooled connection
            upstream.data_received(response)  # relayed to the client; the connection goes back to the pool

        for _ in range(1000):
            one()
        profiler = cProfile.Profile() if args.profile else None
        if profiler is not None:
            profiler.enable()
        cpu = float("inf")
        for _ in range(1 if profiler else args.rounds):
            t0 = time.process_time()
            for _ in range(args.requests):
                one()
            cpu = min(cpu, time.process_time() - t0)
        if profiler is not None:
            profiler.disable()
            out = io.StringIO()
            pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(30)
            print(out.getvalue())
        log.flush()
        done = 1000 + (1 if profiler else args.rounds) * args.requests
        if (to_upstream.written, to_client.written, pool.idle) != (done, done, [upstream]):
            sys.exit(f"not relayed as expected: {to_upstream.written} requests and {to_client.written} responses "
                     f"written for {done}, pool {pool.idle}")
        print(f"{cpu / args.requests * 1e6:.2f} µs CPU per request (best of {args.rounds} x {args.requests})"
              f"{' under cProfile' if profiler else ''}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--scenario", type=Path)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--httpx", action="store_true",
                    help="the agent writes its requests as httpx does (a keep-alive line)")
    ap.add_argument("--node", action="store_true", help="the upstream answers as Node's server does (keep-alive lines)")
    uvloop.run(main(ap.parse_args()))
    sys.exit(0)
