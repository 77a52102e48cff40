"""A report's content: profile, behaviour and timelines from a drill's folder; the latter two from a log."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from chaosproxy import __version__
from chaosproxy.records.drill_folder import Drill, read_drill
from chaosproxy.records.logfile import Session, read_sessions
from chaosproxy.report.behaviour import Behaviour, Recovery, behaviour
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
    notes: list[str] = field(default_factory=list)  # what was skipped or is missing, as warned


def build_report(path: Path) -> Report:
    """From a log file or a drill's folder. Raises ValueError (DrillFolderError) naming what is wrong."""
    if path.is_file():
        sessions = read_sessions(path)
        timelines = [Timeline(f"session {s.session} of run {s.run_id}", None, s) for s in sessions]
        return Report(str(path), _now(), None, None, behaviour(sessions), timelines)
    return drill_report(read_drill(path))


def drill_report(drill: Drill) -> Report:
    """A drill read from its folder, or merged from its shards."""
    timelines = []
    for result in sorted(drill.results, key=lambda r: r["status"] == "passed"):  # stable: in run order
        log = drill.log(result["run"])
        sessions = read_sessions(log) if log.is_file() else []
        title = f"{result['run']} · {result['label']} · {result['status']}"
        title += f" · trace {result['trace_id']}" if result.get("trace_id") else ""
        for session in sessions:
            session.reached_goal = None if result["status"] == "error" else result["status"] == "passed"
        timelines += [Timeline(title + (f" · session {s.session}" if len(sessions) > 1 else ""),
                               result["status"], s) for s in sessions]
    return Report(", ".join(map(str, drill.sources)), _now(), drill.settings or None,
                  build_profile(drill.results), behaviour(timeline.session for timeline in timelines),
                  timelines, list(drill.warnings))


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def rate_json(rate: Rate) -> dict[str, Any]:
    low, high = rate.interval
    return {"successes": rate.successes, "runs": rate.n, "rate": rate.value,
            "ci95": [round(low, 4), round(high, 4)]}


def _row(row: ProfileRow) -> dict[str, Any]:
    interval = row.drop_interval
    return {"name": row.name, "clean": rate_json(row.clean), "perturbed": rate_json(row.perturbed),
            "drop": row.drop,
            "drop_ci95": [round(interval[0], 4), round(interval[1], 4)] if interval else None}


def _recovery(recovery: Recovery) -> dict[str, Any]:
    return asdict(recovery)


def report_json(report: Report) -> dict[str, Any]:
    data: dict[str, Any] = {"source": report.source, "generated": report.generated, "chaosproxy": __version__}
    if report.drill is not None:
        data["drill"] = report.drill
    if report.notes:
        data["notes"] = report.notes
    if (profile := report.profile) is not None:
        data["profile"] = {
            "runs": profile.runs, "errors": profile.errors, "unexposed": profile.unexposed,
            "overall": _row(profile.overall),
            "by_component": [_row(row) for row in profile.by_component],
            "by_fault": [_row(row) for row in profile.by_fault],
            "by_configuration": [{"label": c.label, "kind": c.kind, **rate_json(c.rate),
                                  "statuses": c.statuses,
                                  "faults": c.faults} for c in profile.by_configuration],
        }
    b = report.behaviour
    data["behaviour"] = {**{key: value for key, value in asdict(b).items() if "recovery" not in key},
                         "recovery": _recovery(b.recovery),
                         "recovery_by_component": {name: _recovery(recovery)
                                                   for name, recovery in b.recovery_by_component.items()}}
    return data
