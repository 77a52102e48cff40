"""Drills: suites and their sampling, the plan, and real drills of real agents against a real proxy."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from chaosproxy.drill.config import DrillConfig, load_config
from chaosproxy.drill.plan import plan_runs
from chaosproxy.drill.suite import load_suite
from chaosproxy.engine.scenario import ScenarioError, parse_scenario
from chaosproxy.records.logfile import read_events
from chaosproxy.report.build import build_report
from tests.helpers.mcp_support import serve

CHAOSPROXY = [sys.executable, "-m", "chaosproxy"]
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SUITE = """\
description: a bit of everything
pick: 2
rules:
  - name: slow
    match: {header: {range: "bytes=*"}}  # a header named range, not a distribution
    probability: !range [0.2, 0.4]
    fault: {type: latency, delay_ms: !range [10, 20]}
  - name: broken
    fault: !choice [{type: http_error, status: !choice [500, 503]}, {type: reset}]
  - name: limited
    first: !range [1, 3]
    fault: {type: rate_limit}
"""


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_a_suite_samples_reproducible_scenarios_within_its_ranges_and_choices(tmp_path: Path) -> None:
    suite = load_suite(write(tmp_path / "suite.yaml", SUITE))
    assert suite.sample(1) == suite.sample(1)
    samples = [suite.sample(seed) for seed in range(60)]
    assert len({json.dumps(sample) for sample in samples}) > 10
    rules = [rule for sample in samples for rule in sample["rules"]]
    assert all(len(sample["rules"]) == 2 for sample in samples)
    assert all(parse_scenario(yaml.safe_dump(sample)) for sample in samples)
    slow = [rule for rule in rules if rule["name"] == "slow"]
    assert all(0.2 <= rule["probability"] <= 0.4 and isinstance(rule["probability"], float) for rule in slow)
    assert {rule["fault"]["delay_ms"] for rule in slow} <= set(range(10, 21))
    assert all(rule["match"] == {"header": {"range": "bytes=*"}} for rule in slow)
    faults = [rule["fault"] for rule in rules if rule["name"] == "broken"]
    assert {json.dumps(fault, sort_keys=True) for fault in faults} == {
        '{"status": 500, "type": "http_error"}', '{"status": 503, "type": "http_error"}', '{"type": "reset"}'}
    assert {rule["first"] for rule in rules if rule["name"] == "limited"} == {1, 2, 3}


@pytest.mark.parametrize(("text", "expected"), [
    ("rules:\n  - name: a\n    probability: !range [0.9, 0.1]\n    fault: {type: reset}\n",
     ["suite.yaml:3: !range takes [low, high], two numbers with low <= high"]),
    ("rules:\n  - name: a\n    fault: {type: latency, delay_ms: !choice []}\n",
     ["suite.yaml:3: !choice takes a non-empty list"]),
    (("rules:\n  - name: a\n    fault: {type: reset}\n  - name: b\n"
      "    fault: {type: http_error, status: !choice [500, 99]}\n"),
     ["suite.yaml:5: rules[1] (b): fault.status: Input should be greater than or equal to 400"]),
    ("pick: 3\nrules:\n  - {name: a, fault: {type: reset}}\n",
     ["suite.yaml:1: pick must be from 1 to 1, the number of rules"]),
    ("rules:\n  - {name: a, fault: {type: reset}}\n  - {name: a, fault: {type: hang}}\n",
     ["suite.yaml:1: two rules are named 'a'"]),
    ("seed: 3\nrules:\n  - {name: a, fault: {type: reset}}\n",
     ["suite.yaml:1: unknown suite keys: seed (a suite has description, pick and rules)"]),
])
def test_a_bad_suite_is_refused_with_where_and_why(tmp_path: Path, text: str, expected: list[str]) -> None:
    path = write(tmp_path / "suite.yaml", text)
    with pytest.raises(ScenarioError) as caught:
        load_suite(path)
    assert [problem.removeprefix(f"{tmp_path}/") for problem in caught.value.problems] == expected


def test_the_library_suites_and_the_example_drill_are_valid() -> None:
    root = Path(__file__).resolve().parents[2]
    suites = sorted((root / "scenarios" / "suites").glob("*.yaml"))
    assert {"components.yaml", "transient.yaml"} <= {path.name for path in suites}
    for path in suites:
        suite = load_suite(path)
        assert len(suite.sample(1)["rules"]) == suite.pick
    config = load_config(root / "examples" / "drill.yaml", {})
    assert config.suite is not None and (root / config.suite).is_file()


def test_the_plan_has_clean_baselines_every_scenario_and_every_sample(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    scenarios = [write(tmp_path / "a" / "err.yaml", "rules: [{name: e, fault: {type: http_error}}]\n"),
                 write(tmp_path / "b" / "err.yaml", "rules: [{name: r, fault: {type: reset}}]\n")]
    config = DrillConfig(agent="true", upstream="http://127.0.0.1:1", scenarios=scenarios, repeat=2,
                         baseline=3, suite=write(tmp_path / "suite.yaml", SUITE), randomize=2)
    runs = plan_runs(config, root_seed=11)
    assert [run.name for run in runs] == [f"run-{i}" for i in range(1, 12)]
    labels = ["clean"] * 3 + [str(scenarios[0])] * 2 + [str(scenarios[1])] * 2
    labels += ["sample-1"] * 2 + ["sample-2"] * 2
    assert [run.label for run in runs] == labels
    assert parse_scenario(runs[0].scenario_text).rules == []
    assert runs[3].scenario_text == scenarios[0].read_text()
    assert runs[7].scenario_text == runs[8].scenario_text != runs[9].scenario_text
    assert runs[7].scenario_text.startswith("# sample 1 of the suite")
    assert len(parse_scenario(runs[7].scenario_text).rules) == 2
    assert plan_runs(config, root_seed=11) == runs
    assert len({run.seed for run in runs}) == len(runs)
    assert {run.seed for run in plan_runs(config, root_seed=12)}.isdisjoint(run.seed for run in runs)


def test_drill_settings_come_from_a_file_with_flags_on_top(tmp_path: Path) -> None:
    drill = write(tmp_path / "drill.yaml", "agent: python a.py\nupstream: http://127.0.0.1:9/mcp\nrepeat: 3")
    config = load_config(drill, {"repeat": 5, "jobs": None, "scenarios": []})
    assert (config.agent, config.repeat, config.jobs, config.baseline_runs) == ("python a.py", 5, 1, 5)
    for bad, reason in [({"stdio": "server"}, "exactly one of upstream"),
                        ({"randomize": 3}, "randomize and suite go together"),
                        ({"timeout": 0}, "timeout: Input should be greater than 0")]:
        with pytest.raises(ScenarioError, match=reason):
            load_config(drill, bad)
    with pytest.raises(ScenarioError, match="retries: Extra inputs are not permitted"):
        load_config(write(tmp_path / "bad.yaml", "agent: a\nupstream: http://h\nretries: 3\n"), {})


def python(script: Path) -> str:
    return f"{sys.executable} {script}"


def drill(*args: str, timeout: float = 120,
          env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CHAOSPROXY, "drill", *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def results(folder: Path) -> list[dict[str, Any]]:
    lines = (folder / "results.jsonl").read_text().splitlines()
    return sorted((json.loads(line) for line in lines), key=lambda r: int(r["run"].split("-")[1]))


def alive(pid: int) -> bool:
    """True while the process exists and is not a zombie waiting to be reaped."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


ENV_AGENT = """
import json, os, urllib.request
with urllib.request.urlopen(os.environ["CHAOSPROXY_URL"] + "/weather?city=lima", timeout=10) as reply:
    weather = json.load(reply)
env = {key: value for key, value in os.environ.items() if key.startswith("CHAOSPROXY_")}
print(json.dumps({"env": env, "weather": weather}))
"""


def test_a_drill_runs_the_agent_against_a_proxy_per_run_and_records_everything(upstream: str,
                                                                                tmp_path: Path) -> None:
    agent = write(tmp_path / "agent.py", ENV_AGENT)
    slow = write(tmp_path / "slow.yaml", "rules: [{name: slow, fault: {type: latency, delay_ms: 5}}]\n")
    out = tmp_path / "drill"
    with socket.create_server(("127.0.0.1", 0)) as taken:  # a run that got this CHAOSPROXY_CONTROL fails
        leaks = {"CHAOSPROXY_CONTROL": f"127.0.0.1:{taken.getsockname()[1]}", "CHAOSPROXY_EXTRA": "x"}
        done = drill("--agent", python(agent), "--upstream", f"{upstream}/api", "--scenario", str(slow),
                     "--repeat", "2", "--baseline", "1", "--jobs", "2", "--timeout", "30", "--seed", "9",
                     "--out", str(out), env=leaks)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("clean           1/1 passed\nslow (latency)  2/2 passed\n")
    assert done.stderr.count("drill: ") == 3  # a progress line per finished run (stderr is no terminal here)
    assert json.loads((out / "drill.json").read_text())["seed"] == 9
    runs = results(out)
    assert [(r["run"], r["label"], r["status"], r["exit_code"]) for r in runs] == [
        ("run-1", "clean", "passed", 0), ("run-2", "slow", "passed", 0), ("run-3", "slow", "passed", 0)]
    assert [r["faults"] for r in runs] == [{}, {"latency": 1}, {"latency": 1}]
    for r in runs:
        folder = out / r["run"]
        assert {p.name for p in folder.iterdir()} == {"scenario.yaml", "log.jsonl", "agent.stdout",
                                                       "agent.stderr", "proxy.stderr", "run.json"}
        seen = json.loads((folder / "agent.stdout").read_text())
        assert seen["weather"]["city"] == "lima"
        env = seen["env"]
        assert set(env) == {"CHAOSPROXY_URL", "CHAOSPROXY_RUN", "CHAOSPROXY_SEED"}  # the drill's own only
        url = env["CHAOSPROXY_URL"]
        assert url.startswith("http://127.0.0.1:") and url.endswith("/api") and upstream not in url
        assert (env["CHAOSPROXY_RUN"], env["CHAOSPROXY_SEED"]) == (str(folder.resolve()), str(r["seed"]))
        first = next(read_events(folder / "log.jsonl"))
        assert (first["event"], first["seed"]) == ("run", r["seed"])
        assert json.loads((folder / "run.json").read_text())["result"] == r


def test_a_judge_decides_success_when_given(upstream: str, tmp_path: Path) -> None:
    judge = write(tmp_path / "judge.py", "import os, sys\n"
                  "sys.exit(0 if os.environ['CHAOSPROXY_AGENT_EXIT'] == '3' "
                  "and os.path.isdir(os.environ['CHAOSPROXY_RUN']) else 1)\n")
    done = drill("--agent", f"{sys.executable} -c 'raise SystemExit(3)'", "--judge", python(judge),
                 "--upstream", upstream, "--timeout", "30", "--out", str(tmp_path / "d"))
    assert done.returncode == 0, done.stderr
    [run] = results(tmp_path / "d")
    assert (run["status"], run["exit_code"], run["judge_exit"], run["success"]) == ("passed", 3, 0, True)


def test_the_judge_can_still_reach_the_runs_proxy(upstream: str, tmp_path: Path) -> None:
    judge = write(tmp_path / "judge.py", "import os, urllib.request\n"
                  "urllib.request.urlopen(os.environ['CHAOSPROXY_URL'] + '/health', timeout=10).read()\n")
    done = drill("--agent", f"{sys.executable} -c pass", "--judge", python(judge), "--upstream", upstream,
                 "--timeout", "30", "--out", str(tmp_path / "d"))
    assert done.returncode == 0, done.stderr
    [run] = results(tmp_path / "d")
    assert (run["status"], run["judge_exit"]) == ("passed", 0)


HANGING_AGENT = """
import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
with open(os.path.join(os.environ["CHAOSPROXY_RUN"], "pids"), "w") as out:
    out.write(f"{os.getpid()} {child.pid}")
time.sleep(600)
"""


def test_a_hung_agent_is_a_timeout_finding_and_its_process_group_is_ended(upstream: str,
                                                                         tmp_path: Path) -> None:
    agent = write(tmp_path / "agent.py", HANGING_AGENT)
    started = time.monotonic()
    done = drill("--agent", python(agent), "--upstream", upstream, "--timeout", "3",
                 "--out", str(tmp_path / "d"))
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - started < 30
    [run] = results(tmp_path / "d")
    assert (run["status"], run["exit_code"], run["success"]) == ("timeout", None, False)
    pids = [int(pid) for pid in (tmp_path / "d" / "run-1" / "pids").read_text().split()]
    assert not any(alive(pid) for pid in pids)


def test_stopping_a_drill_ends_every_process_it_started(upstream: str, tmp_path: Path) -> None:
    agent = write(tmp_path / "agent.py", HANGING_AGENT)
    out = tmp_path / "d"
    proc = subprocess.Popen([*CHAOSPROXY, "drill", "--agent", python(agent), "--upstream", upstream,
                             "--timeout", "300", "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        pid_file = out / "run-1" / "pids"
        deadline = time.monotonic() + 60
        while not pid_file.exists() or len(pid_file.read_text().split()) < 2:
            assert time.monotonic() < deadline and proc.poll() is None, "the agent did not start"
            time.sleep(0.1)
        proxy_log = (out / "run-1" / "proxy.stderr").read_text()
        assert "listening on" in proxy_log
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    assert proc.returncode == 130 and "stopped" in stderr
    assert not any(alive(int(pid)) for pid in pid_file.read_text().split())


def test_a_run_is_replayed_with_the_same_scenario_and_seed(upstream: str, tmp_path: Path) -> None:
    agent = write(tmp_path / "agent.py", "import os, urllib.request\nfor _ in range(12):\n    try:\n"
                  "        urllib.request.urlopen(os.environ['CHAOSPROXY_URL'] + '/health', timeout=5)\n"
                  "    except OSError:\n        pass\n")
    flaky = write(tmp_path / "flaky.yaml", "rules: [{name: flaky, probability: 0.5, "
                  "fault: {type: http_error}}]")
    out = tmp_path / "d"
    assert drill("--agent", python(agent), "--upstream", upstream, "--scenario", str(flaky),
                 "--baseline", "1", "--timeout", "30", "--seed", "4", "--out", str(out)).returncode == 0
    replayed = drill("--replay", str(out / "run-2"))
    assert replayed.returncode == 0, replayed.stderr
    assert "replayed in" in replayed.stdout and "passed (the original run: passed)" in replayed.stdout

    def fired(folder: Path) -> tuple[int, list[int]]:
        events = list(read_events(folder / "log.jsonl"))
        return events[0]["seed"], [e["match_index"] for e in events if e["event"] == "fault"]

    original, replay = fired(out / "run-2"), fired(out / "run-2" / "replay-1")
    assert original == replay and 0 < len(original[1]) < 12
    assert (out / "run-2" / "replay-1" / "scenario.yaml").read_text() == flaky.read_text()


def test_bad_drill_input_is_refused_before_anything_runs(upstream: str, tmp_path: Path) -> None:
    bad = write(tmp_path / "bad.yaml", "rules: [{name: x, fault: {type: latency, delay_ms: -1}}]\n")
    used = tmp_path / "used"
    used.mkdir()
    write(used / "file", "")
    for args, message in [(["--upstream", upstream], "agent: Field required"),
                          (["--agent", "true", "--upstream", upstream, "--scenario", str(bad)],
                           f"{bad}:1: rules[0].fault.delay_ms: Input should be greater than or equal to 0"),
                          (["--agent", "true", "--upstream", upstream, "--out", str(used)], "is not empty"),
                          (["--replay", str(tmp_path)], "not a drill run's folder")]:
        done = drill(*args)
        assert done.returncode == 2 and message in done.stderr, (args, done.stderr)


STDIO_AGENT = """
import asyncio, os, shlex, sys
from mcp import Client, StdioServerParameters
async def main() -> int:
    command, *args = shlex.split(os.environ["CHAOSPROXY_STDIO_COMMAND"])
    async with Client(StdioServerParameters(command=command, args=args), read_timeout_seconds=20) as client:
        result = await client.call_tool("add", {"a": 1, "b": 2})
    return 0 if result.structured_content == {"result": 3.0} else 1
sys.exit(asyncio.run(main()))
"""


def test_a_stdio_server_is_drilled_through_a_ready_chaosproxy_stdio_command(tmp_path: Path) -> None:
    agent = write(tmp_path / "agent.py", STDIO_AGENT)
    slow = write(tmp_path / "slow.yaml", "rules: [{name: slow, match: {tool: add}, "
                                         "fault: {type: latency, delay_ms: 10}}]\n")
    out = tmp_path / "d"
    done = drill("--agent", python(agent), "--stdio", f"{sys.executable} -m chaosproxy.demo.mcp_server stdio",
                 "--scenario", str(slow), "--jobs", "2", "--timeout", "60", "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert [(r["status"], r["faults"]) for r in results(out)] == [("passed", {}), ("passed", {"latency": 1})]
    calls = [e for e in read_events(out / "run-2" / "log.jsonl") if e["event"] == "call"]
    tool_calls = {(call["transport"], call["tool"]) for call in calls if call["method"] == "tools/call"}
    assert tool_calls == {("stdio", "add")}


@pytest.fixture(scope="module")
def mcp_upstream() -> Iterator[str]:
    with serve("http") as url:
        yield f"{url}/mcp"


@pytest.mark.parametrize("agent", ["agent_naive.py", "agent_retry.py"])
def test_the_example_agents_do_their_task_through_a_clean_proxy(mcp_upstream: str, agent: str,
                                                                tmp_path: Path) -> None:
    done = drill("--agent", python(EXAMPLES / agent), "--upstream", mcp_upstream,
                 "--timeout", "60", "--out", str(tmp_path / "d"))
    assert done.returncode == 0, done.stderr
    [run] = results(tmp_path / "d")
    assert run["status"] == "passed", (tmp_path / "d" / "run-1" / "agent.stderr").read_text()
    assert (tmp_path / "d" / "run-1" / "agent.stdout").read_text().strip() == "paris 14 C + tokyo 19 C = 33.0"


def test_retrying_rides_out_transient_faults_that_fail_the_naive_agent(mcp_upstream: str,
                                                                       tmp_path: Path) -> None:
    """The acceptance drill: both example agents over the same sampled transient faults (same seed)."""
    suite = Path(__file__).resolve().parents[2] / "scenarios" / "suites" / "transient.yaml"
    profiles = {}
    for agent in ("agent_naive.py", "agent_retry.py"):
        out = tmp_path / agent
        done = drill("--agent", python(EXAMPLES / agent), "--upstream", mcp_upstream,
                     "--suite", str(suite), "--randomize", "3", "--baseline", "1", "--jobs", "2",
                     "--timeout", "60", "--seed", "2026", "--out", str(out), timeout=300)
        assert done.returncode == 0, done.stderr
        profiles[agent] = build_report(out).profile
    naive, retry = profiles["agent_naive.py"], profiles["agent_retry.py"]
    assert naive is not None and retry is not None
    assert naive.overall.clean.value == retry.overall.clean.value == 1.0
    assert naive.overall.perturbed.n >= 2 and retry.overall.perturbed.n >= 2
    assert retry.overall.perturbed.value == 1.0
    assert naive.overall.perturbed.value is not None and naive.overall.perturbed.value < 0.5


def _parent_and_session(pid: int) -> tuple[int, int]:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[1]), int(fields[3])


async def test_the_launcher_forks_warm_proxies_that_serve_report_their_exit_and_die_with_it(
        upstream: str, tmp_path: Path) -> None:
    import asyncio
    import re
    import urllib.request

    from chaosproxy.drill.launcher import Launcher

    async def listening(stderr: Path) -> int:
        pattern = re.compile(rb"listening on http://127\.0\.0\.1:(\d+) ")
        async with asyncio.timeout(30):
            while (found := pattern.search(stderr.read_bytes())) is None:
                await asyncio.sleep(0.02)
        return int(found.group(1))

    launcher = await Launcher.start()
    try:
        argv = ["run", "--upstream", upstream, "--listen", "127.0.0.1:0",
                "--log", str(tmp_path / "log.jsonl")]
        first = await launcher.launch(argv, {"PATH": os.environ["PATH"]}, tmp_path / "first.stderr")
        port = await listening(tmp_path / "first.stderr")
        assert _parent_and_session(first.pid) == (launcher.proc.pid, first.pid)  # forked, own session
        url = f"http://127.0.0.1:{port}/api/weather?city=lima"
        reply = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=10).read())
        assert json.loads(reply)["city"] == "lima"
        os.kill(first.pid, signal.SIGTERM)
        assert await asyncio.wait_for(first.wait(), 30) == 0  # stopped cleanly, and the launcher said so
        assert '"event":"call"' in (tmp_path / "log.jsonl").read_text().replace(" ", "")
        bad = await launcher.launch(["run", "--upstream", "ftp://x"], {}, tmp_path / "bad.stderr")
        assert await asyncio.wait_for(bad.wait(), 30) == 2
        assert "expected an http:// or https:// URL" in (tmp_path / "bad.stderr").read_text()
        second = await launcher.launch(argv, {}, tmp_path / "second.stderr")
        await listening(tmp_path / "second.stderr")
    finally:
        await launcher.close()
    deadline = time.monotonic() + 10
    while alive(second.pid):  # SIGKILLed with its launcher
        assert time.monotonic() < deadline, "the proxy outlived its launcher"
        await asyncio.sleep(0.05)


def test_a_drill_with_no_clean_runs_still_reports(upstream: str, tmp_path: Path) -> None:
    agent = write(tmp_path / "agent.py", "import os, urllib.request\n"
                  "urllib.request.urlopen(os.environ['CHAOSPROXY_URL'] + '/health', timeout=5)\n")
    err = write(tmp_path / "err.yaml", "rules: [{name: err, fault: {type: http_error}}]")
    out = tmp_path / "d"
    done = drill("--agent", python(agent), "--upstream", upstream, "--scenario", str(err), "--baseline", "0",
                 "--timeout", "30", "--seed", "4", "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert [r["label"] for r in results(out)] == ["err"]  # no clean run
    report = subprocess.run([*CHAOSPROXY, "report", str(out), "--json", str(tmp_path / "r.json")],
                            capture_output=True, text=True, timeout=60)
    assert report.returncode == 0, report.stderr
    assert json.loads((tmp_path / "r.json").read_text())


def test_a_drill_file_works_from_any_folder(mcp_upstream: str, tmp_path: Path) -> None:
    """Its suite and its agent command are read from the file's folder, not the working directory."""
    done = subprocess.run([*CHAOSPROXY, "drill", str(EXAMPLES / "drill.yaml"), "--upstream", mcp_upstream,
                           "--randomize", "1", "--baseline", "1", "--jobs", "1", "--out", "d"],
                          capture_output=True, text=True, timeout=180, cwd=tmp_path,
                          env={**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"})
    assert done.returncode == 0, done.stderr
    assert [r["status"] for r in results(tmp_path / "d")] == ["passed", "passed"]
