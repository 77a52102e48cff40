"""The scenario library's acceptance drill: every RobustBench-TC rule, drilled with the retrying
example agent against the bundled MCP server, reaches the agent as data its client accepts.

A run may fail (a rate limit the agent's backoff cannot ride out is the agent's problem), but not
because the SDK client rejected a result the fault made invalid, unless breaking the result is the
rule's point (schema_drift renames keys; malformed_response sends broken frames).
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from chaosproxy.drill.suite import draw, load_suite
from tests.helpers.mcp_support import serve

ROOT = Path(__file__).resolve().parents[2]
SUITE = ROOT / "scenarios" / "suites" / "robustbench-tc.yaml"
BREAKS_RESULTS_ON_PURPOSE = {"schema_drift", "malformed_response"}
# What the SDK client says when it rejects a result or a frame (output schema, message model).
CLIENT_SIDE_VALIDATION = ("Invalid structured content", "did not return structured content",
                          "validation error for")


@pytest.mark.timeout(900)
def test_no_robustbench_rule_fails_the_retrying_agent_by_client_side_validation(tmp_path: Path) -> None:
    suite = load_suite(SUITE)
    scenarios = []
    for i, template in enumerate(suite.rules):
        path = tmp_path / f"{template['name']}.yaml"
        path.write_text(yaml.safe_dump({"rules": [draw(template, random.Random(i))]}))
        scenarios += ["--scenario", str(path)]
    out = tmp_path / "drill"
    with serve("http") as url:
        done = subprocess.run(
            [sys.executable, "-m", "chaosproxy", "drill",
             "--agent", f"{sys.executable} {ROOT / 'examples' / 'agent_retry.py'}",
             "--upstream", f"{url}/mcp", *scenarios, "--jobs", "2", "--timeout", "90", "--seed", "14",
             "--out", str(out)], capture_output=True, text=True, timeout=840)
    assert done.returncode == 0, done.stderr
    runs = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert len(runs) == len(suite.rules) + 1  # and the clean baseline
    rejected = {}
    for run in runs:
        rule = run["label"].removesuffix(".yaml")
        stderr = (out / run["run"] / "agent.stderr").read_text()
        if rule not in BREAKS_RESULTS_ON_PURPOSE and any(text in stderr for text in CLIENT_SIDE_VALIDATION):
            rejected[rule] = next(line for line in stderr.splitlines()
                                  if any(text in line for text in CLIENT_SIDE_VALIDATION))
    assert rejected == {}
    fired = {run["label"].removesuffix(".yaml") for run in runs if run.get("faults")}
    assert len(fired) >= len(suite.rules) * 2 // 3  # most rules met the agent
    passed = {run["label"].removesuffix(".yaml") for run in runs if run["status"] == "passed"}
    assert {"realistic_typos", "same_name_D", "redundant", "CD", "TD_AB"} <= passed
