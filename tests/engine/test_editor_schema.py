"""The JSON Schemas `chaosproxy schema` prints validate every library file and say one reason per mistake."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
SUITES = sorted((ROOT / "scenarios" / "suites").glob("*.yaml"))
SCENARIOS = sorted(p for p in (ROOT / "scenarios").rglob("*.yaml") if p.parent.name != "suites")


class _EditorLoader(yaml.SafeLoader):
    """What an editor with `yaml.customTags: ["!range sequence", "!choice sequence"]` sees."""


_EditorLoader.add_constructor("!range", lambda loader, node: loader.construct_sequence(node))
_EditorLoader.add_constructor("!choice", lambda loader, node: loader.construct_sequence(node, deep=True))


def schema(*args: str) -> dict:
    done = subprocess.run([sys.executable, "-m", "chaosproxy", "schema", *args], capture_output=True, text=True,
                          timeout=60, check=True)
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def validators() -> dict[str, jsonschema.Draft202012Validator]:
    return {"scenario": jsonschema.Draft202012Validator(schema()),
            "suite": jsonschema.Draft202012Validator(schema("--suite"))}


@pytest.mark.slow
def test_every_library_scenario_and_suite_is_valid(validators) -> None:
    assert SCENARIOS and SUITES
    for path in SCENARIOS:
        errors = [e.message for e in validators["scenario"].iter_errors(yaml.safe_load(path.read_text()))]
        assert not errors, f"{path}: {errors}"
    for path in SUITES:
        errors = [e.message for e in validators["suite"].iter_errors(yaml.load(path.read_text(), _EditorLoader))]
        assert not errors, f"{path}: {errors}"


@pytest.mark.slow
def test_a_bad_parameter_gets_one_reason(validators) -> None:
    bad = {"rules": [{"name": "slow", "fault": {"type": "latency", "delay_ms": -5}}]}
    errors = list(validators["scenario"].iter_errors(bad))
    assert [e.message for e in errors] == ["-5 is less than the minimum of 0"]
    unknown = {"rules": [{"name": "x", "fault": {"type": "nope"}}]}
    [error] = validators["scenario"].iter_errors(unknown)
    assert "'nope' is not one of" in error.message


def test_suites_need_their_own_schema(validators) -> None:
    suite = yaml.load(SUITES[0].read_text(), _EditorLoader)
    assert list(validators["scenario"].iter_errors(suite))  # pick and drawn values are suite-only
    assert not list(validators["suite"].iter_errors(suite))
