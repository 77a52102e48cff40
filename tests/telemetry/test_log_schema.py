"""The perturbation log's schema (chaosproxy/telemetry/log_schema.py) is what the writers write and the
readers read: every kind of line, written by the real writers (the engine, the HTTP adapter's plain and
inspecting paths, the stdio relay, the control plane, the command line), has exactly the keys its
TypedDict declares, with their types, and reads back through the report code."""

from __future__ import annotations

import http.client
import json
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import TypeAdapter

from chaosproxy.adapters.http import HttpProxy
from chaosproxy.control.reload import reload_scenario
from chaosproxy.control.runtime import open_engine
from chaosproxy.records.logfile import read_events, read_sessions
from chaosproxy.telemetry.log_schema import LINES, SCHEMA_VERSION, Event, Outcome

RULES = [
    {"name": "down", "match": {"path": "/echo/down"}, "fault": {"type": "http_error", "status": 503}},
    {"name": "tool-only", "match": {"tool": "search"}, "fault": {"type": "rpc_error"}},  # a REST call: a skip
    {"name": "cut", "match": {"path": "/echo/cut"}, "fault": {"type": "truncate", "bytes": 3}},
]
TIMEOUT = 30


def _schema_problems(line: dict[str, Any]) -> list[str]:
    """What in a line its kind's TypedDict does not allow: unknown keys, missing keys, wrong types."""
    schema = LINES[Event(line["event"])]
    keys = schema.__required_keys__ | schema.__optional_keys__
    problems = [f"{line['event']}: unknown key {key!r}" for key in line if key not in keys]
    problems += [f"{line['event']}: missing key {key!r}" for key in schema.__required_keys__ if key not in line]
    try:
        TypeAdapter(schema).validate_python(line, strict=True)
    except ValueError as exc:
        problems.append(f"{line['event']}: {exc}")
    return problems


def _get(url: str, body: bytes | None = None) -> int:
    request = urllib.request.Request(url, body, {"Content-Type": "application/json"} if body else {})
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT) as answer:
            answer.read()
            return answer.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (ConnectionError, urllib.error.URLError, http.client.IncompleteRead):
        return 0  # a body cut short


def test_every_line_of_a_proxy_run_is_as_the_schema_says_and_reads_back(server_loop, upstream, tmp_path: Path):
    scenario, log_path = tmp_path / "scenario.yaml", tmp_path / "log.jsonl"
    scenario.write_text(yaml.safe_dump({"rules": RULES}))
    with open_engine(scenario, seed=5, log_path=log_path) as engine:
        proxy = HttpProxy(engine, upstream)
        port = server_loop.run(proxy.start("127.0.0.1", 0))
        base = f"http://127.0.0.1:{port}"
        try:
            assert _get(base + "/echo/plain") == 200  # no rule can act: the plain path
            assert _get(base + "/echo/down") == 503  # a fault answers in upstream's place
            assert _get(base + "/echo/cut", b"a body of more than 3 bytes") in (0, 200)  # cut after 3 bytes
            rpc = {"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": {"name": "lookup", "arguments": {}}}
            _get(base + "/echo/mcp", json.dumps(rpc).encode())  # a JSON-RPC call: method, tool and id
            engine.end_session("127.0.0.1")
            assert server_loop.run(reload_scenario(engine, scenario))
        finally:
            server_loop.run(proxy.stop())
    lines = list(read_events(log_path))
    assert {line["event"] for line in lines} == {"run", "call", "fault", "skip", "session", "control"}
    assert [problem for line in lines for problem in _schema_problems(line)] == []
    assert lines[0]["event"] == Event.RUN and lines[0]["schema"] == SCHEMA_VERSION
    calls = [call for session in read_sessions(log_path) for call in session.calls]
    assert [(call.path, call.outcome, [fault.rule for fault in call.faults]) for call in calls] == [
        ("/echo/plain", Outcome.OK, []), ("/echo/down", Outcome.FAULT_RESPONSE, ["down"]),
        ("/echo/cut", Outcome.TRUNCATED, ["cut"]), ("/echo/mcp", Outcome.OK, [])]
    assert (calls[3].method, calls[3].tool, calls[3].rpc_id) == ("tools/call", "lookup", 4)


@pytest.mark.slow
def test_the_command_line_and_the_stdio_relay_write_their_lines_as_the_schema_says(tmp_path: Path):
    log = tmp_path / "log.jsonl"
    with socket.socket() as taken:  # a port in use: the run line, then an error line
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        subprocess.run([sys.executable, "-m", "chaosproxy", "run", "--upstream", "http://127.0.0.1:9", "--listen",
                        f"127.0.0.1:{taken.getsockname()[1]}", "--log", str(log)], capture_output=True,
                       timeout=TIMEOUT)
    server = "import sys, json\nfor line in sys.stdin:\n" \
             "    print(json.dumps({'jsonrpc': '2.0', 'id': json.loads(line)['id'], 'result': {}}), flush=True)\n"
    request = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "echo", "arguments": {}}}
    subprocess.run([sys.executable, "-m", "chaosproxy", "stdio", "--log", str(log), "--", sys.executable, "-c",
                    server], input=json.dumps(request).encode() + b"\n", capture_output=True, timeout=TIMEOUT)
    lines = list(read_events(log))
    assert [line["event"] for line in lines] == ["run", "error", "run", "call"]
    assert [problem for line in lines for problem in _schema_problems(line)] == []
    assert (lines[3]["transport"], lines[3]["tool"], lines[3]["outcome"]) == ("stdio", "echo", Outcome.OK)

