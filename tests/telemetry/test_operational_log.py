"""The proxy's own messages as a sidecar's log pipeline takes them (issue 31): with --log-format json,
every line on stderr is one JSON object, named by the run it belongs to, through a reload and an upstream
failure as much as at start."""

from __future__ import annotations

import http.client
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers.support import free_port, wait_listening


@pytest.mark.slow
def test_with_log_format_json_every_operational_line_is_a_json_object(tmp_path: Path):
    scenario = tmp_path / "s.yaml"
    scenario.write_text("rules: []\n")
    port, dead = free_port(), free_port()  # nothing listens on `dead`: every call fails upstream
    proc = subprocess.Popen([sys.executable, "-m", "chaosproxy", "--log-format", "json", "run", "--upstream",
                             f"http://127.0.0.1:{dead}", "--listen", f"127.0.0.1:{port}", "--scenario", str(scenario),
                             "--log", str(tmp_path / "log.jsonl")], stderr=subprocess.PIPE, text=True)
    try:
        wait_listening(port, proc)
        scenario.write_text("rules:\n  - {name: slow, fault: {type: latency, delay_ms: 1}}\n")
        proc.send_signal(signal.SIGHUP)  # reload
        time.sleep(0.5)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("GET", "/x")
        assert conn.getresponse().status == 502
        conn.close()
    finally:
        proc.terminate()
        _, stderr = proc.communicate(timeout=10)
    lines = [json.loads(line) for line in stderr.splitlines()]  # each line parses, or this fails
    [run] = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()
             if json.loads(line)["event"] == "run"]
    assert all(set(line) >= {"ts", "level", "message", "run_id"} and line["run_id"] == run["run_id"]
               for line in lines), lines
    said = " | ".join(line["message"] for line in lines)
    assert "listening on" in said and "reloaded" in said and "failed for GET /x" in said and "stopping" in said
    assert {line["level"] for line in lines} >= {"info", "warning"}


@pytest.mark.slow
def test_after_the_command_too(tmp_path: Path):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "chaosproxy", "run", "--log-format", "json", "--upstream",
                             "http://127.0.0.1:9", "--listen", f"127.0.0.1:{port}", "--log", str(tmp_path / "l")],
                            stderr=subprocess.PIPE, text=True)
    try:
        wait_listening(port, proc)
        first = proc.stderr.readline()  # the port listens a moment before the line is written
    finally:
        proc.terminate()
        proc.communicate(timeout=10)
    assert json.loads(first)["message"].startswith("listening on")
