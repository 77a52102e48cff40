"""Gating a pipeline on a drill: minimum perturbed success rates, and the largest regression allowed.

`--fail-under transition=0.8,overall=0.9` checks the success rate of the runs where a fault of that
component (or of that fault type) fired; `overall` is every run where any fault fired. A name no
perturbed run has is a miss too: a gate that cannot be checked does not pass, nor does a gate on a
drill whose results fall short of its plan (a shard not given, runs without a result, lines skipped).
`--max-regression 10` fails a comparison where a row's difference, new minus base, lies wholly below
-10 points.
"""

from __future__ import annotations

import argparse
import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from chaosproxy.report.compare import Comparison
    from chaosproxy.report.profile import Profile

EXIT_GATE = 3
OVERALL = "overall"


def parse_thresholds(text: str) -> dict[str, float]:
    """NAME=RATE[,NAME=RATE...], RATE from 0 to 1 (or a percentage such as 80%)."""
    thresholds: dict[str, float] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, value = item.partition("=")
        try:
            rate = float(value.strip().removesuffix("%")) / (100 if value.strip().endswith("%") else 1)
        except ValueError:
            rate = -1.0
        if not sep or not name.strip() or not 0 <= rate <= 1:
            raise argparse.ArgumentTypeError(
                f"expected NAME=RATE with RATE from 0 to 1 (e.g. transition=0.8,overall=90%), got {item!r}"
            )
        thresholds[name.strip()] = rate
    if not thresholds:
        raise argparse.ArgumentTypeError("expected NAME=RATE[,NAME=RATE...]")
    return thresholds


def parse_points(text: str) -> float:
    """--max-regression's PTS: a finite number of percentage points, 0 or more."""
    try:
        points = float(text)
    except ValueError:
        points = math.nan
    if not math.isfinite(points) or points < 0:
        raise argparse.ArgumentTypeError(f"expected percentage points, a number from 0 up (e.g. 5), got {text!r}")
    return points


def missed_thresholds(profile: Profile, thresholds: dict[str, float]) -> list[str]:
    """One line per threshold the drill's perturbed success rates do not reach."""
    from chaosproxy.report.fmt import (  # here: every command, `run` too, imports this module
        percent,
        rate_text,
    )

    rows = {OVERALL: profile.overall, **{row.name: row for row in [*profile.by_component, *profile.by_fault]}}
    missed = []
    for name, minimum in thresholds.items():
        row = rows.get(name)
        if row is None or row.perturbed.value is None:
            missed.append(
                f"{name}: no run where {'a fault' if name == OVERALL else f'a {name} fault'} fired, "
                f"so the minimum {percent(minimum)} cannot be checked"
            )
        elif row.perturbed.value < minimum:
            missed.append(f"{name}: {rate_text(row.perturbed)} under the minimum {percent(minimum)}")
    return missed


def regressions(comparison: Comparison, points: float) -> list[str]:
    """One line per row whose whole interval for new minus base is below -points."""
    return [
        f"{row.section} {row.name}: {row.difference_text()}, wholly worse than -{points:g} pts"
        for row in comparison.rows
        if row.interval is not None and row.interval[1] * 100 < -points
    ]
