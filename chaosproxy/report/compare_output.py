"""A comparison of two drills as Markdown (a pull request's comment), HTML (paired bars) and JSON."""

from __future__ import annotations

from datetime import UTC, datetime
from html import escape
from typing import Any

from chaosproxy import __version__
from chaosproxy.report.build import rate_json
from chaosproxy.report.compare import CompareRow, Comparison
from chaosproxy.report.html import STYLE, html_note, html_page, html_table
from chaosproxy.report.svg import CLEAN_COLOUR, COMPONENT_COLOURS, OTHER_COLOUR, comparison_chart
from chaosproxy.report.tables import Table

NOTE = (
    "Success rates of the base and the new drill with 95% Wilson intervals: overall and per component "
    "or fault type, the runs where such a fault fired; per scenario, the runs of the same scenario. "
    "The difference is new minus base in percentage points with Newcombe's 95% interval; "
    '"real" marks a change whose interval leaves out 0.'
)
SECTIONS = (
    ("overall", "Overall"),
    ("component", "By POMDP component"),
    ("fault", "By fault type"),
    ("scenario", "By scenario"),
)


def _heading(comparison: Comparison) -> str:
    generated = datetime.now(UTC).isoformat(timespec="seconds")
    return (
        f"base: {comparison.base_source} · new: {comparison.new_source} · generated {generated} · "
        f"chaosproxy {__version__}"
    )


def _rows_table(rows: list[CompareRow]) -> Table:
    return ["", "name", "base", "new", "difference (new − base)"], [row.cells() for row in rows]


def _unshared(comparison: Comparison) -> list[str]:
    lines = [f"{key}: base {old!r}, new {new!r}" for key, old, new in comparison.settings_differ]
    if comparison.only_base:
        lines.append("only in base (not compared): " + ", ".join(comparison.only_base))
    if comparison.only_new:
        lines.append("only in new (not compared): " + ", ".join(comparison.only_new))
    return lines


def _section_rows(comparison: Comparison, section: str) -> list[CompareRow]:
    if section == "overall":
        return comparison.section("overall") + comparison.section("clean")
    return comparison.section(section)


def render_comparison_markdown(comparison: Comparison) -> str:
    lines = ["# chaosproxy drill comparison", "", _heading(comparison), "", NOTE, ""]
    lines += [f"> warning: {note}" for note in comparison.notes]
    changes = [row for row in comparison.rows if row.verdict]
    lines += [
        "**Real changes:** "
        + (
            "; ".join(
                f"{row.section} {row.name} {row.verdict} ({row.difference_text().split(' real:')[0]})"
                for row in changes
            )
            or "none at this sample size"
        ),
        "",
    ]
    for section, title in SECTIONS:
        if rows := _section_rows(comparison, section):
            header, cells = _rows_table(rows)
            lines += [
                f"## {title}",
                "",
                "| " + " | ".join(header[1:]) + " |",
                "|" + "---|" * (len(header) - 1),
                *("| " + " | ".join(c.replace("|", "\\|") for c in row[1:]) + " |" for row in cells),
                "",
            ]
    if unshared := _unshared(comparison):
        lines += ["## What the drills do not share", "", *(f"- {line}" for line in unshared), ""]
    return "\n".join(lines)


def render_comparison_html(comparison: Comparison) -> str:
    legend = (
        '<p class="legend">'
        + f'<span><i style="background:{CLEAN_COLOUR}"></i>base</span>'
        + "".join(
            f'<span><i style="background:{colour}"></i>new, {escape(name)}</span>'
            for name, colour in {**COMPONENT_COLOURS, "overall, clean and scenarios": OTHER_COLOUR}.items()
        )
        + "<span>▲ ▼ a real change</span></p>"
    )
    body = [
        "<h1>chaosproxy drill comparison</h1>",
        f'<p class="meta">{escape(_heading(comparison))}</p>',
        html_note(NOTE),
        *(html_note(f"warning: {note}") for note in comparison.notes),
        legend,
    ]
    for section, title in SECTIONS:
        if rows := _section_rows(comparison, section):
            body += [
                f'<h2 id="{section}">{escape(title)}</h2>',
                comparison_chart(rows, section),
                html_table(_rows_table(rows)),
            ]
    if unshared := _unshared(comparison):
        body += [
            '<h2 id="unshared">What the drills do not share</h2>',
            "<ul>" + "".join(f"<li>{escape(line)}</li>" for line in unshared) + "</ul>",
        ]
    style = STYLE + ".chart text.better { fill: #2e7d32; } .chart text.worse { fill: #c0392b; }\n"
    return html_page("chaosproxy drill comparison", style, body)


def comparison_json(comparison: Comparison) -> dict[str, Any]:
    def row(r: CompareRow) -> dict[str, Any]:
        interval = r.interval
        return {
            "section": r.section,
            "name": r.name,
            "base": rate_json(r.base),
            "new": rate_json(r.new),
            "difference": r.difference,
            "difference_ci95": [round(interval[0], 4), round(interval[1], 4)] if interval else None,
            "real_change": r.verdict,
        }

    return {
        "chaosproxy": __version__,
        "base": comparison.base_source,
        "new": comparison.new_source,
        "rows": [row(r) for r in comparison.rows],
        "only_in_base": comparison.only_base,
        "only_in_new": comparison.only_new,
        "settings_differ": [{"setting": k, "base": a, "new": b} for k, a, b in comparison.settings_differ],
        "notes": comparison.notes,
    }
