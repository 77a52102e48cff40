"""Bounded session state, through a real `chaosproxy run`: sessions end, idle out and are evicted
least recently used first; one that comes back starts fresh and the log says so; global counters
are untouched; the control API shows the sessions held."""

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

from tests.helpers.mcp_support import client
from tests.helpers.support import free_port, log_events, wait_listening

PER_SESSION_FIRST_FAILS = """\
rules:
  - name: first-fails           # per session (the default scope): each session's first request
    match: {path: /api/*}
    first: 1
    fault: {type: http_error, status: 503}
  - name: three-overall         # scope global: three in the whole run, whatever happens to sessions
    scope: global
    first: 3
    fault: {type: latency, delay_ms: 1}
"""


class Proxy:
    def __init__(self, port: int, control: int, log: Path, proc: subprocess.Popen[bytes]) -> None:
        self.port, self.control, self.log, self.proc = port, control, log, proc

    def stop(self) -> None:
        """SIGTERM, and wait for the proxy to write its last lines and exit."""
        self.proc.terminate()
        self.proc.wait(10)

    def get(self, session: str, path: str = "/api/weather?city=oslo") -> int:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            conn.request("GET", path, headers={"Mcp-Session-Id": session})
            response = conn.getresponse()
            response.read()
            return response.status
        finally:
            conn.close()

    def sessions(self, query: str = "") -> dict[str, Any]:
        conn = http.client.HTTPConnection("127.0.0.1", self.control, timeout=10)
        try:
            conn.request("GET", "/sessions" + query)
            return json.loads(conn.getresponse().read())
        finally:
            conn.close()

    def lines(self, event: str) -> list[dict[str, Any]]:
        return log_events(self.log, event)

    def wait_for(self, check: Callable[[], bool], timeout: float = 5) -> None:
        deadline = time.monotonic() + timeout  # session lines are written in batches (every 0.25 s)
        while not check():
            assert time.monotonic() < deadline
            time.sleep(0.05)


@pytest.fixture
def start(tmp_path: Path, upstream: str) -> Iterator[Callable[..., Proxy]]:
    procs: list[subprocess.Popen[bytes]] = []

    def run(*flags: str, to: str = upstream) -> Proxy:
        scenario = tmp_path / "s.yaml"
        scenario.write_text(PER_SESSION_FIRST_FAILS)
        port, control, log = free_port(), free_port(), tmp_path / f"log-{len(procs)}.jsonl"
        proc = subprocess.Popen([sys.executable, "-m", "chaosproxy", "run", "--upstream", to, "--scenario",
                                 str(scenario), "--listen", f"127.0.0.1:{port}", "--control",
                                 f"127.0.0.1:{control}", "--log", str(log), "--seed", "1", *flags],
                                stderr=subprocess.PIPE)
        procs.append(proc)
        wait_listening(port, proc)
        wait_listening(control, proc)
        return Proxy(port, control, log, proc)

    yield run
    for proc in procs:
        proc.terminate()
        proc.wait(10)


def test_past_the_cap_the_least_recently_used_go_and_come_back_fresh(start):
    proxy = start("--max-sessions", "20", "--session-lines", "each")
    assert [proxy.get("s0"), proxy.get("s0")] == [503, 200]
    for n in range(1, 30):  # 10 evictions: a dropped key is remembered while it is among the last 20
        assert proxy.get(f"s{n}") == 503  # each new session's first request
        if n % 10 == 0:
            assert proxy.get("s1") in (200, 503)  # s1 stays recently used: never evicted
    shown = proxy.sessions("?limit=5")
    assert (shown["count"], shown["max_sessions"]) == (20, 20)
    assert [entry["session"] for entry in shown["sessions"]] == ["s29", "s28", "s27", "s26", "s25"]
    assert proxy.get("s1") == 200  # held all along: its first request failed long ago
    assert proxy.get("s0") == 503  # evicted, so it starts over
    proxy.wait_for(lambda: any(line["change"] == "restarted" for line in proxy.lines("session")))
    session_lines = proxy.lines("session")
    evicted = [line["session"] for line in session_lines if line["change"] == "dropped"]
    assert "s1" not in evicted and "s0" in evicted
    assert all(line["reason"] == "evicted" for line in session_lines)
    assert [line["session"] for line in session_lines if line["change"] == "restarted"] == ["s0"]
    assert len([line for line in proxy.lines("fault") if line["rule"] == "three-overall"]) == 3


def test_an_idle_session_starts_over_after_the_ttl(start):
    proxy = start("--session-ttl", "0.5", "--session-lines", "each")
    assert [proxy.get("a"), proxy.get("a")] == [503, 200]
    time.sleep(1)
    assert proxy.get("a") == 503
    proxy.wait_for(lambda: len(proxy.lines("session")) == 2)
    assert [(line["change"], line["reason"]) for line in proxy.lines("session")] == [
        ("dropped", "idle"), ("restarted", "idle")]


async def test_a_deleted_mcp_session_is_dropped_at_once(start, mcp_http: str):
    proxy = start(to=mcp_http)
    async with client(f"http://127.0.0.1:{proxy.port}/mcp", mode="legacy") as session:
        await session.list_tools()
        # initialize came before the server named the session: it counts under the client address
        [mcp_session] = [entry["session"] for entry in proxy.sessions()["sessions"] if entry["session"] != "127.0.0.1"]
    # the SDK sent DELETE with its Mcp-Session-Id on closing
    proxy.wait_for(lambda: proxy.sessions()["count"] == 1 and bool(proxy.lines("session")))
    [line] = proxy.lines("session")
    assert (line["session"], line["change"], line["reason"]) == (mcp_session, "dropped", "ended")


def test_the_sessions_page_is_checked(start):
    proxy = start()
    for name in "abc":
        proxy.get(name)
    assert [entry["session"] for entry in proxy.sessions("?offset=1&limit=1")["sessions"]] == ["b"]
    assert proxy.sessions("?limit=x") == {"error": "offset and limit are whole numbers"}


def test_sessions_evicted_in_a_churn_are_told_in_a_summary_not_a_line_each(start):
    """A churn of session ids past the cap must not double the log: by default the sessions dropped idle
    or evicted are counted and told in a line per reason (at the latest when the proxy stops)."""
    proxy = start("--max-sessions", "5")
    for n in range(40):
        assert proxy.get(f"churn{n}") == 503
    assert proxy.get("churn34") == 503  # evicted of late: it comes back fresh, and that is told alone
    proxy.stop()
    session_lines = proxy.lines("session")
    summaries = [line for line in session_lines if "count" in line]
    assert [(line["change"], line["reason"]) for line in summaries] == [("dropped", "evicted")] * len(summaries)
    assert sum(line["count"] for line in summaries) == 36  # 41 sessions, 5 held
    assert len(summaries) <= 2 and not any("session" in line for line in summaries)
    assert [line["session"] for line in session_lines if line["change"] == "restarted"] == ["churn34"]
