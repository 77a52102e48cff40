"""`chaosproxy stdio` when the server misbehaves: it crashes while a request is held, ignores
SIGTERM, outlives a killed relay, floods one direction, writes a 100 MB line or binary garbage."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.stdio_support import PROXY, WAIT, alive, gone_within, rpc, scenario_file, server_of

BURST_SERVER = '''\
"""Answers `burst` with N progress notifications, then the reply; `die` after 0.5 s if asked."""
import json, sys, threading, os, time
if "--die" in sys.argv:
    threading.Timer(0.5, lambda: os._exit(3)).start()
out = sys.stdout.buffer
for raw in sys.stdin.buffer:
    msg = json.loads(raw)
    for n in range(msg["params"].get("n", 0)):
        note = {"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progress": n}}
        out.write(json.dumps(note).encode() + b"\\n")
    out.write(json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": {}}).encode() + b"\\n")
    out.flush()
'''

STUBBORN_SERVER = '''\
import signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
signal.signal(signal.SIGINT, signal.SIG_IGN)
print("ready", flush=True)
time.sleep(600)
'''

FLOOD_SERVER = '''\
import os, sys
out = sys.stdout.buffer
sys.stdin.buffer.readline()
block = b"x" * (1 << 20)
for _ in range({mib}):
    out.write(block)
out.write(b"\\n")
out.write(b'{{"jsonrpc": "2.0", "id": 1, "result": {{}}}}\\n')
out.write(os.urandom(3 << 20))  # binary garbage, no newline, then the end
out.flush()
'''


def script(tmp_path: Path, name: str, text: str) -> list[str]:
    path = tmp_path / name
    path.write_text(text)
    return [sys.executable, str(path)]


def test_notifications_are_never_overtaken_under_latency(tmp_path: Path):
    rules = scenario_file(tmp_path, {"name": "slow-notes", "match": {"method": "notifications/*"},
                                     "probability": 0.5,
                                     "fault": {"type": "latency", "delay_ms": 2, "phase": "response"}})
    burst = script(tmp_path, "burst.py", BURST_SERVER)
    done = subprocess.run([*PROXY, "--scenario", str(rules), "--", *burst],
                          input=rpc(1, "burst", n=2000), capture_output=True, timeout=WAIT)
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert [line["params"]["progress"] for line in lines[:-1]] == list(range(2000))
    assert lines[-1]["id"] == 1  # the reply last, as the server wrote it


def test_a_slow_reader_gets_all_the_server_wrote_before_it_exited(tmp_path: Path):
    """After the server exits, its last lines wait in the pipes until the agent reads them: the relay
    drains them at the agent's pace (it gave up one second after the exit, and they were lost)."""
    relay = subprocess.Popen([*PROXY, "--", *script(tmp_path, "burst.py", BURST_SERVER)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert relay.stdin is not None and relay.stdout is not None
    relay.stdin.write(rpc(1, "burst", n=2000))  # ~170 KB of notifications, then the reply
    relay.stdin.close()  # the agent hangs up: the server answers, then exits
    received = bytearray()
    deadline = time.monotonic() + WAIT
    try:
        while chunk := os.read(relay.stdout.fileno(), 1024):  # ~50 KB/s: a host busy with each message
            received += chunk
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert relay.wait(WAIT) == 0
    finally:
        relay.kill()
        relay.wait(WAIT)
    lines = [json.loads(line) for line in received.splitlines()]
    assert [line["params"]["progress"] for line in lines[:-1]] == list(range(2000))
    assert lines[-1]["id"] == 1


def test_a_server_crash_while_a_request_is_held_ends_the_relay_at_once(tmp_path: Path):
    rules = scenario_file(tmp_path, {"name": "held", "match": {"method": "slow"},
                                     "fault": {"type": "latency", "delay_ms": 30_000}})
    burst = script(tmp_path, "burst.py", BURST_SERVER)
    relay = subprocess.Popen([*PROXY, "--scenario", str(rules), "--", *burst, "--die"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    started = time.monotonic()
    assert relay.stdin is not None and relay.stdout is not None
    relay.stdin.write(rpc(1, "slow"))
    relay.stdin.flush()
    try:
        assert relay.stdout.read() == b""  # EOF, with the request still held
        assert relay.wait(WAIT) == 3
        assert time.monotonic() - started < 8  # it was 20 s: two 10 s settles on a dead server
    finally:
        relay.kill()
        relay.wait(WAIT)


@pytest.fixture
def stubborn(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """A relay around a server that ignores SIGTERM and SIGINT, once the server is up: (relay, server pid)."""
    relay = subprocess.Popen([*PROXY, "--", *script(tmp_path, "stubborn.py", STUBBORN_SERVER)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert relay.stdout is not None and relay.stdout.readline() == b"ready\n"
        yield relay, server_of(relay.pid)
    finally:
        relay.kill()
        relay.wait(WAIT)


def test_sigterm_escalates_to_sigkill_for_a_server_that_ignores_it(stubborn):
    relay, server = stubborn
    started = time.monotonic()
    relay.send_signal(signal.SIGTERM)
    assert relay.wait(WAIT) == 128 + signal.SIGKILL
    assert time.monotonic() - started < 8 and not alive(server)


def test_a_killed_relay_leaves_no_orphan(stubborn):
    relay, server = stubborn
    relay.kill()
    relay.wait(WAIT)
    if not gone_within(server, 10):
        os.kill(server, signal.SIGKILL)
        pytest.fail("the server outlived its relay")


def test_a_100_mb_line_and_binary_garbage_pass_through_unheld(tmp_path: Path):
    rules = scenario_file(tmp_path, {"name": "watch", "match": {"method": "never"},  # lines are examined
                                     "fault": {"type": "latency", "delay_ms": 1, "phase": "response"}})
    log = tmp_path / "log.jsonl"
    relay = subprocess.Popen([*PROXY, "--scenario", str(rules), "--log", str(log), "--",
                              *script(tmp_path, "flood.py", FLOOD_SERVER.format(mib=100))],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert relay.stdin is not None and relay.stdout is not None
    relay.stdin.write(rpc(1, "go"))
    relay.stdin.flush()
    big = relay.stdout.readline()
    assert len(big) == (100 << 20) + 1 and big[:4] == b"xxxx"
    peak_kib = int(next(line for line in Path(f"/proc/{relay.pid}/status").read_text().splitlines()
                        if line.startswith("VmHWM")).split()[1])
    assert json.loads(relay.stdout.readline())["id"] == 1
    assert len(relay.stdout.read()) == 3 << 20  # the garbage, byte for byte, up to the end
    relay.stdin.close()
    assert relay.wait(WAIT) == 0
    print(f"relay peak RSS {peak_kib >> 10} MiB")
    assert peak_kib < 160 * 1024, f"the relay held {peak_kib >> 10} MiB for a 100 MiB line"
    skips = [json.loads(line) for line in log.read_text().splitlines() if '"skip"' in line]
    assert any("passes through unexamined" in skip["reason"] for skip in skips)
