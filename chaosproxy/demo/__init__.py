"""The bundled servers (REST tools, MCP, a scripted model API) and `chaosproxy demo` (demo/story.py).

Nothing is imported here, so `python -m chaosproxy.demo.<server>` runs a server module only once.
"""

from __future__ import annotations

from pathlib import Path


def run_demo(log_path: Path | None = None) -> int:
    from chaosproxy.demo.story import run_demo as run

    return run(log_path)
