"""The report as Markdown: the tables, no charts."""

from __future__ import annotations

from chaosproxy.report.build import Report
from chaosproxy.report.tables import (
    CONFIGURATION_NOTE,
    FAULTS_NOTE,
    PROFILE_NOTE,
    RECOVERY_NOTE,
    Table,
    behaviour_table,
    configuration_table,
    faults_table,
    heading,
    profile_notes,
    profile_table,
    recovery_table,
)


def _table(table: Table) -> list[str]:
    header, rows = table
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *("| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows), ""]


def render_markdown(report: Report) -> str:
    lines = ["# chaosproxy robustness report", "", heading(report), ""]
    lines += [*(f"> warning: {note}" for note in report.notes), ""] if report.notes else []
    if (profile := report.profile) is not None:
        lines += ["## Robustness profile", "", PROFILE_NOTE, ""]
        lines += _table(profile_table([profile.overall, *profile.by_component], "component"))
        lines += ["### By fault type", "", *_table(profile_table(profile.by_fault, "fault"))]
        lines += ["### By scenario", "", CONFIGURATION_NOTE, "", *_table(configuration_table(profile))]
        if notes := profile_notes(profile):
            lines += [notes, ""]
    b = report.behaviour
    lines += ["## Agent behaviour", "", *_table(behaviour_table(b))]
    if b.recovery_by_component:
        lines += ["### Recovery by component of the fault", "", RECOVERY_NOTE, "", *_table(recovery_table(b))]
    if b.faults_by_type:
        lines += ["### Faults fired", "", FAULTS_NOTE, "", *_table(faults_table(b))]
    return "\n".join(lines)
