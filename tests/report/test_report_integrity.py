"""A report is a measurement: it counts only what happened, drops no run, and a gate that cannot be
checked does not pass (issue 25). Hand-made logs and drill folders pin each number; a real drill
checks them end to end."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from chaosproxy.records.logfile import read_sessions
from chaosproxy.report.behaviour import behaviour
from chaosproxy.report.build import build_report
from chaosproxy.report.html import render_html
from tests.report.test_report import LogWriter

CHAOSPROXY = [sys.executable, "-m", "chaosproxy"]


def chaosproxy(*args: str, cwd: Path | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CHAOSPROXY, *args], capture_output=True, text=True, timeout=timeout, cwd=cwd)


def rest(log: LogWriter, t: float, path: str = "/api/weather", *, session: str = "127.0.0.1",
         method: str = "GET", **fields: Any) -> None:
    log.call(t, 5, session=session, http_method=method, path=path, **fields)


def mcp(log: LogWriter, t: float, rpc_id: int, method: str, tool: str | None = None, *,
        session: str = "127.0.0.1", path: str = "/mcp", **fields: Any) -> None:
    log.call(t, 5, session=session, method=method, tool=tool, rpc_id=rpc_id, http_method="POST", path=path,
             **fields)


# --- 1. calls are classified one by one, not by the session they share ----------------------------


def test_rest_calls_sharing_a_session_with_mcp_initialize_are_tool_calls(tmp_path: Path) -> None:
    """The demo's agents share one client: its REST calls and the MCP `initialize` come from one
    address, one session. Each REST call is a tool call, and a hang among them never completed."""
    log = LogWriter()
    rest(log, 0.1)
    log.fault(0.2, "stall", "hang", "hang", session="127.0.0.1")
    rest(log, 1.2, status=None, outcome="client_disconnected", faults=("stall",))
    rest(log, 1.3, "/api/search", method="POST")
    mcp(log, 1.4, 1, "initialize")
    mcp(log, 1.5, 2, "tools/call", "search", session="s1")
    log.call(1.6, 5, session="s1", http_method="GET", path="/mcp", status=200)  # the MCP GET stream: plumbing
    log.call(1.7, 5, session="s1", http_method="DELETE", path="/mcp", status=200)
    sessions = read_sessions(log.write(tmp_path / "log.jsonl"))
    b = behaviour(sessions)
    assert (b.tool_calls, b.disrupted_calls, b.incomplete_calls) == (4, 1, 1)
    assert [call.label for s in sessions for call in s.tool_calls] == [
        "GET /api/weather", "GET /api/weather", "POST /api/search", "search"]


def test_a_legacy_sse_stream_is_mcp_plumbing_not_a_tool_call(tmp_path: Path) -> None:
    """Legacy HTTP+SSE: the GET stream (its own path, the agent's address as its session) stays open
    while the POSTs of its session go to another path; the agent closing it is no call left unanswered."""
    log = LogWriter()
    mcp(log, 0.2, 1, "initialize", session="abc", path="/messages/", status=202)
    mcp(log, 0.3, 2, "tools/call", "search", session="abc", path="/messages/", status=202)
    log.call(0.5, 450, session="127.0.0.1", http_method="GET", path="/sse", status=200,
             outcome="client_disconnected")
    b = behaviour(read_sessions(log.write(tmp_path / "log.jsonl")))
    assert (b.tool_calls, b.disrupted_calls, b.incomplete_calls, b.failed_upstream_calls) == (1, 0, 0, 0)


def test_the_demo_report_agrees_with_the_demo(tmp_path: Path) -> None:
    """`chaosproxy demo`'s terminal and the report it links to tell one story: every REST request and
    every MCP tools/call is a tool call; the hang, the cut body, the 503, the cut feed and the refused
    call are the calls faults disrupted; the hang is the one call that never completed."""
    done = chaosproxy("demo", cwd=tmp_path, timeout=180)
    assert done.returncode == 0, done.stderr
    log = Path(next(line.split()[2] for line in done.stdout.splitlines() if line.startswith("perturbation log:")))
    rest_attempts = sum(1 for line in done.stdout.splitlines() if line.lstrip().startswith("task "))
    mcp_calls = sum(1 for line in done.stdout.splitlines() if "->" in line and line.startswith("  ")
                    and not line.lstrip().startswith(("task", "turn")))
    b = behaviour(read_sessions(log))
    assert b.tool_calls == rest_attempts + 1 + mcp_calls  # + the event feed
    assert (b.disrupted_calls, b.incomplete_calls, b.failed_upstream_calls) == (5, 1, 0)
    page = Path(next(line.split()[-1] for line in done.stdout.splitlines() if line.startswith("HTML report:")))
    assert "calls that never completed</td><td>1</td>" in page.read_text()


# --- 2. what faults did is kept apart from what the upstream did ----------------------------------


def test_an_upstream_error_is_not_a_disruption(tmp_path: Path) -> None:
    """A readiness probe answered 404 by the upstream, with no fault fired: a failure of the upstream's
    own, counted and labelled as such, never as a call a fault disrupted."""
    log = LogWriter()
    rest(log, 0.1, "/ready", status=404)
    report = build_report(log.write(tmp_path / "log.jsonl"))
    b = report.behaviour
    assert (b.tool_calls, b.disrupted_calls, b.failed_upstream_calls, b.recovery.incidents) == (1, 0, 1, 0)
    page = render_html(report)
    assert "calls a fault disrupted" in page and "failed by the upstream" in page


def test_a_fault_on_the_request_owns_the_failure_it_causes_and_a_content_fault_does_not(tmp_path: Path) -> None:
    """A request a fault changed (an argument renamed) and upstream refused is the fault's doing; a
    404 whose body a content fault then misspelt is still the upstream's; typos on a REST body are no
    disruption."""
    log = LogWriter()
    log.fault(0.1, "drift", "input_schema_drift", "rewrite", component="action", session="127.0.0.1")
    rest(log, 0.1, "/api/add", method="POST", status=400, faults=("drift",))
    log.add("fault", 0.2, session="127.0.0.1", rule="slips", fault="typos", component="observation",
            level="content", phase="response", action="garble", params={}, effect={})
    rest(log, 0.2, "/api/gone", status=404, faults=("slips",))
    log.add("fault", 0.3, session="127.0.0.1", rule="slips", fault="typos", component="observation",
            level="content", phase="response", action="garble", params={}, effect={})
    rest(log, 0.3, "/api/search", status=200, faults=("slips",))
    b = behaviour(read_sessions(log.write(tmp_path / "log.jsonl")))
    assert (b.tool_calls, b.perturbed_calls, b.disrupted_calls, b.failed_upstream_calls) == (3, 3, 1, 1)


# --- 3. a retry is a repeat of a failed call; recovery is reaching the goal ------------------------


def test_an_agent_that_never_retries_shows_no_retry_and_no_recovery(tmp_path: Path) -> None:
    """A blind loop: the same endpoint for city after city, and a round of tools, whatever the answers."""
    log = LogWriter()
    log.fault(0.1, "down", "http_error", "respond", session="127.0.0.1")
    rest(log, 0.1, status=503, outcome="fault_response", faults=("down",))  # paris
    rest(log, 0.2)  # tokyo
    rest(log, 0.3)  # lima
    log.fault(0.4, "down2", "http_error", "respond", session="127.0.0.1")
    rest(log, 0.4, "/api/search", method="POST", status=503, outcome="fault_response", faults=("down2",))
    rest(log, 0.5, "/api/news")
    rest(log, 0.6, "/api/search", method="POST")
    b = behaviour(read_sessions(log.write(tmp_path / "log.jsonl")))
    r = b.recovery
    assert (r.incidents, r.retried, r.got_through, r.recovered) == (2, 0, 0, None)


def test_a_retrying_agent_retries_and_its_recovery_is_the_runs_verdict(tmp_path: Path) -> None:
    log = LogWriter()
    rest(log, 0.05, "/api/search", method="POST")
    log.fault(0.1, "down", "http_error", "respond", session="127.0.0.1")
    rest(log, 0.1, status=503, outcome="fault_response", faults=("down",))
    rest(log, 0.4)  # the same request again, at once: it gets through 300 ms later
    rest(log, 0.5, "/api/search", method="POST")
    sessions = read_sessions(log.write(tmp_path / "log.jsonl"))
    r = behaviour(sessions).recovery
    assert (r.incidents, r.retried, r.got_through, r.recovered) == (1, 1, 1, None)
    assert r.median_time_to_get_through_ms == pytest.approx(300, abs=1)
    for session in sessions:
        session.reached_goal = False  # as a drill's failed run
    r = behaviour(sessions).recovery
    assert (r.recovered, r.judged) == (0, 1)


def test_a_model_call_retried_is_the_same_turn_again(tmp_path: Path) -> None:
    """Turns to the model API follow each other in any tool loop: only the same turn sent again is a retry."""
    log = LogWriter()
    model = {"http_method": "POST", "path": "/v1/messages", "api": "anthropic", "model": "m"}
    log.fault(0.1, "busy", "llm_error", "respond", session="127.0.0.1", api="anthropic")
    log.call(0.1, 5, session="127.0.0.1", status=529, outcome="fault_response", faults=("busy",), turn=0, **model)
    log.call(0.2, 5, session="127.0.0.1", turn=0, **model)
    log.call(0.3, 5, session="127.0.0.1", turn=1, **model)
    log.fault(0.4, "busy", "llm_error", "respond", session="127.0.0.1", api="anthropic")
    log.call(0.4, 5, session="127.0.0.1", status=529, outcome="fault_response", faults=("busy",), turn=2, **model)
    log.call(0.5, 5, session="127.0.0.1", turn=3, **model)  # moved on without turn 2's answer
    # a fault on a tool call in the model's reply names that tool call's id: it joins its model-API call
    log.fault(0.6, "cut", "malformed_tool_call", "rewrite", component="action", session="127.0.0.1",
              rpc_id="toolu_1", api="anthropic")
    log.call(0.6, 5, session="127.0.0.1", faults=("cut",), turn=4, **model)
    b = behaviour(read_sessions(log.write(tmp_path / "log.jsonl")))
    assert (b.model_calls, b.disrupted_model_calls, b.unattached_faults) == (6, 2, 0)
    r = b.recovery
    assert (r.incidents, r.retried, r.got_through) == (2, 1, 1)


# --- 4. a comparison drops no run --------------------------------------------------------------------

SAME = ("# sample {k} of the suite s.yaml, drawn with seed {k}\n"
        "rules:\n- name: down\n  fault: {{type: http_error, status: 503}}\n")


def test_samples_with_identical_rules_are_compared_as_one_scenario_with_all_their_runs(tmp_path: Path) -> None:
    """Samples 1 and 2 drew the same rules: one row holds the runs of both, on each side."""
    drills = {}
    for side, statuses in (("base", ("failed", "failed", "passed")), ("new", ("passed", "passed", "passed"))):
        drills[side] = _drill(tmp_path / side, 1, [
            ("run-1", "clean", "passed", {}),
            ("run-2", "sample-1", statuses[0], {"transition": 1}),
            ("run-3", "sample-2", statuses[1], {"transition": 1}),
            ("run-4", "sample-3", statuses[2], {"transition": 1}),
        ], {"clean": "rules: []\n", **{f"sample-{k}": SAME.format(k=k) for k in (1, 2)},
            "sample-3": "rules: [{name: slow, fault: {type: latency, delay_ms: 5}}]\n"})
    out = tmp_path / "c.json"
    done = chaosproxy("report", str(drills["base"]), str(drills["new"]), "--json", str(out))
    assert done.returncode == 0, done.stderr
    data = json.loads(out.read_text())
    scenarios = {row["name"]: (row["base"]["runs"], row["base"]["successes"], row["new"]["successes"])
                 for row in data["rows"] if row["section"] == "scenario"}
    assert scenarios == {"clean": (1, 1, 1), "sample-1, sample-2": (2, 0, 2), "sample-3": (1, 1, 1)}
    assert data["only_in_base"] == data["only_in_new"] == []


def test_runs_whose_scenario_cannot_be_read_are_listed_not_dropped(tmp_path: Path) -> None:
    scenarios = {"clean": "rules: []\n", "sample-1": SAME.format(k=1)}
    base = _drill(tmp_path / "base", 1, [("run-1", "clean", "passed", {}),
                                         ("run-2", "sample-1", "failed", {"transition": 1})], scenarios)
    new = _drill(tmp_path / "new", 1, [("run-1", "clean", "passed", {}),
                                       ("run-2", "sample-1", "passed", {"transition": 1})], scenarios)
    (new / "run-2" / "scenario.yaml").unlink()
    out = tmp_path / "c.json"
    assert chaosproxy("report", str(base), str(new), "--json", str(out)).returncode == 0
    data = json.loads(out.read_text())
    assert data["only_in_base"] == ["scenario sample-1"]
    assert data["only_in_new"] == ["scenario sample-1 (1 run; its scenario.yaml cannot be read)"]


def _drill(folder: Path, seed: int, results: list[tuple[str, str, str, dict[str, int]]],
           scenarios: dict[str, str], settings: dict[str, Any] | None = None) -> Path:
    """A hand-made drill folder (see tests/report/test_compare.py), its drill.json given `settings` on top."""
    from tests.report.test_compare import _drill as make

    made = make(folder, seed, results, scenarios)
    if settings:
        data = json.loads((folder / "drill.json").read_text())
        (folder / "drill.json").write_text(json.dumps({**data, **settings}))
    return made


# --- 5, 6. a gate that cannot be checked does not pass ----------------------------------------------

RESULTS = [("run-1", "clean", "passed", {}), ("run-2", "clean", "passed", {}),
           ("run-3", "sample-1", "passed", {"transition": 1}), ("run-4", "sample-1", "passed", {"transition": 1})]
SCENARIOS = {"clean": "rules: []\n", "sample-1": SAME.format(k=1)}


def shard(folder: Path, index: int, count: int = 2) -> Path:
    runs = [r for position, r in enumerate(RESULTS) if position % count == index]
    return _drill(folder, 1, runs, SCENARIOS, {"runs": len(RESULTS),
                                               "shard": {"index": index, "count": count, "runs": len(runs)}})


def test_a_gate_on_a_merge_with_a_shard_missing_cannot_pass(tmp_path: Path) -> None:
    first, second = shard(tmp_path / "s0", 0), shard(tmp_path / "s1", 1)
    gate = ["--fail-under", "transition=0.5"]
    whole = chaosproxy("report", str(first), str(second), "--merge", *gate)
    assert whole.returncode == 0, whole.stderr
    done = chaosproxy("report", str(first), "--merge", *gate)
    assert done.returncode == 3, done.stderr
    assert "gate failed: cannot be checked: shard(s) 1/2 not given" in done.stderr
    merged = tmp_path / "merged"
    assert chaosproxy("merge", str(first), "--out", str(merged)).returncode == 0
    done = chaosproxy("report", str(merged), *gate)
    assert done.returncode == 3 and f"gate failed: cannot be checked: {merged}: 2 of 4 runs have results" in done.stderr
    assert chaosproxy("report", str(merged)).returncode == 0  # no gate asked: a report, with its warning


def test_a_gate_on_a_drill_with_fewer_results_than_planned_cannot_pass(tmp_path: Path) -> None:
    folder = _drill(tmp_path / "d", 1, RESULTS[:3], SCENARIOS, {"runs": 4})
    short = f"gate failed: cannot be checked: {folder}: 3 of 4 runs have results"
    done = chaosproxy("report", str(folder), "--fail-under", "overall=0.5")
    assert done.returncode == 3 and short in done.stderr
    complete = _drill(tmp_path / "c", 1, RESULTS, SCENARIOS)
    assert chaosproxy("report", str(complete), "--fail-under", "overall=0.5").returncode == 0
    for base, new in ((complete, folder), (folder, complete)):
        done = chaosproxy("report", str(base), str(new), "--max-regression", "10")
        assert done.returncode == 3 and short in done.stderr
    with open(complete / "results.jsonl", "a") as out:
        out.write('{"run": "run-5", "label": "clean", "kind": "clean", "seed": 1}\n')  # a run without a status
    done = chaosproxy("report", str(complete), "--fail-under", "overall=0.5")
    assert done.returncode == 3 and "results.jsonl:5: skipped" in done.stderr, done.stderr


@pytest.mark.parametrize("points", ["nan", "inf", "-inf", "-5", "ten"])
def test_max_regression_refuses_what_is_no_number_of_points(tmp_path: Path, points: str) -> None:
    folder = _drill(tmp_path / "d", 1, RESULTS, SCENARIOS)
    done = chaosproxy("report", str(folder), str(folder), f"--max-regression={points}")
    assert done.returncode == 2 and "--max-regression" in done.stderr and "Traceback" not in done.stderr


# --- 7. a malformed drill folder is an error with FILE:LINE, or a line skipped, never a traceback -----


@pytest.mark.parametrize("line,reason", [
    ({"run": "run-2", "label": "sample-1", "kind": "sample", "seed": 1}, "no status"),
    ({"run": "run-2", "label": "sample-1", "kind": "sample", "seed": 1, "status": "passed",
      "components": "transition"}, "components: not an object"),
    ({"run": "run-2", "label": ["sample-1"], "kind": "sample", "seed": 1, "status": "passed"}, "label: not a string"),
    ({"run": "run-2", "label": "sample-1", "kind": "sample", "seed": 1, "status": "won"},
     "status: 'won' is not one of"),
    ({"run": "run-2", "label": "sample-1", "kind": "sample", "seed": 1, "status": "passed",
      "faults": {"typos": "many"}}, "faults: not counts by name"),
    ([1, 2], "not a run's result"),
])
def test_a_malformed_results_line_is_skipped_with_its_file_line_and_reason(
        tmp_path: Path, line: Any, reason: str) -> None:
    folder = _drill(tmp_path / "d", 1, RESULTS[:1], SCENARIOS, {"runs": 2})
    with open(folder / "results.jsonl", "a") as out:
        out.write(json.dumps(line) + "\n")
    for args in (["report", str(folder), "--json", str(tmp_path / "r.json")],
                 ["report", str(folder), str(folder)], ["export", str(folder), "--format", "trajectories"]):
        done = chaosproxy(*args)
        assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
        assert f"{folder / 'results.jsonl'}:2: skipped" in done.stderr and reason in done.stderr, done.stderr


@pytest.mark.parametrize("settings,reason", [
    ({"shard": "1/2"}, "shard: not an object"),
    ({"shard": {"index": 0, "count": "2", "runs": 1}}, "shard.count: not a whole number"),
    ({"runs": "4"}, "runs: not a whole number"),
    ({"seed": [1]}, "seed: not a whole number"),
    ({"config": "agent"}, "config: not an object"),
])
def test_a_malformed_drill_json_is_refused_naming_the_file_and_the_key(
        tmp_path: Path, settings: dict[str, Any], reason: str) -> None:
    folder = _drill(tmp_path / "d", 1, RESULTS, SCENARIOS, settings)
    for args in (["report", str(folder)], ["report", str(folder), "--merge"],
                 ["merge", str(folder), "--out", str(tmp_path / "m")]):
        done = chaosproxy(*args)
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
        assert f"{folder / 'drill.json'}: {reason}" in done.stderr, done.stderr


# --- acceptance: a small real drill, its numbers checked by hand ------------------------------------

PROBING_AGENT = """\
import json, os, sys, urllib.error, urllib.request
base = os.environ["CHAOSPROXY_URL"]

def call(path, body=None):
    request = urllib.request.Request(base + path, data=None if body is None else json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return reply.status
    except urllib.error.HTTPError as error:
        return error.code

call("/ready")  # a readiness probe: the upstream has no such path and answers 404
cities = [call(f"/api/weather?city={city}") for city in ("paris", "tokyo", "lima")]  # never retried
call("/mcp", {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-06-18",
     "capabilities": {}, "clientInfo": {"name": "probe", "version": "1"}}})
call("/mcp", {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "search",
     "arguments": {"query": "umbrellas"}}})
sys.exit(0 if cities == [200, 200, 200] else 1)
"""
ONE_RULE_SUITE = """\
description: the weather API fails the first call of each run
pick: 1
rules:
  - name: weather-down
    match: {path: /api/weather}
    first: 1
    fault: {type: http_error, status: 503}
"""


@pytest.fixture
def rest_and_mcp(server_loop: Any) -> Any:
    """One upstream serving the demo's REST tool API and its MCP server (POST /mcp)."""
    from chaosproxy.demo import mcp_lite, tool_server
    from chaosproxy.demo.serving import serve

    app = tool_server.make_app()
    app.router.add_post("/mcp", mcp_lite.handle)
    runner, port = server_loop.run(serve(app, "127.0.0.1", 0))
    yield f"http://127.0.0.1:{port}"
    server_loop.run(runner.cleanup())


def test_a_small_real_drill_reports_what_happened_number_by_number(rest_and_mcp: str, tmp_path: Path) -> None:
    """Three runs of an agent that never retries (clean, and two samples that drew the same rule: the
    first weather call gets a 503), in two shards. Each run: a probe answered 404 by the upstream, three
    weather calls, MCP initialize and a tools/call, all from one address (one session)."""
    agent, suite = tmp_path / "agent.py", tmp_path / "suite.yaml"
    agent.write_text(PROBING_AGENT)
    suite.write_text(ONE_RULE_SUITE)
    shards = [tmp_path / f"s{index}" for index in (0, 1)]
    for index, folder in enumerate(shards):
        done = chaosproxy("drill", "--agent", f"{sys.executable} {agent}", "--upstream", rest_and_mcp,
                          "--suite", str(suite), "--randomize", "2", "--baseline", "1", "--seed", "5",
                          "--timeout", "60", "--shard", f"{index}/2", "--out", str(folder), timeout=300)
        assert done.returncode == 0, done.stderr
    # shard 0 holds run-1 (clean) and run-3 (sample-2); shard 1 run-2 (sample-1): each line names its fault
    assert done.stdout.startswith("sample-1 (http_error)  0/1 passed (1 failed)\n"), done.stdout
    gate = ["--fail-under", "overall=0"]
    alone = chaosproxy("report", str(shards[0]), "--merge", *gate)
    assert alone.returncode == 3 and "gate failed: cannot be checked: shard(s) 1/2 not given" in alone.stderr

    out, page = tmp_path / "r.json", tmp_path / "r.html"
    whole = chaosproxy("report", *map(str, shards), "--merge", *gate, "--json", str(out), "--html", str(page))
    assert whole.returncode == 0, whole.stderr
    data = json.loads(out.read_text())
    b = data["behaviour"]
    # by hand: 3 sessions (one per run); 5 tool calls a run (the probe, 3 weather calls, 1 tools/call;
    # initialize is MCP's plumbing); the 503 in each sample run is the one call a fault changed and
    # disrupted; the probe's 404 is the upstream's own, in every run
    assert (b["sessions"], b["tool_calls"], b["perturbed_calls"], b["disrupted_calls"],
            b["failed_upstream_calls"], b["incomplete_calls"]) == (3, 15, 2, 2, 3, 0)
    # the agent went on to the next city: no retry, nothing got through on one, and both runs failed
    assert b["recovery"] | {"median_time_to_get_through_ms": None} == {
        "incidents": 2, "retried": 0, "got_through": 0, "recovered": 0, "judged": 2,
        "median_time_to_get_through_ms": None, "max_time_to_get_through_ms": None}
    profile = data["profile"]
    assert (profile["overall"]["clean"]["successes"], profile["overall"]["clean"]["runs"]) == (1, 1)
    assert (profile["overall"]["perturbed"]["successes"], profile["overall"]["perturbed"]["runs"]) == (0, 2)
    html = page.read_text()
    for definition in ("what it counts", "tool calls at least one fault fired on",
                       "with no fault to blame", "whose run reached its goal", "Wilson"):
        assert definition in html

    compared = tmp_path / "c.json"
    done = chaosproxy("report", str(shards[0]), str(shards[1]), "--json", str(compared))
    assert done.returncode == 0, done.stderr
    rows = {row["name"]: row for row in json.loads(compared.read_text())["rows"] if row["section"] == "scenario"}
    assert set(rows) == {"sample-2 (new: sample-1)"}  # the same rules under both labels, paired by content
    merged = tmp_path / "merged"
    assert chaosproxy("merge", *map(str, shards), "--out", str(merged)).returncode == 0
    done = chaosproxy("report", str(merged), str(merged), "--json", str(compared))
    rows = {row["name"]: row for row in json.loads(compared.read_text())["rows"] if row["section"] == "scenario"}
    assert set(rows) == {"clean", "sample-1, sample-2"} and rows["sample-1, sample-2"]["base"]["runs"] == 2
