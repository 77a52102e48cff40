"""The A2A acceptance drill: two scripted delegating agents (the a2a-sdk client: one that trusts the remote
agent, one that bounds, retries and polls) over the A2A scenario library, against the bundled remote
agent; the comparison report tells them apart."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from chaosproxy.demo import a2a_agent
from tests.helpers.support import ServerLoop

ROOT = Path(__file__).resolve().parents[2]
LIBRARY = sorted((ROOT / "scenarios" / "a2a").glob("*.yaml"))
# What a careful delegating agent rides out and a trusting one does not.
TELLS_THEM_APART = {"task_stuck", "stream_drop", "stream_drop_final", "input_required_loop", "task_failed",
                    "task_rejected", "transient_503"}
HARMLESS = {"agent_card_drift", "push_lost", "artifact_injection"}  # to an agent that reads the plan's city


@pytest.fixture(scope="module")
def bundled_agent(server_loop: ServerLoop) -> Iterator[str]:
    runner, port = server_loop.run(a2a_agent.start())
    yield f"http://127.0.0.1:{port}"
    server_loop.run(runner.cleanup())


def _drill(agent: str, upstream: str, out: Path) -> dict[str, str]:
    scenarios = [arg for path in LIBRARY for arg in ("--scenario", str(path))]
    done = subprocess.run(
        [sys.executable, "-m", "chaosproxy", "drill", "--agent", f"{sys.executable} {ROOT / 'examples' / agent}",
         "--upstream", upstream, *scenarios, "--baseline", "1", "--jobs", "2", "--timeout", "20", "--seed", "27",
         "--out", str(out)], capture_output=True, text=True, timeout=400)
    assert done.returncode in (0, 1), done.stderr  # (1: some runs failed, which is what a drill finds)
    runs = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    return {run["label"].removesuffix(".yaml"): run["status"] for run in runs}


@pytest.mark.timeout(900)
def test_the_drill_tells_a_careful_delegating_agent_from_a_trusting_one(bundled_agent: str, tmp_path: Path) -> None:
    naive = _drill("a2a_delegate_naive.py", bundled_agent, tmp_path / "naive")
    careful = _drill("a2a_delegate_careful.py", bundled_agent, tmp_path / "careful")
    assert naive["clean"] == careful["clean"] == "passed"
    for scenario in TELLS_THEM_APART:
        assert careful[scenario] == "passed", (scenario, careful)
        assert naive[scenario] in ("failed", "timeout"), (scenario, naive)
    assert naive["task_stuck"] == "timeout"  # it waits on a silent stream until the drill ends it
    for scenario in HARMLESS:
        assert naive[scenario] == careful[scenario] == "passed", scenario
    report = subprocess.run([sys.executable, "-m", "chaosproxy", "report", str(tmp_path / "naive"),
                             str(tmp_path / "careful"), "--json", str(tmp_path / "compare.json")],
                            capture_output=True, text=True, timeout=120)
    assert report.returncode == 0, report.stderr
    compare: Any = json.loads((tmp_path / "compare.json").read_text())
    assert "transition" in json.dumps(compare) and "better" in json.dumps(compare)
