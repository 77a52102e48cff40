"""With no rule firing, what MCP 2026-07-28 adds passes the proxy byte for byte: multi-round-trip input,
list caching hints, subscriptions/listen streams and the Tasks extension's polls. The real SDK client
talks to an SDK server using each feature through the proxy, on real sockets (streamable HTTP) and real
pipes (stdio); a tap on each side of the proxy keeps what the server sent and what the client received,
and the two must be the same bytes: every response body (or stdio line), and every end-to-end header."""

from __future__ import annotations

import asyncio
import collections
import sys
from pathlib import Path
from typing import Any

import anyio
import httptools
import pytest
from mcp import StdioServerParameters

from chaosproxy.adapters.http.heads import HOP_BY_HOP
from tests.helpers.modern_server import REPORT
from tests.helpers.modern_support import SERVER, Asker, TasksClient, modern, serve_http
from tests.helpers.stdio_support import PROXY, scenario_file
from tests.helpers.support import ServerLoop

CACHED = ("--cache-ttl-ms", "60000", "--cache-scope", "private")
FRAMING = HOP_BY_HOP | {"content-length", "transfer-encoding"}  # the proxy may frame a body its own way
# Rules of every fault on these features, armed on what this session never sends: they cannot fire
IDLE = [
    {"name": f"idle-{fault['type']}-{n}", "match": match, "fault": fault} for n, (match, fault) in enumerate([
        ({"tool": "never-called"}, {"type": "input_required_loop"}),
        ({"tool": "never-called"}, {"type": "input_required_stale"}),
        ({"tool": "never-called"}, {"type": "typos", "rate": 1.0}),
        ({"method": "never/list"}, {"type": "stale_cache"}),
        ({"method": "never/list"}, {"type": "cache_scope_flip"}),
        ({"tool": "never-called"}, {"type": "header_mismatch"}),
        ({}, {"type": "subscription_drop", "notifications": ["notifications/never"]}),
        ({"method": "never/discover"}, {"type": "era_downgrade"}),
        ({"method": "never/get"}, {"type": "task_lost"}),
        ({"method": "never/get"}, {"type": "task_stuck"}),
    ])]


async def everything(client: Any, tasks: TasksClient) -> None:
    """What 2026-07-28 adds, once each, as an agent would use it."""
    assert client.protocol_version == "2026-07-28"
    listed = await client.list_tools()
    assert listed.ttl_ms == 60000 and listed.cache_scope == "private"
    assert (await client.call_tool("deploy", {"target": "staging"})).content[0].text == "deployed to staging"
    assert (await client.call_tool("report", {"polls": 2})).content[0].text == REPORT
    assert tasks.polls == ["working", "working", "completed"]
    async with client.listen(tools_list_changed=True, resource_subscriptions=["note://greeting"]) as sub:
        await client.call_tool("spawn", {"name": "transparent_tool"})
        await client.call_tool("touch", {"uri": "note://greeting"})
        seen: set[str] = set()
        with anyio.fail_after(10):
            async for event in sub:
                seen.add(type(event).__name__)
                if seen == {"ToolsListChanged", "ResourceUpdated"}:
                    break
        await client.call_tool("retire", {"name": "transparent_tool"})
    await client.list_tools(cache_mode="refresh")


# --- streamable HTTP: a tap on each side of the proxy -----------------------------------------------

class Tap:
    """A TCP relay to `port` that keeps, per connection, what came back from there."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.received: list[bytearray] = []
        self.server: asyncio.Server | None = None

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        return self.server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        assert self.server is not None
        self.server.close()

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.port)
        received = bytearray()
        self.received.append(received)

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter, keep: bytearray | None) -> None:
            try:
                while data := await source.read(65536):
                    if keep is not None:
                        keep += data
                    sink.write(data)
                    await sink.drain()
            except ConnectionError:
                pass
            finally:
                sink.close()

        await asyncio.gather(pipe(reader, up_writer, None), pipe(up_reader, writer, received))


def responses(stream: bytes) -> list[tuple[Any, ...]]:
    """The HTTP responses in a connection's downstream bytes: (status, end-to-end headers, body, whole)."""
    found: list[dict[str, Any]] = []

    class Reader:
        def on_message_begin(self) -> None:
            found.append({"headers": [], "body": bytearray(), "whole": False})

        def on_headers_complete(self) -> None:
            found[-1]["status"] = parser.get_status_code()

        def on_header(self, name: bytes, value: bytes) -> None:
            found[-1]["headers"].append((name.lower(), value))

        def on_body(self, body: bytes) -> None:
            found[-1]["body"] += body

        def on_message_complete(self) -> None:
            found[-1]["whole"] = True

    parser = httptools.HttpResponseParser(Reader())
    parser.feed_data(stream)
    return [(r["status"], tuple(sorted((n, v) for n, v in r["headers"] if n.decode() not in FRAMING)),
             bytes(r["body"]), r["whole"]) for r in found]


@pytest.fixture(scope="module")
def cached_http() -> Any:
    with serve_http(*CACHED) as url:
        yield url


@pytest.mark.slow
@pytest.mark.parametrize("rules", [[], IDLE], ids=["no-rules", "idle-rules"])
async def test_http_exchanges_of_every_2026_feature_pass_byte_for_byte(make_proxy, server_loop: ServerLoop,
                                                                        cached_http: str, rules: list[Any]):
    upstream = Tap(int(cached_http.rsplit(":", 1)[1]))
    upstream_port = server_loop.run(upstream.start())
    proxy = make_proxy({"rules": rules}, to=f"http://127.0.0.1:{upstream_port}")
    agent_side = Tap(int(proxy.url.rsplit(":", 1)[1]))
    agent_port = server_loop.run(agent_side.start())
    try:
        tasks = TasksClient()
        async with modern(f"http://127.0.0.1:{agent_port}/mcp", elicitation_callback=Asker(),
                          extensions=[tasks]) as client:
            await everything(client, tasks)
        await anyio.sleep(0.3)  # the last bytes through both taps
    finally:
        server_loop.run(agent_side.stop())
        server_loop.run(upstream.stop())
    sent = [r for stream in upstream.received for r in responses(bytes(stream))]
    got = [r for stream in agent_side.received for r in responses(bytes(stream))]
    assert len(got) >= 12 and len(got) == len(sent)
    whole_sent = collections.Counter((s, h, b) for s, h, b, whole in sent if whole)
    whole_got = collections.Counter((s, h, b) for s, h, b, whole in got if whole)
    assert whole_got == whole_sent
    # a stream the client closed (the listen stream): it got a prefix of what the server sent
    for _, headers, body, whole in got:
        if not whole:
            assert any(h == headers and b.startswith(body) for _, h, b, w in sent if not w)
    assert b"resultType\":\"input_required" in b"".join(b for _, _, b, _ in got)  # the features were there
    assert not proxy.events("fault") and not proxy.events("error")


# --- stdio: a tee on each side of the relay ---------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("rules", [[], IDLE], ids=["no-rules", "idle-rules"])
async def test_stdio_lines_of_every_2026_feature_pass_byte_for_byte(tmp_path: Path, rules: list[Any]):
    agent_side, server_side, log = tmp_path / "agent.out", tmp_path / "server.out", tmp_path / "log.jsonl"
    tee = [sys.executable, "-m", "tests.helpers.stdio_tee"]
    command = [*tee, str(agent_side), "--", *PROXY, "--log", str(log),
               *(["--scenario", str(scenario_file(tmp_path, *rules))] if rules else []),
               "--", *tee, str(server_side), "--", *SERVER, "stdio", *CACHED]
    tasks = TasksClient()
    async with modern(StdioServerParameters(command=command[0], args=command[1:]), elicitation_callback=Asker(),
                      extensions=[tasks]) as client:
        await everything(client, tasks)
    await anyio.sleep(0.3)
    got, sent = agent_side.read_bytes().splitlines(keepends=True), server_side.read_bytes().splitlines(keepends=True)
    assert len(got) >= 12
    assert collections.Counter(got) == collections.Counter(sent)
    assert b"input_required" in b"".join(got) and b"notifications/tools/list_changed" in b"".join(got)
    assert '"event":"fault"' not in log.read_text() and '"event":"error"' not in log.read_text()
