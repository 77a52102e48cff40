"""The report as one self-contained HTML file: inline CSS and SVG, no script, nothing fetched."""

from __future__ import annotations

from html import escape

from chaosproxy.report.behaviour import Behaviour
from chaosproxy.report.build import Report, Timeline
from chaosproxy.report.profile import Profile
from chaosproxy.report.svg import (
    CALL_COLOURS,
    CLEAN_COLOUR,
    COMPONENT_COLOURS,
    OTHER_COLOUR,
    profile_chart,
    timeline_chart,
)
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

STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; color: #1d2327; margin: 2em auto; max-width: 1000px;
       padding: 0 1em; }
h1 { font-size: 1.6em; margin-bottom: .2em; } h2 { margin-top: 2em; border-bottom: 1px solid #ddd; }
.meta, .note { color: #5f6368; }
table { border-collapse: collapse; margin: .8em 0; }
td, th { padding: .25em .8em; border-bottom: 1px solid #eee; } th { text-align: left; background: #f6f7f8; }
.chart { display: block; margin: .6em 0; max-width: 100%; height: auto; }
.chart text { font: 12px system-ui, sans-serif; fill: #1d2327; }
.chart text.axis, .chart text.note { fill: #5f6368; } .chart text.small { font-size: 10px; }
.chart .grid { stroke: #e3e5e8; } .chart .whisker { stroke: #1d2327; stroke-width: 1.2; }
.legend span { display: inline-block; margin-right: 1.2em; }
.legend i { display: inline-block; width: .9em; height: .9em; margin-right: .3em; vertical-align: -.1em; }
details { margin: .4em 0; } summary { cursor: pointer; } .status-passed { color: #2e7d32; }
.status-failed, .status-timeout, .status-error { color: #c0392b; }
"""
MAX_TIMELINES = 40  # sessions drawn; the rest are counted
OPEN_TIMELINES = 3  # drawn open; the others are one click away


def html_table(table: Table) -> str:
    header, rows = table
    head = "".join(f"<th>{escape(cell)}</th>" for cell in header)
    body = "".join("<tr>" + "".join(f"<td>{escape(cell)}</td>" for cell in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _legend(swatches: dict[str, str], extra: str = "") -> str:
    return '<p class="legend">' + "".join(
        f'<span><i style="background:{colour}"></i>{escape(name)}</span>' for name, colour in swatches.items()
    ) + (f"<span>{escape(extra)}</span>" if extra else "") + "</p>"


def html_note(text: str) -> str:
    return f'<p class="note">{escape(text)}</p>'


def _profile(profile: Profile) -> str:
    rows = [profile.overall, *profile.by_component]
    parts = ['<h2 id="profile">Robustness profile</h2>', html_note(PROFILE_NOTE),
             _legend({"clean": CLEAN_COLOUR, **COMPONENT_COLOURS, "overall": OTHER_COLOUR}),
             "<h3>By POMDP component</h3>", profile_chart(rows, "component"),
             html_table(profile_table(rows, "component"))]
    if profile.by_fault:
        parts += ["<h3>By fault type</h3>", profile_chart(profile.by_fault, "fault"),
                  html_table(profile_table(profile.by_fault, "fault"))]
    parts += ["<h3>By scenario</h3>", html_note(CONFIGURATION_NOTE), html_table(configuration_table(profile))]
    if notes := profile_notes(profile):
        parts.append(html_note(notes))
    return "\n".join(parts)


def _behaviour(b: Behaviour) -> str:
    parts = ['<h2 id="behaviour">Agent behaviour</h2>', html_table(behaviour_table(b))]
    if b.recovery_by_component:
        parts += ["<h3>Recovery by component of the fault</h3>", html_note(RECOVERY_NOTE),
                  html_table(recovery_table(b))]
    if b.faults_by_type:
        parts += ["<h3>Faults fired</h3>", html_note(FAULTS_NOTE), html_table(faults_table(b))]
    return "\n".join(parts)


def _timelines(timelines: list[Timeline]) -> str:
    parts = ['<h2 id="timelines">Timelines</h2>',
             _legend(CALL_COLOURS, "▼ a fault, coloured by its component; hover over a mark for details")]
    for i, timeline in enumerate(timelines[:MAX_TIMELINES]):
        session = timeline.session
        status = f' class="status-{escape(timeline.status)}"' if timeline.status else ""
        parts.append(f"<details{' open' if i < OPEN_TIMELINES else ''}><summary{status}>"
                     f"{escape(timeline.title)}: {len(session.calls)} call(s), {len(session.faults)} fault(s)"
                     f"</summary>{timeline_chart(session)}</details>")
    if (omitted := len(timelines) - MAX_TIMELINES) > 0:
        parts.append(html_note(f"{omitted} more session(s) not drawn; their logs are in the run folders."))
    return "\n".join(parts)


def render_html(report: Report) -> str:
    body = [f'<h1>chaosproxy robustness report</h1><p class="meta">{escape(heading(report))}</p>',
            *(html_note(f"warning: {note}") for note in report.notes)]
    if report.profile is not None:
        body.append(_profile(report.profile))
    body.append(_behaviour(report.behaviour))
    body.append(_timelines(report.timelines))
    return html_page("chaosproxy robustness report", STYLE, body)


def html_page(title: str, style: str, body: list[str]) -> str:
    """One self-contained page: the style inline, nothing fetched."""
    return ('<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{escape(title)}</title><style>{style}</style></head><body>\n"
            + "\n".join(body) + "\n</body></html>\n")
