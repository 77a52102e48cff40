"""`chaosproxy export --format trajectories`: perturbation-annotated call sequences, a session per line.

From a drill's folder every run's sessions are written, each with the run's outcome, so the lines can
serve as perturbation-augmented training or evaluation data as they are. What a trajectory takes from
the log's lines it names by the lines' keys.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from chaosproxy.records.drill_folder import Drill
from chaosproxy.records.logfile import Call, Fault, Session, read_sessions
from chaosproxy.telemetry.log_schema import Key


def _fault(fault: Fault, origin: float) -> dict[str, Any]:
    return {"t_ms": round((fault.ts - origin) * 1000, 3), Key.RULE: fault.rule, Key.FAULT: fault.fault,
            Key.COMPONENT: fault.component, Key.LEVEL: fault.level, Key.PHASE: fault.phase, Key.ACTION: fault.action,
            Key.PARAMS: fault.params, Key.EFFECT: fault.effect}


def _call(call: Call, origin: float) -> dict[str, Any]:
    return {"t_ms": round((call.start - origin) * 1000, 3), Key.DURATION_MS: call.duration_ms, "kind": call.kind,
            Key.METHOD: call.method, Key.TOOL: call.tool, Key.RPC_ID: call.rpc_id, Key.HTTP_METHOD: call.http_method,
            Key.PATH: call.path, Key.API: call.api, Key.MODEL: call.model, Key.STATUS: call.status,
            Key.OUTCOME: call.outcome, "disrupted": call.disrupted, "failed_upstream": call.failed_upstream,
            Key.FAULTS: [_fault(fault, origin) for fault in call.faults]}


def trajectory(session: Session) -> dict[str, Any]:
    origin = session.started
    return {Key.RUN_ID: session.run_id, Key.SEED: session.seed, Key.SESSION: session.session,
            Key.TRANSPORT: session.transport, "calls": [_call(call, origin) for call in session.calls],
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
