"""`chaosproxy export --format trajectories`: perturbation-annotated call sequences, a session per line.

From a drill's folder every run's sessions are written, each with the run's outcome, so the lines can
serve as perturbation-augmented training or evaluation data as they are.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from chaosproxy.records.drill_folder import Drill
from chaosproxy.records.logfile import Call, Fault, Session, read_sessions


def _fault(fault: Fault, origin: float) -> dict[str, Any]:
    return {"t_ms": round((fault.ts - origin) * 1000, 3), "rule": fault.rule, "fault": fault.fault,
            "component": fault.component, "level": fault.level, "phase": fault.phase, "action": fault.action,
            "params": fault.params, "effect": fault.effect}


def _call(call: Call, origin: float) -> dict[str, Any]:
    return {"t_ms": round((call.start - origin) * 1000, 3), "duration_ms": call.duration_ms, "kind": call.kind,
            "method": call.method, "tool": call.tool, "rpc_id": call.rpc_id, "http_method": call.http_method,
            "path": call.path, "api": call.api, "model": call.model, "status": call.status, "outcome": call.outcome,
            "disrupted": call.disrupted, "failed_upstream": call.failed_upstream,
            "faults": [_fault(fault, origin) for fault in call.faults]}


def trajectory(session: Session) -> dict[str, Any]:
    origin = session.started
    return {"run_id": session.run_id, "seed": session.seed, "session": session.session,
            "transport": session.transport, "calls": [_call(call, origin) for call in session.calls],
            "unattached_faults": [_fault(fault, origin) for fault in session.unattached]}


def trajectories(source: Path | Drill) -> Iterator[dict[str, Any]]:
    """From a log file, its sessions; from a drill, every run's, with the run's outcome."""
    if isinstance(source, Path):
        yield from (trajectory(session) for session in read_sessions(source))
        return
    for result in source.results:
        log = source.log(result["run"])
        if log.is_file():
            outcome = {"drill_run": result["run"], "scenario": result["label"], "status": result["status"],
                       "success": result.get("success")}
            yield from ({**outcome, **trajectory(session)} for session in read_sessions(log))
