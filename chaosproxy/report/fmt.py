"""How numbers read in the Markdown and HTML reports."""

from __future__ import annotations

from chaosproxy.report.profile import ProfileRow
from chaosproxy.report.stats import Rate


def percent(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 100:.0f}%"


def rate_text(rate: Rate) -> str:
    """83% (5/6, CI 44–97%)"""
    if not rate.n:
        return "no runs"
    low, high = rate.interval
    return f"{percent(rate.value)} ({rate.successes}/{rate.n}, CI {low * 100:.0f}–{high * 100:.0f}%)"


def drop_text(row: ProfileRow) -> str:
    """The fall in success rate from clean to perturbed, in percentage points, with its interval."""
    interval = row.drop_interval
    if row.drop is None or interval is None:
        return "n/a"
    return f"{row.drop * 100:+.0f} pts (CI {interval[0] * 100:+.0f} to {interval[1] * 100:+.0f})"


def ms_text(value: float | None) -> str:
    if value is None:
        return "n/a"
    return f"{value:.0f} ms" if value < 10_000 else f"{value / 1000:.1f} s"


def share(count: int, total: int) -> str:
    return f"{count}" if not total else f"{count} ({count / total * 100:.0f}%)"
