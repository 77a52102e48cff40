"""Edges of per-message handling, through a real `chaosproxy run`: the proxy's own replies on a legacy
SSE stream are not faulted again, a legacy stream's queue is bounded, JSON-RPC batches are left whole."""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web
from mcp.shared.exceptions import MCPError

from chaosproxy.demo.serving import serve
from tests.helpers.mcp_support import client
from tests.helpers.support import ServerLoop, free_port, log_events, wait_listening

BATCH_REPLY = [{"jsonrpc": "2.0", "id": 1, "result": {"content": [{"type": "text", "text": "the weather is fine"}]}},
               {"jsonrpc": "2.0", "id": 2, "result": {"content": [{"type": "text", "text": "nothing found here"}]}}]
FLOOD_EVENT = b"event: message\ndata: " + json.dumps({"jsonrpc": "2.0", "method": "notifications/message",
                                                      "params": {"data": "x" * 60_000}}).encode() + b"\n\n"


async def scripted_upstream() -> tuple[web.AppRunner, int]:
    """POST /batch answers a JSON-RPC batch; GET /sse announces an endpoint, then floods events."""
    async def batch(_: web.Request) -> web.Response:
        return web.json_response(BATCH_REPLY)

    async def flood(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b"event: endpoint\ndata: /messages?sessionId=flood\n\n")
        for _ in range(4000):  # 240 MB in all, to a reader that reads nothing
            await response.write(FLOOD_EVENT)
        return response

    app = web.Application()
    app.router.add_post("/batch", batch)
    app.router.add_get("/sse", flood)
    return await serve(app)


@pytest.fixture(scope="module")
def scripted(server_loop: ServerLoop) -> Iterator[str]:
    runner, port = server_loop.run(scripted_upstream())
    yield f"http://127.0.0.1:{port}"
    server_loop.run(runner.cleanup())


@pytest.fixture
def run_proxy(tmp_path: Path) -> Iterator[Callable[..., tuple[subprocess.Popen[bytes], int, Path]]]:
    procs: list[subprocess.Popen[bytes]] = []

    def start(upstream: str, rules: list[dict[str, Any]]) -> tuple[subprocess.Popen[bytes], int, Path]:
        scenario, log, port = tmp_path / f"s{len(procs)}.yaml", tmp_path / f"log{len(procs)}.jsonl", free_port()
        scenario.write_text(yaml.safe_dump({"rules": rules}))
        proc = subprocess.Popen([sys.executable, "-m", "chaosproxy", "run", "--upstream", upstream, "--scenario",
                                 str(scenario), "--listen", f"127.0.0.1:{port}", "--log", str(log)],
                                stderr=subprocess.PIPE)
        procs.append(proc)
        wait_listening(port, proc)
        return proc, port, log

    yield start
    for proc in procs:
        proc.terminate()
        proc.wait(10)


def lines(proc: subprocess.Popen[bytes], log: Path, event: str) -> list[dict[str, Any]]:
    proc.terminate()
    proc.wait(10)  # every line written
    return log_events(log, event)


@pytest.mark.slow
async def test_the_proxys_own_reply_on_a_legacy_stream_is_not_faulted_again(run_proxy, mcp_sse: str):
    proc, port, log = run_proxy(mcp_sse, [
        {"name": "refuse", "match": {"tool": "search"}, "fault": {"type": "rpc_error", "message": "refused here"}},
        {"name": "lose-replies", "match": {"http_method": "GET"}, "after": 1,  # every reply on the stream
         "fault": {"type": "rpc_error", "phase": "response", "message": "reply lost"}}])  # but initialize's
    async with client(f"http://127.0.0.1:{port}/sse") as session:
        with pytest.raises(MCPError, match="refused here"):
            await session.call_tool("search", {"query": "x"})
        with pytest.raises(MCPError, match="reply lost"):  # upstream's own replies still meet the rule
            await session.call_tool("weather", {"city": "Lima"})
    faults = lines(proc, log, "fault")
    assert sorted((fault["rule"], fault["tool"]) for fault in faults) == [
        ("lose-replies", "weather"), ("refuse", "search")]


@pytest.mark.slow
def test_a_legacy_stream_nobody_reads_holds_a_bounded_queue(run_proxy, scripted: str):
    proc, port, _ = run_proxy(scripted, [{"name": "watch", "match": {"method": "never/*"},
                                          "fault": {"type": "rpc_error", "phase": "response"}}])
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", "/sse")
    response = conn.getresponse()
    assert response.status == 200 and response.read(20).startswith(b"event: endpoint")
    time.sleep(6)  # upstream floods 240 MB meanwhile; the agent reads nothing more
    rss_mib = next(int(line.split()[1]) for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines()
                   if line.startswith("VmRSS")) / 1024
    conn.close()
    assert rss_mib < 150, f"the proxy held {rss_mib:.0f} MiB for a stream nobody reads"


@pytest.mark.slow
def test_a_json_rpc_batch_is_left_whole_by_content_faults(run_proxy, scripted: str):
    proc, port, _ = run_proxy(scripted, [{"name": "typo", "fault": {"type": "typos", "rate": 0.5}}])
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    body = json.dumps([{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "weather"}},
                       {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "search"}}])
    conn.request("POST", "/batch", body=body, headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    assert response.status == 200
    assert json.loads(response.read()) == BATCH_REPLY  # ids, envelope and text untouched
    conn.close()

