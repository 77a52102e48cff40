"""Compiles chaosproxy's HTTP/1.1 data plane (the `h1` and `http` packages of chaosproxy/adapters) with mypyc
when it can: the compiled modules spend about a sixth less CPU per proxied request (bench/README.md).

They are optional. Where there is no C compiler, or with CHAOSPROXY_NO_EXTENSIONS=1, the package is
the same code as Python. Which form runs, and why, is `chaosproxy --version`'s to say
(chaosproxy/adapters/compiled.py). Everything else about the package is in pyproject.toml.
"""

import hashlib
import json
import os
import sys
from pathlib import Path

from setuptools import setup

ADAPTERS = Path("chaosproxy/adapters")
# as chaosproxy/adapters/compiled.py's MODULES, which this file cannot import (the package is not built yet)
COMPILED = ("h1/heads", "h1/bodies", "h1/wire", "h1/upstream", "h1/client", "h1/listener", "http/heads", "http/calls",
            "http/route", "http/passthrough", "http/plain", "http/inspection", "http/proxy")


def extensions() -> list:
    if os.environ.get("CHAOSPROXY_NO_EXTENSIONS"):
        return []
    try:
        from mypyc.build import mypycify

        # Third-party modules need not be installed where this runs: to mypyc they are then Any. The project's
        # [tool.mypy] (its lint: a plugin, warnings) is not read: `--config-file=` names none.
        modules = mypycify(["--config-file=", "--ignore-missing-imports", "--follow-imports=silent",
                            *(str(ADAPTERS / f"{name}.py") for name in COMPILED)],
                           opt_level="3", group_name="chaosproxy_dataplane")
    except (Exception, SystemExit) as exc:  # no mypy here, or one that will not compile them
        print(f"chaosproxy: the HTTP data plane stays Python: mypyc: {exc!r}", file=sys.stderr)
        return []
    for module in modules:
        module.optional = True  # no C compiler: the package stays pure Python
    # what was compiled, so that an edited source runs as itself rather than as its stale compiled form
    (ADAPTERS / "compiled.json").write_text(json.dumps(
        {name: hashlib.sha256((ADAPTERS / f"{name}.py").read_bytes()).hexdigest() for name in COMPILED}) + "\n")
    return modules


setup(ext_modules=extensions())
