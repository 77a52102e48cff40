"""The perturbation log's keys are spelled in its schema only (issue 32): readers take them from
log_schema.Key, the call line is made by log_schema.call_line, writers pass typed keyword arguments.
A key spelled as a string elsewhere is a rename that mypy and these tests could not follow."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from chaosproxy.telemetry import log_schema
from chaosproxy.telemetry.log_schema import LINES, CallLine, Key

PACKAGE = Path(__file__).resolve().parents[2] / "chaosproxy"
SCHEMA = PACKAGE / "telemetry" / "log_schema.py"
CALL_KEYS = frozenset(CallLine.__annotations__)
# Call-line keys that also name other things in the package, so a string of them elsewhere is no log key:
SHARED = frozenset({
    "event", "seed", "proxy", "scope",  # the control API's query parameters and JSON, the scenario's seed
    "transport", "session", "status", "faults",  # the CLI's subcommand, HTTP statuses, drill results' counts
    "method", "tool", "path", "api", "model",  # JSON-RPC, MCP, model-API bodies; a scenario's match keys
})
OWN_KEYS = CALL_KEYS - SHARED  # the call line's own: named nowhere else, so spelled nowhere but the schema
# The log's own readers and writers: not even a shared word is spelled there as a key.
LOG_MODULES = ("telemetry/log.py", "telemetry/metrics.py", "records/logfile.py", "control/journal.py",
               "harness/gateway.py", "adapters/http/calls.py")


def _strings(source: str) -> list[ast.Constant]:
    """The string constants of a module, but its docstrings and `__slots__` (attribute names)."""
    tree = ast.parse(source)
    left_out: set[int] = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant):
            left_out.add(id(body[0].value))
        if isinstance(node, ast.Assign) and any(getattr(target, "id", "") == "__slots__" for target in node.targets):
            left_out.update(id(inner) for inner in ast.walk(node.value))
    return [node for node in ast.walk(tree) if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and id(node) not in left_out]


def _as_keys(source: str) -> list[ast.Constant]:
    """The string constants used as a key: of a dict display, a subscript, `.get`/`.pop`/`.setdefault`."""
    found: list[ast.expr | None] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Dict):
            found += node.keys
        elif isinstance(node, ast.Subscript):
            found.append(node.slice)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args \
                and node.func.attr in ("get", "pop", "setdefault"):
            found.append(node.args[0])
    return [node for node in found if isinstance(node, ast.Constant) and isinstance(node.value, str)]


@pytest.mark.slow
def test_no_module_but_the_schema_spells_a_call_line_key() -> None:
    assert len(OWN_KEYS) >= 8
    spelled = [f"{path.relative_to(PACKAGE)}:{node.lineno}: {node.value!r}" for path in sorted(PACKAGE.rglob("*.py"))
               if path != SCHEMA for node in _strings(path.read_text()) if node.value in OWN_KEYS]
    assert spelled == []


def test_the_log_s_own_readers_and_writers_spell_no_key_at_all() -> None:
    spelled = [f"{module}:{node.lineno}: {node.value!r}" for module in LOG_MODULES
               for node in _as_keys((PACKAGE / module).read_text()) if node.value in CALL_KEYS]
    assert spelled == []


def test_the_checks_find_a_key_spelled_as_a_string() -> None:
    source = '''"""A docstring may say "outcome"."""
class Call:
    __slots__ = ("outcome", "status")
    def read(self, line):
        return line.get("duration_ms"), line["status"], {"tool": 1}, "rpc_id", Key.OUTCOME
'''
    assert sorted(node.value for node in _strings(source) if node.value in OWN_KEYS) == ["duration_ms", "rpc_id"]
    assert sorted(node.value for node in _as_keys(source) if node.value in CALL_KEYS) == ["duration_ms", "status",
                                                                                          "tool"]


def test_every_key_of_every_line_has_its_name_in_the_schema() -> None:
    names = {value for name, value in vars(Key).items() if name.isupper()}
    keys = {key for line in LINES.values() for key in line.__annotations__}
    assert CALL_KEYS <= names <= keys
    assert all(getattr(Key, value.upper()) == value for value in names)


def test_a_call_line_has_its_keys_in_order_and_only_the_ones_that_apply() -> None:
    line = log_schema.call_line("2026-12-01T00:00:00.000000+00:00", "run", 7, "http", "s", None, "POST", "/mcp",
                                200, "ok", 10, 1.5, ("r",), ("tools/call", "search", 3), None)
    assert list(line) == ["ts", "event", "run_id", "seed", "transport", "session", "route", "http_method", "path",
                          "status", "outcome", "bytes_out", "duration_ms", "faults", "method", "tool", "rpc_id"]
    model = log_schema.call_line("t", "run", 7, "http", "s", None, "POST", "/v1/messages", 200, "ok", 10, 1.5, (),
                                 None, ("anthropic", "claude", 2))
    assert (model["api"], model["model"], model["turn"]) == ("anthropic", "claude", 2) and "method" not in model
