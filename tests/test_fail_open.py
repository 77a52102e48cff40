"""Every catch-all in the package says it is one (issue 32): a handler of Exception or BaseException
(or a bare `except:`, or `contextlib.suppress(Exception)`) that never raises again carries the marker
`# fail open: <what goes on instead>` on its line, so that the places the proxy swallows a failure
on purpose can be found (`grep -rn "fail open:" chaosproxy`), and a new silent catch fails here. A
handler that raises again on some path (cleans up, or lets through what it does not expect) is a filter,
not a catch-all."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "chaosproxy"
MARKER = "# fail open: "
BROAD = frozenset({"Exception", "BaseException"})


def _names(node: ast.expr | None) -> set[str]:
    """The class names an `except` clause (or a suppress call's argument) names; a bare except: `*`."""
    if node is None:
        return {"*"}
    items = node.elts if isinstance(node, ast.Tuple) else [node]
    return {item.id if isinstance(item, ast.Name) else item.attr if isinstance(item, ast.Attribute) else ""
            for item in items}


def _silent_catch_alls(source: str) -> list[int]:
    """The lines of catch-alls in `source` that neither raise again nor carry the marker."""
    lines = source.splitlines()
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ExceptHandler):
            broad = bool(_names(node.type) & (BROAD | {"*"}))
            raises = any(isinstance(inner, ast.Raise) for statement in node.body for inner in ast.walk(statement))
            if broad and not raises:
                found.append(node.lineno)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute | ast.Name) \
                and (node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id) == "suppress" \
                and any(_names(argument) & BROAD for argument in node.args):
            found.append(node.lineno)
    return [line for line in found if MARKER not in lines[line - 1]]


@pytest.mark.slow
def test_every_catch_all_in_the_package_is_marked_fail_open() -> None:
    unmarked = [f"{path.relative_to(PACKAGE.parent)}:{line}" for path in sorted(PACKAGE.rglob("*.py"))
                for line in _silent_catch_alls(path.read_text())]
    assert unmarked == []


def test_the_check_finds_what_it_is_for() -> None:
    """A silent catch-all of each kind is found; one that raises again, a narrow one or a marked one is not."""
    source = '''
import contextlib
try: f()
except Exception: pass
try: f()
except (OSError, BaseException) as exc: log(exc)
try: f()
except: pass
with contextlib.suppress(Exception): f()
try: f()
except BaseException:
    cleanup()
    raise
try: f()
except OSError: pass
try: f()
except Exception as exc:
    if not expected(exc):
        raise
try: f()
except Exception:  # fail open: the message passes as it came
    pass
'''
    assert _silent_catch_alls(source) == [4, 6, 8, 9]
