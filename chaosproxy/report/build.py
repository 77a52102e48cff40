"""A report's content: profile, behaviour and timelines from a drill's folder; the latter two from a log."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from chaosproxy import __version__
from chaosproxy.report.behaviour import Behaviour, Recovery, behaviour
from chaosproxy.report.logfile import Session, read_sessions
from chaosproxy.report.profile import Profile, ProfileRow, build_profile
from chaosproxy.report.stats import Rate


@dataclass(frozen=True, slots=True)
class Timeline:
    title: str
    status: str | None  # the run's, in a drill
    session: Session


@dataclass(frozen=True)
class Report:
    source: str
    generated: str
    drill: dict[str, Any] | None
    profile: Profile | None
    behaviour: Behaviour
    timelines: list[Timeline]  # runs that did not pass first


def read_results(folder: Path) -> list[dict[str, Any]]:
    """A drill's results.jsonl (written as runs finish) in run order."""
    lines = (folder / "results.jsonl").read_text(encoding="utf-8").splitlines()
    results = [json.loads(line) for line in lines if line.strip()]
    return sorted(results, key=lambda result: int(result["run"].rpartition("-")[2]))


def build_report(path: Path) -> Report:
    """Raises ValueError when `path` is neither a drill's folder nor a log file."""
    generated = datetime.now(UTC).isoformat(timespec="seconds")
    if path.is_file():
        sessions = read_sessions(path)
        timelines = [Timeline(f"session {s.session} of run {s.run_id}", None, s) for s in sessions]
        return Report(str(path), generated, None, None, behaviour(sessions), timelines)
    if not (path / "results.jsonl").is_file():
        raise ValueError(f"{path}: neither a perturbation log nor a drill's folder (no results.jsonl)")
    results = read_results(path)
    drill_file = path / "drill.json"
    drill = json.loads(drill_file.read_text(encoding="utf-8")) if drill_file.is_file() else None
    timelines = []
    for result in sorted(results, key=lambda r: r["status"] == "passed"):  # stable: run order within each
        log = path / result["run"] / "log.jsonl"
        sessions = read_sessions(log) if log.is_file() else []
        title = f"{result['run']} · {result['label']} · {result['status']}"
        title += f" · trace {result['trace_id']}" if result.get("trace_id") else ""
        timelines += [Timeline(title + (f" · session {s.session}" if len(sessions) > 1 else ""),
                               result["status"], s) for s in sessions]
    return Report(str(path), generated, drill, build_profile(results),
                  behaviour(timeline.session for timeline in timelines), timelines)


def _rate(rate: Rate) -> dict[str, Any]:
    low, high = rate.interval
    return {"successes": rate.successes, "runs": rate.n, "rate": rate.value,
            "ci95": [round(low, 4), round(high, 4)]}


def _row(row: ProfileRow) -> dict[str, Any]:
    interval = row.drop_interval
    return {"name": row.name, "clean": _rate(row.clean), "perturbed": _rate(row.perturbed), "drop": row.drop,
            "drop_ci95": [round(interval[0], 4), round(interval[1], 4)] if interval else None}


def _recovery(recovery: Recovery) -> dict[str, Any]:
    return {**asdict(recovery), "gave_up": recovery.gave_up}


def report_json(report: Report) -> dict[str, Any]:
    data: dict[str, Any] = {"source": report.source, "generated": report.generated, "chaosproxy": __version__}
    if report.drill is not None:
        data["drill"] = report.drill
    if (profile := report.profile) is not None:
        data["profile"] = {
            "runs": profile.runs, "errors": profile.errors, "unexposed": profile.unexposed,
            "overall": _row(profile.overall),
            "by_component": [_row(row) for row in profile.by_component],
            "by_fault": [_row(row) for row in profile.by_fault],
            "by_configuration": [{"label": c.label, "kind": c.kind, **_rate(c.rate), "statuses": c.statuses,
                                  "faults": c.faults} for c in profile.by_configuration],
        }
    b = report.behaviour
    data["behaviour"] = {**{key: value for key, value in asdict(b).items() if "recovery" not in key},
                         "recovery": _recovery(b.recovery),
                         "recovery_by_component": {name: _recovery(recovery)
                                                   for name, recovery in b.recovery_by_component.items()}}
    return data
