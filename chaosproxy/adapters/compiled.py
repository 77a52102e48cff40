"""Which form of the HTTP/1.1 data plane runs: the modules mypyc compiled at install, or their sources.

`pip install` compiles the modules of `h1` and `http` when it can (setup.py, which records each source's SHA-256 in
compiled.json). The compiled modules run unless CHAOSPROXY_NO_EXTENSIONS is set or a source changed
since it was compiled (an edited checkout; `pip install -e .` compiles it again). Otherwise the sources
run, all of them: the compiled modules of one build call each other directly, so they cannot be mixed
with sources.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

HERE = Path(__file__).parent
# the compiled modules, as paths under this folder without ".py" (the packages' __init__ files, and `http`'s
# `traced`, which subclasses a compiled class, stay Python)
MODULES = ("h1/heads", "h1/bodies", "h1/wire", "h1/upstream", "h1/client", "h1/listener", "http/heads", "http/calls",
           "http/route", "http/passthrough", "http/plain", "http/inspection", "http/proxy")
_NAMES = {f"{__package__}.{module.replace('/', '.')}": module for module in MODULES}
NOT_COMPILED = "not compiled"


def sources_reason(folder: Path = HERE) -> str | None:
    """Why the sources in `folder` must run rather than their compiled forms (None: they need not)."""
    built = [any((folder / f"{name}{suffix}").exists() for suffix in importlib.machinery.EXTENSION_SUFFIXES)
             for name in MODULES]
    if not any(built):
        return NOT_COMPILED
    if not all(built):
        return "only some of its modules were compiled"
    if os.environ.get("CHAOSPROXY_NO_EXTENSIONS"):
        return "CHAOSPROXY_NO_EXTENSIONS is set"
    try:
        digests = json.loads((folder / "compiled.json").read_text())
    except (OSError, ValueError):
        return "compiled.json is missing"
    for name in MODULES:
        if digests.get(name) != hashlib.sha256((folder / f"{name}.py").read_bytes()).hexdigest():
            return f"{name}.py changed since it was compiled"
    return None


class _Sources(importlib.abc.MetaPathFinder):
    """An import finder ahead of the others: the data plane's modules from their .py files."""

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None,
                  ) -> importlib.machinery.ModuleSpec | None:
        module = _NAMES.get(fullname)
        if module is None:
            return None
        return importlib.util.spec_from_file_location(fullname, HERE / f"{module}.py")


REASON = sources_reason()
FORM = "compiled (mypyc)" if REASON is None else f"Python ({REASON})"

if REASON is not None and REASON != NOT_COMPILED:
    sys.meta_path.insert(0, _Sources())
