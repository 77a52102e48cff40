"""The HTTP data plane's two forms: the modules mypyc compiles at install (setup.py) and their sources.

Which one runs is `chaosproxy/adapters/compiled.py`'s choice. The rest of the suite runs whichever the
install has (CI's is compiled); here the data plane's own tests run once more on the Python sources.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from chaosproxy.adapters import compiled
from chaosproxy.adapters.compiled import NOT_COMPILED, sources_reason

ROOT = Path(__file__).resolve().parents[2]
DATA_PLANE_TESTS = ["tests/adapters/test_framing.py", "tests/adapters/test_plain_path.py",
                    "tests/adapters/test_transparency.py", "tests/adapters/test_oracle.py",
                    "tests/adapters/test_seams.py", "tests/adapters/test_client_limits.py",
                    "tests/telemetry/test_otel_hostile.py"]


def _build(folder: Path) -> None:
    """What setup.py leaves in the adapters' folder: sources, their compiled forms, compiled.json."""
    digests = {}
    for name in compiled.MODULES:
        source = f"# {name}\n".encode()
        (folder / f"{name}.py").parent.mkdir(exist_ok=True)
        (folder / f"{name}.py").write_bytes(source)
        (folder / f"{name}{importlib.machinery.EXTENSION_SUFFIXES[0]}").write_bytes(b"\x7fELF")
        digests[name] = hashlib.sha256(source).hexdigest()
    (folder / "compiled.json").write_text(json.dumps(digests))


def test_the_compiled_modules_run_until_a_source_changes(tmp_path, monkeypatch):
    monkeypatch.delenv("CHAOSPROXY_NO_EXTENSIONS", raising=False)
    _build(tmp_path)
    assert sources_reason(tmp_path) is None
    (tmp_path / "http" / "plain.py").write_text("# http/plain, edited\n")
    assert sources_reason(tmp_path) == "http/plain.py changed since it was compiled"


def test_the_sources_run_when_asked_to_or_when_the_build_is_not_whole(tmp_path, monkeypatch):
    _build(tmp_path)
    monkeypatch.setenv("CHAOSPROXY_NO_EXTENSIONS", "1")
    assert sources_reason(tmp_path) == "CHAOSPROXY_NO_EXTENSIONS is set"
    monkeypatch.delenv("CHAOSPROXY_NO_EXTENSIONS")
    (tmp_path / "compiled.json").unlink()
    assert sources_reason(tmp_path) == "compiled.json is missing"
    (tmp_path / f"{compiled.MODULES[0]}{importlib.machinery.EXTENSION_SUFFIXES[0]}").unlink()
    assert sources_reason(tmp_path) == "only some of its modules were compiled"
    for name in compiled.MODULES[1:]:
        (tmp_path / f"{name}{importlib.machinery.EXTENSION_SUFFIXES[0]}").unlink()
    assert sources_reason(tmp_path) == NOT_COMPILED


def _imported_from(env: dict[str, str]) -> list[str]:
    code = ("import chaosproxy.adapters.h1.client as a, chaosproxy.adapters.http.proxy as b; print(a.__file__); "
            "print(b.__file__)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split()


def test_the_form_chosen_is_the_one_imported_and_the_version_says_which():
    files = _imported_from(dict(os.environ))
    suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES)
    assert all(f.endswith(suffixes if compiled.REASON is None else ".py") for f in files), (compiled.FORM, files)
    proc = subprocess.run([sys.executable, "-m", "chaosproxy", "--version"], capture_output=True, text=True,
                          timeout=60)
    assert proc.stdout.strip().endswith(f"HTTP data plane {compiled.FORM}")
    if os.environ.get("CHAOSPROXY_EXPECT_COMPILED"):  # set by CI, whose machine has a C compiler
        assert compiled.REASON is None, compiled.FORM


@pytest.mark.skipif(compiled.REASON is not None, reason=f"the data plane runs as Python here already: {compiled.FORM}")
def test_the_data_plane_tests_pass_on_the_python_sources_too():
    env = {**os.environ, "CHAOSPROXY_NO_EXTENSIONS": "1"}
    assert all(f.endswith(".py") for f in _imported_from(env))
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *DATA_PLANE_TESTS],
                          cwd=ROOT, capture_output=True, text=True, timeout=900, env=env)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout.splitlines()[-1]
