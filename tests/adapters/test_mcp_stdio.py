"""MCP over stdio through `chaosproxy stdio`: real processes, the real SDK client, raw pipes.

The proxy is always run as the command an MCP client config would name; raw-pipe tests read its
stdout exactly as a client does. Every wait is bounded and every process is stopped by its pid.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mcp import Client, StdioServerParameters
from mcp.shared.exceptions import MCPError

from chaosproxy.adapters.stdio import StdioRelay, spawn
from chaosproxy.engine.core import Engine
from chaosproxy.engine.scenario import Scenario
from chaosproxy.faults import REGISTRY
from chaosproxy.telemetry.log import PerturbationLog
from tests.helpers.mcp_support import dump
from tests.helpers.stdio_support import MCP_SERVER, PROXY, WAIT, proxied, rpc, scenario_file
from tests.helpers.support import log_events

ERAS = ["auto", "legacy"]  # auto negotiates the 2026-07-28 era with this server; legacy forces the handshake

ECHO_SERVER = '''\
"""A line-echo JSON-RPC server: a banner that is not JSON, then each request answered with the
exact line it arrived as, any other line echoed back after `echo: `, and `exit` exits."""
import json, sys
out = sys.stdout.buffer
out.write(b"server starting (this line is not JSON)\\n")
out.flush()
for raw in sys.stdin.buffer:
    try:
        msg = json.loads(raw)
    except ValueError:
        msg = None
    if isinstance(msg, dict) and "method" in msg and "id" in msg:
        if msg["method"] == "exit":
            sys.exit(msg["params"]["code"])
        reply = {"jsonrpc": "2.0", "id": msg["id"], "result": {"line": raw.decode()}}
        out.write(json.dumps(reply).encode() + b"\\n")
    else:
        out.write(b"echo: " + raw)
    out.flush()
'''


def events(log: Path, kind: str) -> list[dict[str, Any]]:
    return log_events(log, kind)


@pytest.fixture
def echo_server(tmp_path: Path) -> list[str]:
    script = tmp_path / "echo_server.py"
    script.write_text(ECHO_SERVER)
    return [sys.executable, str(script)]


class RawClient:
    """The proxy as a subprocess on raw pipes, read line by line as an MCP client reads it."""

    def __init__(self, args: list[str]) -> None:
        self.proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, start_new_session=True)
        self._lines: queue.Queue[bytes] = queue.Queue()
        self._stderr: list[bytes] = []
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._stderr.extend, args=(self.proc.stderr,), daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put(b"")  # EOF

    def send(self, *lines: bytes) -> None:
        assert self.proc.stdin is not None
        for line in lines:
            self.proc.stdin.write(line)
        self.proc.stdin.flush()

    def read(self) -> bytes:
        """The next line from the proxy's stdout (b"" at EOF)."""
        return self._lines.get(timeout=WAIT)

    def close_stdin(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()

    def wait(self) -> int:
        return self.proc.wait(WAIT)

    @property
    def stderr(self) -> str:
        return b"".join(self._stderr).decode()

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(WAIT)


@pytest.fixture
def raw() -> Iterator[Any]:
    started: list[RawClient] = []

    def start(*args: str) -> RawClient:
        client = RawClient([*PROXY, *args])
        started.append(client)
        return client

    yield start
    for client in started:
        client.stop()


def direct(server: list[str] = MCP_SERVER) -> StdioServerParameters:
    return StdioServerParameters(command=server[0], args=server[1:])


async def transcript(params: StdioServerParameters, mode: str) -> dict[str, Any]:
    async with Client(params, mode=mode) as session:
        return {
            "tools": dump(await session.list_tools()),
            "weather": dump(await session.call_tool("weather", {"city": "Lima"})),
            "search": dump(await session.call_tool("search", {"query": "chaos", "limit": 2})),
            "fail": dump(await session.call_tool("fail", {"reason": "nope"})),
        }


# --- transparency -------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ERAS)
async def test_results_are_identical_direct_and_through_the_proxy(tmp_path: Path, mode: str):
    log = tmp_path / "log.jsonl"
    assert await transcript(proxied(log), mode) == await transcript(direct(), mode)
    calls = events(log, "call")
    assert [c["tool"] for c in calls if c["method"] == "tools/call"] == ["weather", "search", "fail"]
    assert {c["outcome"] for c in calls} == {"ok"} and events(log, "fault") == []


NEVER = [  # rules that make the relay decide on every line in both directions, yet never fire
    {"name": "never-request", "match": {"method": "no/such"}, "fault": {"type": "latency", "delay_ms": 1}},
    {"name": "never-response", "match": {"method": "no/such"},
     "fault": {"type": "latency", "delay_ms": 1, "phase": "response"}}]
AWKWARD_LINES = [
    rpc(1, "ping"),
    b'{ "id" : "x", "method":"tools/call" ,"jsonrpc":"2.0",'
    b'"params":{"name":"s","arguments":{"q":"caf\\u00e9 \xc3\xa9"}} }\r\n',
    b"not json at all\n",
    b"\n",
    b"\xff\xfe not even UTF-8\n",
    b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n',
    rpc(2, "big", pad="x" * 300_000),  # longer than the relay's read buffer
    b"a last line without a newline",
]


@pytest.mark.parametrize("watching", [False, True], ids=["idle", "watching"])
def test_lines_pass_byte_for_byte_both_ways(tmp_path: Path, echo_server: list[str], watching: bool):
    """Odd spacing and key order, escapes, CRLF, non-JSON and non-UTF-8 lines, a 300 KB line, no final LF."""
    log = tmp_path / "log.jsonl"
    flags = ["--scenario", str(scenario_file(tmp_path, *NEVER))] if watching else []
    data = b"".join(AWKWARD_LINES)
    expected = subprocess.run(echo_server, input=data, capture_output=True, timeout=WAIT).stdout
    through = subprocess.run([*PROXY, "--log", str(log), *flags, "--", *echo_server], input=data,
                             capture_output=True, timeout=WAIT)
    assert through.returncode == 0, through.stderr
    assert through.stdout == expected
    assert expected.startswith(b"server starting (this line is not JSON)\n")
    assert expected.endswith(b"echo: a last line without a newline")
    assert [c["rpc_id"] for c in events(log, "call")] == [1, "x", 2]
    assert events(log, "fault") == []


def test_files_and_dev_null_work_as_stdin_and_stdout(tmp_path: Path, echo_server: list[str]):
    """Event loops watch only pipes and sockets; `< requests.jsonl > replies.jsonl` must still work."""
    requests, replies = tmp_path / "requests.jsonl", tmp_path / "replies.jsonl"
    requests.write_bytes(b"".join(AWKWARD_LINES))
    expected = subprocess.run(echo_server, input=requests.read_bytes(), capture_output=True,
                              timeout=WAIT).stdout
    with requests.open("rb") as stdin, replies.open("wb") as stdout:
        subprocess.run([*PROXY, "--", *echo_server], stdin=stdin, stdout=stdout, timeout=WAIT, check=True)
    assert replies.read_bytes() == expected
    done = subprocess.run([*PROXY, "--", *echo_server], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, timeout=WAIT)
    assert done.returncode == 0, done.stderr


def test_stdout_carries_nothing_but_frames(raw, tmp_path: Path):
    """Verbose operational log and the perturbation log both on stderr, faults firing: stdout stays clean."""
    scenario = scenario_file(tmp_path, {"name": "slow", "fault": {"type": "latency", "delay_ms": 5}},
                             {"name": "slow-back",
                              "fault": {"type": "latency", "delay_ms": 5, "phase": "response"}})
    client = RawClient([sys.executable, "-m", "chaosproxy", "-v", "stdio", "--scenario", str(scenario), "--",
                        *MCP_SERVER])
    try:
        client.send(rpc(1, "initialize", protocolVersion="2025-06-18", capabilities={},
                        clientInfo={"name": "raw", "version": "1"}))
        first = json.loads(client.read())
        assert first["id"] == 1 and first["result"]["serverInfo"]["name"] == "chaosproxy-demo-tools"
        client.send(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n', rpc(2, "tools/list"),
                    rpc(3, "tools/call", name="add", arguments={"a": 1, "b": 2}))
        replies = [json.loads(client.read()) for _ in range(2)]
        assert {r["id"] for r in replies} == {2, 3} and all(r["jsonrpc"] == "2.0" for r in replies)
        client.close_stdin()
        assert client.read() == b""
        assert client.wait() == 0
        assert '"event":"fault"' in client.stderr and "chaosproxy INFO" in client.stderr
    finally:
        client.stop()


# --- faults through the real SDK client ----------------------------------------------------------

@pytest.mark.parametrize("mode", ERAS)
async def test_a_hung_call_times_out_and_the_next_call_works(tmp_path: Path, mode: str):
    log = tmp_path / "log.jsonl"
    scenario = scenario_file(tmp_path, {"name": "hang-once", "match": {"tool": "search"}, "first": 1,
                                        "fault": {"type": "hang"}})
    async with Client(proxied(log, "--scenario", str(scenario)), mode=mode) as session:
        with pytest.raises(MCPError, match="timed out"):
            await session.call_tool("search", {"query": "lost"}, read_timeout_seconds=2)
        result = await session.call_tool("search", {"query": "found"})
    assert "found result 1" in result.content[0].text
    hung, answered = [c for c in events(log, "call") if c["tool"] == "search"]
    assert (hung["outcome"], hung["faults"]) == ("hang", ["hang-once"])
    assert (answered["outcome"], answered["faults"]) == ("ok", [])


async def test_an_http_error_reaches_the_agent_as_a_jsonrpc_error(tmp_path: Path):
    log = tmp_path / "log.jsonl"
    scenario = scenario_file(tmp_path, {
        "name": "down", "match": {"tool": "weather"},
        "fault": {"type": "http_error", "status": 503, "body": "upstream busy"}})
    async with Client(proxied(log, "--scenario", str(scenario)), mode="legacy") as session:
        with pytest.raises(MCPError) as caught:
            await session.call_tool("weather", {"city": "Oslo"})
        assert await session.call_tool("add", {"a": 2, "b": 3}) is not None
    assert (caught.value.code, caught.value.message) == (-32000, "HTTP 503: upstream busy")
    [fault] = events(log, "fault")
    assert (fault["rule"], fault["tool"], fault["action"]) == ("down", "weather", "respond")
    [call] = [c for c in events(log, "call") if c["tool"] == "weather"]
    assert (call["outcome"], call["faults"]) == ("fault_response", ["down"])


@pytest.mark.skipif(not {"rpc_error", "malformed"} <= REGISTRY.keys(), reason="message faults not present")
@pytest.mark.parametrize("mode", ERAS)
async def test_rewritten_and_garbled_replies_reach_the_agent(tmp_path: Path, mode: str):
    """A Rewrite (the reply swapped for an error) and a Garble (a stray line before the real frame)."""
    log = tmp_path / "log.jsonl"
    scenario = scenario_file(
        tmp_path,
        {"name": "lost-reply", "match": {"tool": "weather"},
         "fault": {"type": "rpc_error", "phase": "response", "code": -32603, "message": "reply lost"}},
        {"name": "stray", "match": {"tool": "add"}, "fault": {"type": "malformed", "variant": "stray_line"}})
    async with Client(proxied(log, "--scenario", str(scenario)), mode=mode) as session:
        with pytest.raises(MCPError, match="reply lost"):
            await session.call_tool("weather", {"city": "Lima"})
        added = await session.call_tool("add", {"a": 1, "b": 2})  # the SDK skips the stray line
    assert added.content[0].text == "3.0"
    fired = {(f["rule"], f["action"]) for f in events(log, "fault")}
    assert fired == {("lost-reply", "rewrite"), ("stray", "garble")}


async def test_a_rug_pull_is_announced_with_list_changed(tmp_path: Path):
    log = tmp_path / "log.jsonl"
    scenario = scenario_file(tmp_path, {"name": "rug-pull", "fault": {
        "type": "remove_tool", "tool": "weather", "after_calls": 1, "notify": True}})
    changed: list[str] = []

    async def on_message(message: Any) -> None:
        if getattr(message, "method", None) == "notifications/tools/list_changed":
            changed.append(message.method)

    async with Client(proxied(log, "--scenario", str(scenario)), mode="legacy", message_handler=on_message) as session:
        await session.call_tool("add", {"a": 1, "b": 2})
        tools = {t.name for t in (await session.list_tools()).tools}
    assert changed == ["notifications/tools/list_changed"]
    assert "weather" not in tools and "add" in tools


@pytest.mark.parametrize("mode", ERAS)
async def test_mcp_server_time_through_the_proxy(tmp_path: Path, mode: str):
    pytest.importorskip("mcp_server_time")
    server = [sys.executable, "-m", "mcp_server_time", "--local-timezone", "UTC"]

    async def run(params: StdioServerParameters) -> dict[str, Any]:
        async with Client(params, mode=mode) as session:
            return {"tools": dump(await session.list_tools()),
                    "convert": dump(await session.call_tool("convert_time", {
                        "source_timezone": "Asia/Tokyo", "time": "09:30", "target_timezone": "UTC"}))}

    proxied_run = await run(proxied(tmp_path / "log.jsonl", server=server))
    assert proxied_run == await run(direct(server))
    assert "00:30" in json.dumps(proxied_run["convert"])


# --- faults on raw pipes ---------------------------------------------------------------------------

def test_a_delayed_request_holds_up_no_other(raw, tmp_path: Path, echo_server: list[str]):
    scenario = scenario_file(tmp_path, {"name": "slow", "match": {"method": "slow"},
                                        "fault": {"type": "latency", "delay_ms": 1500}})
    client = raw("--scenario", str(scenario), "--", *echo_server)
    assert client.read().startswith(b"server starting")
    started = time.monotonic()
    client.send(rpc(1, "slow"), rpc(2, "fast"))
    assert json.loads(client.read())["id"] == 2  # replies are paired by id: the later one may pass
    assert time.monotonic() - started < 1.0
    assert json.loads(client.read())["id"] == 1
    assert time.monotonic() - started >= 1.4


def test_delayed_messages_still_arrive_when_the_agent_hangs_up(tmp_path: Path, echo_server: list[str]):
    scenario = scenario_file(
        tmp_path,
        {"name": "late-request", "match": {"method": "slow"}, "fault": {"type": "latency", "delay_ms": 500}},
        {"name": "late-reply", "match": {"method": "later"},
         "fault": {"type": "latency", "delay_ms": 500, "phase": "response"}})
    done = subprocess.run([*PROXY, "--scenario", str(scenario), "--", *echo_server],
                          input=rpc(1, "slow") + rpc(2, "later"), capture_output=True, timeout=WAIT)
    assert done.returncode == 0, done.stderr
    assert sorted(json.loads(line)["id"] for line in done.stdout.splitlines()[1:]) == [1, 2]


@pytest.mark.parametrize("fault", [{"type": "reset"}, {"type": "reset", "after_bytes": 10}],
                         ids=["before-request", "mid-reply"])
def test_a_reset_ends_the_relay_as_a_crashed_server(raw, tmp_path: Path, echo_server: list[str], fault):
    log = tmp_path / "log.jsonl"
    scenario = scenario_file(tmp_path, {"name": "crash", "match": {"method": "boom"}, "fault": fault})
    client = raw("--scenario", str(scenario), "--log", str(log), "--", *echo_server)
    assert client.read().startswith(b"server starting")
    client.send(rpc(1, "ping"))
    assert json.loads(client.read())["id"] == 1
    client.send(rpc(2, "boom"))
    if "after_bytes" in fault:
        assert client.read() == b'{"jsonrpc"'  # the reply's first 10 bytes, then nothing
    assert client.read() == b""
    assert client.wait() == 1  # our stdin is still open: the proxy ended by itself
    [call] = [c for c in events(log, "call") if c["rpc_id"] == 2]
    assert (call["outcome"], call["faults"]) == ("reset", ["crash"])


def test_truncate_and_drip_shape_the_reply_line(raw, tmp_path: Path, echo_server: list[str]):
    scenario = scenario_file(
        tmp_path,
        {"name": "drip", "match": {"method": "slow"}, "fault": {"type": "slow_body", "chunk_bytes": 16,
                                                                 "delay_ms": 50}},
        {"name": "cut", "match": {"method": "big"}, "fault": {"type": "truncate", "bytes": 20}})
    client = raw("--scenario", str(scenario), "--", *echo_server)
    assert client.read().startswith(b"server starting")
    started = time.monotonic()
    client.send(rpc(1, "slow"))
    reply = client.read()
    assert json.loads(reply)["result"]["line"] == rpc(1, "slow").decode()
    assert time.monotonic() - started >= (len(reply) // 16 - 1) * 0.05
    client.send(rpc(2, "big"))
    assert client.read() == b'{"jsonrpc": "2.0", "'  # 20 bytes, then the stream to the agent is closed
    assert client.read() == b""
    client.close_stdin()
    assert client.wait() == 0


# --- lifecycle -------------------------------------------------------------------------------------

def test_the_servers_exit_code_is_ours_and_its_exit_closes_our_stdout(raw, echo_server: list[str]):
    client = raw("--", *echo_server)
    assert client.read().startswith(b"server starting")
    client.send(rpc(1, "exit", code=3))  # our stdin stays open
    assert client.read() == b""
    assert client.wait() == 3


def test_the_agent_hanging_up_ends_the_server_and_the_proxy(raw, echo_server: list[str]):
    client = raw("--", *echo_server)
    assert client.read().startswith(b"server starting")
    client.close_stdin()
    assert client.read() == b""
    assert client.wait() == 0


def test_sigterm_is_passed_on_to_the_server(raw, echo_server: list[str]):
    client = raw("--", *echo_server)
    assert client.read().startswith(b"server starting")
    client.proc.send_signal(signal.SIGTERM)
    assert client.read() == b""
    assert client.wait() == 128 + signal.SIGTERM


async def test_a_server_that_ignores_stdin_eof_is_terminated(tmp_path: Path):
    log = PerturbationLog(io.FileIO(tmp_path / "log.jsonl", "w"), run_id="test", seed=1)
    server = spawn([sys.executable, "-c", "import time; time.sleep(60)"])
    agent_in, hang_up = os.pipe()
    from_relay, agent_out = os.pipe()
    os.close(hang_up)
    try:
        relay = StdioRelay(Engine(Scenario(), seed=1, log=log), server, close_grace=0.2)
        assert await asyncio.wait_for(relay.run(agent_in, agent_out), WAIT) == 128 + signal.SIGTERM
        assert os.read(from_relay, 10) == b""
    finally:
        os.close(from_relay)
        if server.poll() is None:
            server.kill()
        server.wait(WAIT)
        log.close()


@pytest.mark.parametrize(("command", "status", "message"), [
    (["no-such-mcp-server-command"], 127, "no-such-mcp-server-command: command not found"),
    ([os.devnull], 126, "cannot run /dev/null"),
    ([], 2, "give the server command after --"),
    ([sys.executable, "-c", "import sys; sys.exit('bad config')"], 1, "exited with status 1"),
])
def test_a_server_command_that_cannot_run_gets_a_clear_error(command: list[str], status: int, message: str):
    done = subprocess.run([*PROXY, "--", *command], stdin=subprocess.PIPE, capture_output=True, timeout=WAIT)
    assert done.returncode == status
    assert message in done.stderr.decode()
    assert done.stdout == b""


def test_an_invalid_scenario_is_rejected_before_the_server_starts(tmp_path: Path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("rules:\n  - name: x\n    fault: {type: latency, delay_ms: -1}\n")
    marker = tmp_path / "started"
    done = subprocess.run([*PROXY, "--scenario", str(bad), "--", "touch", str(marker)], capture_output=True,
                          timeout=WAIT)
    assert done.returncode == 2
    assert f"{bad}:3:" in done.stderr.decode()
    assert not marker.exists()
