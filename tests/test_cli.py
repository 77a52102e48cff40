"""The command line, run as a user runs it: real processes, real signals, real sockets."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from tests.helpers.support import free_port, wait_listening

CHAOSPROXY = [sys.executable, "-m", "chaosproxy"]






@pytest.fixture
def run_proxy(upstream: str, tmp_path: Path):
    procs: list[subprocess.Popen] = []

    def start(*extra: str) -> tuple[subprocess.Popen, int, Path]:
        port, log = free_port(), tmp_path / "faults.jsonl"
        proc = subprocess.Popen([*CHAOSPROXY, "run", "--upstream", upstream, "--listen", f"127.0.0.1:{port}",
                                 "--log", str(log), *extra], stderr=subprocess.PIPE, text=True)
        procs.append(proc)
        return proc, port, log

    yield start
    for proc in procs:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(5)


@pytest.mark.slow
def test_run_injects_faults_and_flushes_the_log_on_sigterm(run_proxy, tmp_path: Path):
    scenario = tmp_path / "s.yaml"
    scenario.write_text("rules:\n  - name: teapot\n    match: {path: /api/*}\n"
                        "    fault: {type: http_error, status: 418}\n")
    proc, port, log = run_proxy("--scenario", str(scenario), "--seed", "99")
    wait_listening(port, proc)
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/api/weather", timeout=5)
    assert caught.value.code == 418
    assert urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5).read() == b"ok"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(10) == 0
    events = [json.loads(line) for line in log.read_text().splitlines()]
    assert [e["event"] for e in events] == ["run", "fault", "call", "call"]
    assert {e["seed"] for e in events} == {99}
    assert "listening on" in proc.stderr.read()


@pytest.mark.slow
def test_an_invalid_scenario_stops_before_listening(run_proxy, tmp_path: Path):
    scenario = tmp_path / "bad.yaml"
    scenario.write_text("rules:\n  - name: x\n    fault: {type: latency, delay_ms: -1}\n")
    proc, _, _ = run_proxy("--scenario", str(scenario))
    assert proc.wait(15) == 2
    assert f"{scenario}:3: rules[0].fault.delay_ms" in proc.stderr.read()


@pytest.mark.slow
def test_a_port_in_use_is_a_clear_error(run_proxy, tmp_path: Path):
    log = tmp_path / "log.jsonl"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run([*CHAOSPROXY, "run", "--upstream", "http://127.0.0.1:9", "--listen",
                               f"127.0.0.1:{port}", "--log", str(log)], capture_output=True, text=True, timeout=15)
    assert proc.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in proc.stderr
    run, error = [json.loads(line) for line in log.read_text().splitlines()]  # the log says it never ran
    assert (run["event"], error["event"]) == ("run", "error") and error["error"].startswith("did not start")


@pytest.mark.parametrize("args,message", [
    (["run", "--upstream", "ftp://x"], "expected an http:// or https:// URL"),
    (["run", "--upstream", "http://127.0.0.1:1", "--listen", "nowhere"], "expected HOST:PORT"),
])
@pytest.mark.slow
def test_bad_flags_are_explained(args, message):
    proc = subprocess.run([*CHAOSPROXY, *args], capture_output=True, text=True, timeout=15)
    assert proc.returncode == 2 and message in proc.stderr


@pytest.mark.slow
def test_demo_runs_end_to_end(tmp_path: Path):
    log = tmp_path / "demo.jsonl"
    proc = subprocess.run([*CHAOSPROXY, "demo", "--log", str(log)], capture_output=True, text=True, timeout=90)
    assert proc.returncode == 0, proc.stderr
    assert "Robustness summary" in proc.stdout and "faults fired:" in proc.stdout
    faults = [json.loads(line) for line in log.read_text().splitlines() if '"event":"fault"' in line]
    fired = {f["fault"] for f in faults}
    assert {"latency", "http_error", "hang", "truncate", "stream_cut",  # a REST tool API
            "duplicate_tool", "rename_tool", "typos", "input_schema_drift",  # an MCP server
            "prompt_typos", "llm_error", "malformed_tool_call"} <= fired  # the model API
    assert {f["api"] for f in faults if "api" in f} == {"anthropic"}
    report = log.with_suffix(".html")
    assert f"HTML report:      {report}" in proc.stdout and "<html" in report.read_text()


def test_switches_read_the_environment(monkeypatch):
    from chaosproxy.cli import build_parser
    monkeypatch.setenv("CHAOSPROXY_WATCH", "1")
    monkeypatch.setenv("CHAOSPROXY_VERBOSE", "true")
    args = build_parser().parse_args(["run", "--upstream", "http://127.0.0.1:9"])
    assert args.watch and args.verbose
    monkeypatch.setenv("CHAOSPROXY_WATCH", "0")
    assert not build_parser().parse_args(["run", "--upstream", "http://127.0.0.1:9"]).watch
