"""Reports and trajectory exports: the numbers from hand-made logs and results, the files from a real drill,
and the HTML in a real headless Chromium."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from chaosproxy.records.logfile import read_sessions
from chaosproxy.report.behaviour import behaviour, incidents
from chaosproxy.report.build import build_report
from chaosproxy.report.profile import build_profile
from chaosproxy.report.stats import Rate, difference_interval, wilson
from tests.helpers.browser import load

CHAOSPROXY = [sys.executable, "-m", "chaosproxy"]
T0 = datetime(2026, 1, 1, tzinfo=UTC)


class LogWriter:
    """Perturbation log lines as the proxy writes them, at chosen times (seconds after T0)."""

    def __init__(self) -> None:
        self.lines: list[dict[str, Any]] = [{"ts": T0.isoformat(), "event": "run", "run_id": "r1", "seed": 7}]

    def add(self, event: str, t: float, session: str = "mcp", **fields: Any) -> None:
        self.lines.append({"ts": (T0 + timedelta(seconds=t)).isoformat(), "event": event, "run_id": "r1",
                           "seed": 7, "transport": "http", "session": session, **fields})

    def fault(self, t: float, rule: str, fault: str, action: str, *, component: str = "transition",
              phase: str = "request", **fields: Any) -> None:
        self.add("fault", t, rule=rule, fault=fault, component=component, level="http", phase=phase,
                 action=action, params={}, effect={}, **fields)

    def call(self, t: float, duration_ms: float, *, status: int | None = 200, outcome: str = "ok",
             faults: tuple[str, ...] = (), **fields: Any) -> None:
        self.add("call", t, status=status, outcome=outcome, duration_ms=duration_ms, faults=list(faults),
                 **fields)

    def write(self, path: Path) -> Path:
        path.write_text("".join(json.dumps(line) + "\n" for line in self.lines) + '{"ts": "cut sh')
        return path


def mcp_call(log: LogWriter, t: float, rpc_id: int, tool: str | None, **fields: Any) -> None:
    method = "tools/call" if tool else "tools/list"
    log.call(t, 10, method=method, tool=tool, rpc_id=rpc_id, http_method="POST", path="/mcp", **fields)


@pytest.fixture
def log_file(tmp_path: Path) -> Path:
    log = LogWriter()
    mcp_call(log, 0.1, 1, None)
    # search: a 503 at 0.2 s, then it gets through at 0.5 s: retried and recovered after 300 ms
    log.fault(0.19, "outage", "http_error", "respond", tool="search", rpc_id=2)
    mcp_call(log, 0.2, 2, "search", status=503, outcome="fault_response", faults=("outage",))
    mcp_call(log, 0.5, 3, "search")
    # weather hangs until the agent gives up on it, and is never called again
    log.fault(0.6, "stall", "hang", "hang", tool="weather", rpc_id=4)
    mcp_call(log, 1.6, 4, "weather", status=None, outcome="client_disconnected", faults=("stall",))
    # add is misspelt on the way (upstream finds no such tool), then called again and answered
    log.fault(1.7, "slip", "unknown_tool", "rewrite", component="action", tool="add", rpc_id=5)
    mcp_call(log, 1.71, 5, "ad", faults=("slip",))
    mcp_call(log, 1.9, 6, "add")
    # a reply rewritten after its call line was written (legacy SSE), and a fault whose call never came
    mcp_call(log, 2.0, 7, "search")
    log.fault(2.1, "drift", "schema_drift", "rewrite", phase="response", tool="search", rpc_id=7)
    log.fault(2.2, "orphan", "rpc_error", "reply", tool="search", rpc_id=99)
    # a plain HTTP tool API in another session: faults are joined by rule name
    log.fault(0.3, "err", "http_error", "respond", session="rest")
    log.call(0.3, 1, session="rest", http_method="POST", path="/api/search", status=503,
             outcome="fault_response", faults=("err",))
    log.call(0.4, 1, session="rest", http_method="POST", path="/api/search")
    return log.write(tmp_path / "log.jsonl")


def test_calls_are_joined_with_their_faults(log_file: Path) -> None:
    mcp, rest = read_sessions(log_file)
    assert (mcp.session, rest.session) == ("mcp", "rest")
    assert [call.label for call in mcp.tool_calls] == ["search", "search", "weather", "add", "add", "search"]
    assert [len(call.faults) for call in mcp.calls] == [0, 1, 0, 1, 1, 0, 1]
    assert mcp.calls[4].tool == "ad" and mcp.calls[4].disrupted  # upstream got the misspelt name
    assert mcp.calls[-1].faults[0].rule == "drift" and not mcp.calls[-1].disrupted  # changed, but answered
    assert [fault.rule for fault in mcp.unattached] == ["orphan"]
    assert [call.label for call in rest.tool_calls] == ["POST /api/search"] * 2
    assert rest.calls[0].faults[0].rule == "err"


def test_behaviour_counts_retries_and_what_got_through(log_file: Path) -> None:
    """One agent (one run) in two sessions. The REST search and the misspelt add are called again
    as the agent's next step: retries that got through. The MCP search is called again only after a
    REST call: not a retry. The hung weather is never called again. A log holds no verdict: recovery n/a."""
    b = behaviour(read_sessions(log_file))
    assert (b.sessions, b.tool_calls, b.disrupted_calls, b.failed_upstream_calls) == (2, 8, 4, 0)
    assert (b.incomplete_calls, b.made_up_tool_calls) == (1, 1)
    r = b.recovery
    assert (r.incidents, r.retried, r.got_through, r.recovered) == (4, 2, 2, None)
    assert r.median_time_to_get_through_ms == pytest.approx(145, abs=1)  # 100 ms and 190 ms
    assert r.max_time_to_get_through_ms == pytest.approx(190, abs=1)
    assert set(b.recovery_by_component) == {"transition", "action"}
    assert b.recovery_by_component["action"].got_through == 1
    assert b.faults_by_type == {"http_error": 2, "hang": 1, "unknown_tool": 1, "schema_drift": 1,
                                "rpc_error": 1}


def test_a_retry_blocked_before_its_tool_call_counts_and_incidents_follow_the_agent(tmp_path: Path) -> None:
    """A retrying agent reconnects for each try: a 429 on initialize is a try too, and the search
    that finally gets through, in a third session, ends the incident."""
    log = LogWriter()
    log.fault(0.1, "limit", "rate_limit", "respond", session="a", tool="search", rpc_id=2)
    log.call(0.1, 5, session="a", method="tools/call", tool="search", rpc_id=2, status=429,
             outcome="fault_response", faults=("limit",))
    log.fault(0.3, "limit", "rate_limit", "respond", session="127.0.0.1", rpc_id=0)
    log.call(0.3, 5, session="127.0.0.1", method="initialize", rpc_id=0, status=429, outcome="fault_response",
             faults=("limit",))
    log.call(0.6, 5, session="c", method="initialize", rpc_id=0)
    log.call(0.7, 5, session="c", method="tools/call", tool="search", rpc_id=1)
    [incident] = incidents(read_sessions(log.write(tmp_path / "log.jsonl")))
    assert incident.retries == 2  # the blocked initialize, then the search that got through
    r = behaviour(read_sessions(tmp_path / "log.jsonl")).recovery
    assert (r.incidents, r.retried, r.got_through) == (1, 1, 1)
    assert r.median_time_to_get_through_ms == pytest.approx(600, abs=1)
    found = behaviour(read_sessions(tmp_path / "log.jsonl"))
    assert found.faults_by_type == {"rate_limit": 2} and found.unattached_faults == 0


def test_wilson_and_newcombe_intervals_match_the_published_values() -> None:
    # Newcombe (1998), Statistics in Medicine 17:857: 81/263 -> 0.2553-0.3662; 56/70 - 48/80 -> 0.0524-0.3339
    assert wilson(81, 263) == pytest.approx((0.2553, 0.3662), abs=1e-4)
    assert wilson(0, 10) == pytest.approx((0.0, 0.2775), abs=1e-4)
    assert wilson(0, 0) == (0.0, 1.0)
    assert difference_interval(Rate(56, 70), Rate(48, 80)) == pytest.approx((0.0524, 0.3339), abs=1e-4)
    assert difference_interval(Rate(0, 0), Rate(1, 2)) is None


def result(run: int, label: str, status: str, faults: dict[str, int] | None = None,
           components: dict[str, int] | None = None) -> dict[str, Any]:
    return {"run": f"run-{run}", "label": label, "kind": "clean" if label == "clean" else "sample",
            "status": status, "faults": faults or {}, "components": components or {}}


def test_profile_compares_clean_runs_with_runs_where_a_fault_fired() -> None:
    transition = ({"http_error": 1}, {"transition": 1})
    observation = ({"typos": 2}, {"observation": 2})
    profile = build_profile([
        result(1, "clean", "passed"), result(2, "clean", "passed"), result(3, "clean", "passed"),
        result(4, "clean", "failed"),
        result(5, "sample-1", "failed", *transition), result(6, "sample-1", "timeout", *transition),
        result(7, "sample-2", "passed", *observation), result(8, "sample-2", "passed", *observation),
        result(9, "sample-3", "failed"),  # nothing fired: neither clean nor perturbed
        result(10, "sample-4", "error", *transition),  # the drill's machinery failed: counts for nothing
    ])
    assert (profile.runs, profile.errors, profile.unexposed) == (10, 1, 1)
    assert (profile.overall.clean, profile.overall.perturbed) == (Rate(3, 4), Rate(2, 4))
    assert {row.name: row.perturbed for row in profile.by_component} == {"observation": Rate(2, 2),
                                                                          "transition": Rate(0, 2)}
    assert [row.name for row in profile.by_fault] == ["http_error", "typos"]
    transition_row = next(row for row in profile.by_component if row.name == "transition")
    assert transition_row.drop == pytest.approx(0.75)
    low, high = transition_row.drop_interval or (0, 0)
    assert -1 <= low < 0.75 < high <= 1  # n = 4 against n = 2: too few runs to rule out no drop
    by_label = {row.label: row for row in profile.by_configuration}
    assert by_label["sample-1"].statuses == {"failed": 1, "timeout": 1}
    assert by_label["sample-4"].rate == Rate(0, 0) and by_label["sample-2"].faults == {"typos": 4}


def test_report_of_a_log_prints_markdown_and_writes_json_html_md(log_file: Path, tmp_path: Path) -> None:
    shown = subprocess.run([*CHAOSPROXY, "report", str(log_file)], capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert "## Agent behaviour" in shown.stdout
    assert "| calls to a tool that does not exist | 1 |" in shown.stdout
    assert "Robustness profile" not in shown.stdout  # no success signal in a single log
    html, md, js = tmp_path / "r.html", tmp_path / "r.md", tmp_path / "r.json"
    written = subprocess.run([*CHAOSPROXY, "report", str(log_file), "--html", str(html), "--md", str(md),
                              "--json", str(js)], capture_output=True, text=True, timeout=60)
    assert written.returncode == 0, written.stderr
    assert md.read_text().startswith("# chaosproxy robustness report")
    data = json.loads(js.read_text())
    assert data["behaviour"]["recovery"] | {"median_time_to_get_through_ms": 0} == {
        "incidents": 4, "retried": 2, "got_through": 2, "recovered": None, "judged": 0,
        "median_time_to_get_through_ms": 0, "max_time_to_get_through_ms": 190.0}
    assert html.read_text().count('class="chart timeline"') == 2


def test_report_refuses_what_is_neither_a_log_nor_a_drill(tmp_path: Path) -> None:
    for target in (tmp_path, tmp_path / "missing.jsonl"):
        done = subprocess.run([*CHAOSPROXY, "report", str(target)], capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 2 and "chaosproxy report:" in done.stderr


def test_export_writes_one_trajectory_per_session(log_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "trajectories.jsonl"
    done = subprocess.run([*CHAOSPROXY, "export", str(log_file), "--format", "trajectories", "-o", str(out)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    mcp, rest = (json.loads(line) for line in out.read_text().splitlines())
    assert (mcp["session"], mcp["seed"], rest["session"]) == ("mcp", 7, "rest")
    tools = [call["tool"] for call in mcp["calls"]]
    assert tools == [None, "search", "search", "weather", "ad", "add", "search"]
    outage = mcp["calls"][1]
    assert outage["disrupted"] and outage["status"] == 503
    assert outage["faults"][0] | {"t_ms": 0} == {
        "t_ms": 0, "rule": "outage", "fault": "http_error", "component": "transition", "level": "http",
        "phase": "request", "action": "respond", "params": {}, "effect": {}}
    assert [call["t_ms"] for call in mcp["calls"]] == sorted(call["t_ms"] for call in mcp["calls"])
    assert mcp["unattached_faults"][0]["rule"] == "orphan"


REST_AGENT = """
import json, os, sys, time, urllib.error, urllib.request
base = os.environ["CHAOSPROXY_URL"]
def call(make):
    for attempt in range(4):
        try:
            with urllib.request.urlopen(make(), timeout=5) as reply:
                return json.load(reply)
        except (OSError, ValueError):
            time.sleep(0.05)
    sys.exit(1)
call(lambda: urllib.request.Request(base + "/api/search", data=b'{"query": "q"}',
                                    headers={"Content-Type": "application/json"}))
call(lambda: urllib.request.Request(base + "/api/weather?city=oslo"))
"""


@pytest.fixture(scope="module")
def drill_folder(upstream: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real drill: a REST agent that retries, a clean baseline, a transition and an observation fault."""
    base = tmp_path_factory.mktemp("drill")
    agent = base / "agent.py"
    agent.write_text(REST_AGENT)
    outage = base / "outage.yaml"
    outage.write_text("rules: [{name: outage, first: 1, match: {path: /api/search}, "
                      "fault: {type: http_error, status: 503}}]\n")
    typos = base / "typos.yaml"
    typos.write_text("rules: [{name: typos, match: {path: /api/weather}, fault: {type: typos, rate: 0.5}}]\n")
    done = subprocess.run([*CHAOSPROXY, "drill", "--agent", f"{sys.executable} {agent}",
                           "--upstream", upstream,
                           "--scenario", str(outage), "--scenario", str(typos), "--baseline", "1",
                           "--jobs", "3", "--timeout", "30", "--seed", "5", "--out", str(base / "out")],
                          capture_output=True, text=True, timeout=100)
    assert done.returncode == 0, done.stderr
    return base / "out"


def test_report_of_a_drill_has_the_profile_by_component_and_fault(drill_folder: Path) -> None:
    report = build_report(drill_folder)
    assert report.profile is not None
    assert [row.name for row in report.profile.by_component] == ["observation", "transition"]
    assert [row.name for row in report.profile.by_fault] == ["http_error", "typos"]
    assert report.profile.overall.perturbed == Rate(2, 2) and report.profile.overall.clean == Rate(1, 1)
    assert report.behaviour.recovery.recovered == 1  # the 503 was retried
    assert [timeline.status for timeline in report.timelines] == ["passed"] * 3


def test_html_report_renders_in_chromium_with_charts_and_no_errors(drill_folder: Path,
                                                                   tmp_path: Path) -> None:
    html = tmp_path / "report.html"
    done = subprocess.run([*CHAOSPROXY, "report", str(drill_folder), "--html", str(html)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    page = _load(html.as_uri(), {
        "title": "document.title",
        "profile_charts": "document.querySelectorAll('svg.chart.profile').length",
        "timelines": "document.querySelectorAll('svg.chart.timeline').length",
        "bars_drawn": "[...document.querySelectorAll('svg.profile .bar rect')]"
                      ".filter(r => r.getBBox().width > 0).length",
        "charts_shown": "[...document.querySelectorAll('svg.profile, details[open] svg.timeline')]"
                        ".map(s => s.getBoundingClientRect()).every(b => b.width > 300 && b.height > 40)",
        "fault_marks": "document.querySelectorAll('svg.timeline .fault path').length",
        "fetched": "performance.getEntriesByType('resource').length",
    })
    assert page.problems == []
    assert page.values == {"title": "chaosproxy robustness report", "profile_charts": 2, "timelines": 3,
                           "bars_drawn": 10, "charts_shown": True, "fault_marks": 2, "fetched": 0}


def test_the_browser_check_catches_console_errors_exceptions_and_failed_loads(tmp_path: Path) -> None:
    broken = tmp_path / "broken.html"
    broken.write_text('<!DOCTYPE html><title>t</title><img src="missing.png">'
                      '<script>console.error("boom"); undefined_function();</script>')
    page = _load(broken.as_uri(), {"title": "document.title"})
    assert page.values == {"title": "t"}
    assert any("console.error: boom" in p for p in page.problems)
    assert any("undefined_function is not defined" in p for p in page.problems)
    assert any("missing.png" in p for p in page.problems)


def _load(url: str, expressions: dict[str, str]) -> Any:
    import asyncio
    return asyncio.run(load(url, expressions))
