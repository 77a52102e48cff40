"""The contracts mypy holds the code to (issue 32), shown to fail as they should: a fault that returns
something outside the Action union, and a log line written with a misspelled key. mypy runs on a small
module that imports the package (what it imports is read, not checked: follow_imports=silent)."""

from __future__ import annotations

from pathlib import Path

import pytest

api = pytest.importorskip("mypy.api", reason="mypy is CI's dev extra")

ROOT = Path(__file__).resolve().parents[1]
WRONG = '''
from typing import Any, Literal

from chaosproxy.engine.actions import Action, Delay
from chaosproxy.engine.message import Phase
from chaosproxy.faults.base import Component, Fault, FaultContext, Level
from chaosproxy.telemetry.log import PerturbationLog


class Transition(Fault):
    component = Component.TRANSITION
    level = Level.HTTP
    phase = Phase.REQUEST


class ReturnsNoAction(Transition):
    type: Literal["returns_no_action"] = "returns_no_action"

    def act(self, ctx: FaultContext) -> Action:
        return {"delay_s": 1.0}  # refused: not an action


class DeclaresNoAction(Transition):
    type: Literal["declares_no_action"] = "declares_no_action"

    def act(self, ctx: FaultContext) -> dict[str, Any]:  # refused: outside the Action union
        return {}


class Delays(Transition):
    type: Literal["delays"] = "delays"

    def act(self, ctx: FaultContext) -> Delay:
        return Delay(1.0)


def write(log: PerturbationLog) -> None:
    log.call(transport="http", session="s", outcome="ok", duration_ms=1.0, faults=(), stauts=200)  # refused
    log.skip(rule=None, reason="not JSON", sesion="s")  # refused: a misspelled key
    log.fault(rule="r")  # refused: a fault line without its required keys
    log.error(error="e", turn="3")  # refused: a value of the wrong type
    log.control(change="reset")
    log.call(transport="http", session="s", outcome="ok", duration_ms=1.0, faults=(), status=200)
'''


@pytest.mark.slow
def test_mypy_refuses_a_fault_returning_no_action_and_a_misspelled_log_key(tmp_path: Path) -> None:
    module = tmp_path / "wrong.py"
    module.write_text(WRONG)
    out, _, status = api.run([str(module), "--config-file", str(ROOT / "pyproject.toml"), "--strict",
                              "--follow-imports", "silent", "--cache-dir", str(tmp_path / "cache")])
    errors = {int(line.split(":")[1]): line.split(": error: ", 1)[1] for line in out.splitlines()
              if ": error: " in line}
    source = WRONG.splitlines()
    refused = {n for n, line in enumerate(source, 1) if "# refused" in line}
    assert status == 1 and set(errors) == refused and len(refused) == 6  # Delays and the right calls pass
    assert any("Incompatible return value type" in error and "Delay | Respond" in error for error in errors.values())
    assert 'did you mean "status"' in errors[next(n for n in refused if "stauts" in source[n - 1])]
