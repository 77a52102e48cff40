"""Inline SVG charts for the HTML report: success-rate bars with intervals, and per-session timelines.

Plain SVG with a <title> on every mark for its tooltip: no script, no fonts or styles from outside.
"""

from __future__ import annotations

from collections.abc import Callable
from html import escape
from typing import TYPE_CHECKING

from chaosproxy.faults import REGISTRY
from chaosproxy.records.logfile import Call, Fault, Session
from chaosproxy.report.fmt import drop_text, ms_text, percent
from chaosproxy.report.profile import ProfileRow
from chaosproxy.report.stats import Rate

if TYPE_CHECKING:
    from chaosproxy.report.compare import CompareRow

COMPONENT_COLOURS = {"observation": "#1f77b4", "action": "#8e44ad", "reward": "#d68910",
                     "transition": "#c0392b"}
CLEAN_COLOUR = "#9aa0a6"
OTHER_COLOUR = "#34495e"
CALL_COLOURS = {"call answered": "#5aa469", "disrupted by a fault": "#c0392b",
                "failed by the upstream": "#8e6fb5", "never completed": "#f39c12"}

Scale = Callable[[float], float]


def component_colour(name: str) -> str:
    """The colour of a component, or of a fault type's component; a neutral one otherwise."""
    fault = REGISTRY.get(name)
    return COMPONENT_COLOURS.get(str(fault.component) if fault is not None else name, OTHER_COLOUR)


def _svg_open(kind: str, name: str, width: int, height: int) -> str:
    return (f'<svg class="chart {kind}" data-chart="{escape(name)}" role="img" width="{width}" '
            f'height="{height}" viewBox="0 0 {width} {height}" xmlns="http://www.w3.org/2000/svg">')


def _text(x: float, y: float, text: str, *, anchor: str = "start", css: str = "") -> str:
    return f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}" class="{css}">{escape(text)}</text>'


def _line(x1: float, y1: float, x2: float, y2: float, css: str) -> str:
    return f'<line class="{css}" x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}"/>'


def profile_chart(rows: list[ProfileRow], name: str) -> str:
    """Per row: the clean and the perturbed success rate as bars, their 95% intervals as whiskers."""
    return _paired_chart("profile", name, f"success rate clean vs perturbed, by {name}", 150, 230, [
        (row.name, (row.clean, CLEAN_COLOUR, "clean"),
         (row.perturbed, component_colour(row.name), "perturbed"), drop_text(row), "note") for row in rows])


# A row of paired bars: its label, each bar's (rate, colour, kind), and the note beside them with its class.
PairedRow = tuple[str, tuple[Rate, str, str], tuple[Rate, str, str], str, str]


def _paired_chart(kind: str, name: str, title: str, label_w: int, note_w: int, rows: list[PairedRow]) -> str:
    plot_w, bar_h, row_h = 420, 12, 40
    height = 28 + row_h * len(rows)

    def x(value: float) -> float:
        return label_w + value * plot_w

    parts = [_svg_open(kind, name, label_w + plot_w + note_w, height), f"<title>{escape(title)}</title>"]
    for tick in (0, 0.25, 0.5, 0.75, 1):
        parts += [_line(x(tick), 18, x(tick), height, "grid"),
                  _text(x(tick), 12, percent(tick), anchor="middle", css="axis")]
    for i, (label, first, second, note, note_css) in enumerate(rows):
        top = 26 + i * row_h
        parts.append(_text(label_w - 8, top + bar_h + 4, label, anchor="end", css="label"))
        parts.append(_bar(first[0], top, bar_h, first[1], first[2], x))
        parts.append(_bar(second[0], top + bar_h + 2, bar_h, second[1], second[2], x))
        parts.append(_text(x(1) + 10, top + bar_h + 4, note, css=note_css))
    parts.append("</svg>")
    return "\n".join(parts)


MIN_BAR_W = 4  # px: a bar at or near 0 % still shows its colour, and says its value past its whisker


def _bar(rate: Rate, y: float, h: float, colour: str, kind: str, x: Scale) -> str:
    if rate.value is None:
        return _text(x(0) + 4, y + h - 2, f"{kind}: no runs", css="note")
    low, high = rate.interval
    tip = f"{kind}: {percent(rate.value)} of {rate.n} runs (95% CI {percent(low)}–{percent(high)})"
    mid = y + h / 2
    width = x(rate.value) - x(0)
    return "".join([
        f'<g class="bar {kind}"><title>{escape(tip)}</title>',
        f'<rect x="{x(0):.1f}" y="{y:.1f}" width="{max(width, MIN_BAR_W):.1f}" height="{h}" fill="{colour}"/>',
        _line(x(low), mid, x(high), mid, "whisker"),
        _line(x(low), y + 2, x(low), y + h - 2, "whisker"),
        _line(x(high), y + 2, x(high), y + h - 2, "whisker"),
        _text(x(high) + 4, y + h - 2, percent(rate.value), css="small") if width < MIN_BAR_W else "",
        "</g>"])


def _call_state(call: Call) -> str:
    if call.incomplete:
        return "never completed"
    if call.disrupted:
        return "disrupted by a fault"
    return "failed by the upstream" if call.failed else "call answered"


def _call_tip(call: Call) -> str:
    status = f" {call.status}" if call.status is not None else ""
    sent = f" (sent on as {call.tool})" if call.tool and call.tool != call.label else ""
    return f"{call.label}{sent}: {call.outcome}{status}, {ms_text(call.duration_ms)}"


def _fault_tip(fault: Fault) -> str:
    effect = ", ".join(f"{key}={value}" for key, value in fault.effect.items())
    return f"{fault.rule}: {fault.fault} ({fault.component}, {fault.phase}) {effect}".rstrip()


def timeline_chart(session: Session) -> str:
    """One lane per tool (or method, or path): each call a bar from start to end, each fault a marker."""
    lanes = list(dict.fromkeys(call.label for call in session.calls))
    stray_lane = len(lanes)
    if session.unattached:
        lanes.append("(faults without a call)")
    label_w, plot_w, lane_h = 170, 700, 22
    start = session.started
    end = max([call.ts for call in session.calls] + [fault.ts for fault in session.unattached] + [start])
    span = max(end - start, 0.001)
    height = 30 + lane_h * len(lanes)

    def x(t: float) -> float:
        return label_w + (t - start) / span * plot_w

    parts = [_svg_open("timeline", "timeline", label_w + plot_w + 20, height),
             f"<title>calls and faults of session {escape(session.session)}</title>"]
    for k in range(5):
        t = start + span * k / 4
        anchor = "end" if k == 4 else "middle"
        parts += [_line(x(t), 16, x(t), height, "grid"),
                  _text(x(t), 12, ms_text((t - start) * 1000), anchor=anchor, css="axis")]
    parts += [_text(label_w - 8, 34 + i * lane_h, lane, anchor="end", css="label")
              for i, lane in enumerate(lanes)]
    for call in session.calls:
        top = 22 + lanes.index(call.label) * lane_h
        width = max(x(call.ts) - x(call.start), 2)
        parts.append(f'<g class="call"><title>{escape(_call_tip(call))}</title>'
                     f'<rect x="{x(call.start):.1f}" y="{top:.1f}" width="{width:.1f}" height="14" '
                     f'fill="{CALL_COLOURS[_call_state(call)]}"/></g>')
        parts += [_marker(fault, x(fault.ts), top) for fault in call.faults]
    parts += [_marker(fault, x(fault.ts), 22 + stray_lane * lane_h) for fault in session.unattached]
    parts.append("</svg>")
    return "\n".join(parts)


def _marker(fault: Fault, cx: float, top: float) -> str:
    return (f'<g class="fault"><title>{escape(_fault_tip(fault))}</title>'
            f'<path d="M{cx:.1f} {top - 1:.1f} l5 -7 h-10 z" '
            f'fill="{component_colour(fault.component)}"/></g>')


def comparison_chart(rows: list[CompareRow], name: str) -> str:
    """Paired bars per row: the base drill's success rate above the new one's, 95% intervals as whiskers,
    and the difference with a mark where it is a real change."""
    marks = {"better": " ▲", "worse": " ▼"}
    return _paired_chart("comparison", name, f"success rate base vs new, by {name}", 170, 300, [
        (row.name, (row.base, CLEAN_COLOUR, "base"), (row.new, component_colour(row.name), "new"),
         row.difference_text().split(" real:")[0] + marks.get(row.verdict or "", ""),
         f"note {row.verdict or 'same'}") for row in rows])
