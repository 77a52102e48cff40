"""Chaos inside agent benchmarks: an Inspect AI integration (`pip install 'chaosproxy[inspect]'`).

    from chaosproxy.harness import ChaosPlan, chaos_task, mcp_server_http

    plan = ChaosPlan(suite="scenarios/suites/robustbench-tc.yaml", baseline=0.2, seed=7)
    task = chaos_task(Task(dataset=..., solver=react(tools=[mcp_server_http(url=...)]), scorer=...), plan)

Named `harness`, not after Inspect: no module here is called `inspect` or `inspect_ai`, so neither the
standard library's `inspect` nor the real `inspect_ai` can be shadowed, even for code run from inside
this folder. Nothing is imported until used: the command line reads `chaosproxy.harness.command`
without loading Inspect.

May import: the engine, faults, adapters, control, telemetry, drill (plans, suites, folders), report
(the profile), embedded, and inspect_ai; never the command line.
"""

from __future__ import annotations

from typing import Any

_EXPORTS = {
    "ChaosPlan": "chaosproxy.harness.plan",
    "chaos_task": "chaosproxy.harness.task",
    "chaos_solver": "chaosproxy.harness.task",
    "mcp_server_http": "chaosproxy.harness.tools",
    "mcp_server_sse": "chaosproxy.harness.tools",
    "mcp_server_stdio": "chaosproxy.harness.tools",
    "chaos_accuracy": "chaosproxy.harness.metrics",
    "chaos_by_component": "chaosproxy.harness.metrics",
    "chaos_by_fault": "chaosproxy.harness.metrics",
    "chaos_pass_k": "chaosproxy.harness.metrics",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_EXPORTS[name]), name)
