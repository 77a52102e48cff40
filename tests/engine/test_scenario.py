"""Scenario validation: every bad input is rejected with FILE:LINE: reason."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from chaosproxy.engine.scenario import ScenarioError, load_scenario, parse_scenario
from chaosproxy.faults import REGISTRY

CONTRACT = """\
seed: 42
rules:
  - name: slow-search
    match:
      http_method: POST
      path: "/api/*"
      method: "tools/call"
      tool: "search*"
      header: {x-env: staging}
    probability: 0.5
    after: 2
    first: 3
    every: 2
    window: {start_s: 10, duration_s: 60}
    fault: {type: latency, delay_ms: 1500, jitter_ms: 200}
"""


def problems(text: str) -> list[str]:
    with pytest.raises(ScenarioError) as caught:
        parse_scenario(text, "s.yaml")
    return caught.value.problems


def test_the_documented_contract_parses():
    scenario = parse_scenario(CONTRACT)
    assert scenario.seed == 42
    [rule] = scenario.rules
    assert (rule.match.tool, rule.after, rule.first, rule.every, rule.fault.delay_ms) == ("search*", 2, 3, 2, 1500)


@pytest.mark.parametrize("text,line,reason", [
    ("rules: [\n  {name: a\n", 3, "invalid YAML"),
    ("rules:\n  - name: a\n    fault: {type: nope}\n", 3, "does not match any of the expected tags"),
    ("rules:\n  - name: a\n    fault:\n      type: latency\n      delay_ms: -5\n", 5, "greater than or equal to 0"),
    ("rules:\n  - name: a\n    colour: red\n    fault: {type: hang}\n", 3, "rules[0].colour: Extra inputs"),
    ("rules:\n  - name: a\n    fault: {type: hang}\n    probability: 1.5\n", 4, "less than or equal to 1"),
    ("rules:\n  - name: a\n    fault: {type: hang}\n    every: zero\n", 4, "valid integer"),
    ("rules:\n  - name: a\n    fault: {type: truncate, bytes: 3, fraction: 0.5}\n", 3, "exactly one of"),
    ("rules:\n  - name: a\n    match: {method: initialize, tool: x}\n    fault: {type: hang}\n", 3, "tools/call"),
    ("rules:\n  - name: a\n    fault: {type: latency, delay_ms: 9, distribution: uniform}\n", 3, "needs max_ms"),
    ("rules:\n  - name: a\n    fault: {type: auth_error, status: 500}\n", 3, "401"),
    ("rules:\n  - {name: a, fault: {type: hang}}\n  - {name: a, fault: {type: hang}}\n", 1, "unique"),
    ("rules:\n  - name: a\n", 2, "rules[0].fault: Field required"),
    ("- just\n- a list\n", 1, "a mapping"),
])
def test_bad_scenarios_name_file_line_and_reason(text, line, reason):
    found = problems(text)
    assert any(p.startswith(f"s.yaml:{line}: ") and reason in p for p in found), found


def test_an_unreadable_file_is_a_clear_error(tmp_path: Path):
    with pytest.raises(ScenarioError, match="cannot read"):
        load_scenario(tmp_path / "missing.yaml")


@pytest.mark.slow
def test_schema_covers_every_fault():
    out = subprocess.run([sys.executable, "-m", "chaosproxy", "schema"], capture_output=True, text=True, check=True)
    schema = json.loads(out.stdout)
    assert set(REGISTRY) <= {d["properties"]["type"]["const"] for d in schema["$defs"].values()
                             if "type" in d.get("properties", {}) and "const" in d["properties"]["type"]}


@pytest.mark.slow
def test_validate_exit_codes(tmp_path: Path):
    good, bad = tmp_path / "good.yaml", tmp_path / "bad.yaml"
    good.write_text(CONTRACT)
    bad.write_text("rules:\n  - name: x\n    fault: {type: latency, delay_ms: -1}\n")
    run = lambda *files: subprocess.run([sys.executable, "-m", "chaosproxy", "validate", *map(str, files)],  # noqa: E731
                                        capture_output=True, text=True)
    assert run(good).returncode == 0
    result = run(good, bad)
    assert result.returncode == 2
    assert f"{bad}:3: rules[0].fault.delay_ms" in result.stderr


def test_every_library_scenario_is_valid():
    library = Path(__file__).resolve().parents[2].joinpath("scenarios")
    files = sorted(path for path in library.rglob("*.yaml") if "suites" not in path.relative_to(library).parts)
    assert files  # suites/ holds drill suites, checked in test_drill.py
    for path in files:
        assert load_scenario(path).rules, path

