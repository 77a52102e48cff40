"""Two drills side by side: did the change help, and where? (`chaosproxy report BASE_DIR NEW_DIR`)

Every row compares the success rate of the base drill's runs with the new drill's: overall (runs where
any fault fired), clean baselines, per POMDP component and fault type (runs where a fault of it fired)
and per scenario (runs of the very same rules, so sampled scenarios pair up when both drills drew them
from one suite with one root seed; samples that drew the same rules are one scenario, named by all
their labels, with all their runs). The difference, new minus base, comes with Newcombe's
95% interval; when the interval leaves out 0 the change is real at this sample size. Drills with other
suites or seeds are compared on the rows they share, and the comparison lists the rest.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

import yaml

from chaosproxy.records.drill_folder import Drill
from chaosproxy.report.fmt import rate_text
from chaosproxy.report.profile import COMPONENTS, Profile, build_profile
from chaosproxy.report.stats import Rate, difference_interval
from chaosproxy.telemetry.redact import redacted_url

# Settings whose difference changes what the two drills measure (the agent's is the point of comparing).
COMPARED_SETTINGS = (
    "agent",
    "judge",
    "upstream",
    "stdio",
    "scenarios",
    "suite",
    "randomize",
    "repeat",
    "baseline",
    "timeout",
)


@dataclass(frozen=True, slots=True)
class CompareRow:
    section: str  # overall, clean, component, fault or scenario
    name: str
    base: Rate
    new: Rate

    @property
    def difference(self) -> float | None:
        if self.base.value is None or self.new.value is None:
            return None
        return self.new.value - self.base.value

    @property
    def interval(self) -> tuple[float, float] | None:
        return difference_interval(self.new, self.base)

    @property
    def verdict(self) -> str | None:
        """better or worse when the interval leaves out 0 (a real change), else None."""
        interval = self.interval
        if interval is None or interval[0] <= 0 <= interval[1]:
            return None
        return "better" if interval[0] > 0 else "worse"

    def difference_text(self) -> str:
        interval = self.interval
        if self.difference is None or interval is None:
            return "n/a"
        return (
            f"{self.difference * 100:+.0f} pts (CI {interval[0] * 100:+.0f} to {interval[1] * 100:+.0f})"
            + (f" real: {self.verdict}" if self.verdict else "")
        )

    def cells(self) -> list[str]:
        return [self.section, self.name, rate_text(self.base), rate_text(self.new), self.difference_text()]


@dataclass
class Comparison:
    base_source: str
    new_source: str
    base_settings: dict[str, Any]
    new_settings: dict[str, Any]
    rows: list[CompareRow]
    only_base: list[str] = field(default_factory=list)  # rows the new drill has no runs for
    only_new: list[str] = field(default_factory=list)
    settings_differ: list[tuple[str, Any, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def section(self, name: str) -> list[CompareRow]:
        return [row for row in self.rows if row.section == name]


def _what_it_does(text: str) -> str:
    """A scenario's rules (and routes), canonical: comments and descriptions, which name the suite file
    as it was given, say nothing about what the runs met."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    if not isinstance(data, dict):
        return text
    return json.dumps({key: value for key, value in data.items() if key != "description"}, sort_keys=True)


@dataclass(slots=True)
class _Scenario:
    """The runs of one scenario's rules in a drill, under every label that drew them."""

    labels: list[str]
    passed: int = 0
    counted: int = 0  # runs that count (not `error`)

    @property
    def name(self) -> str:
        return ", ".join(self.labels)


def _scenario_rates(drill: Drill) -> tuple[dict[str, _Scenario], list[str]]:
    """What a scenario does -> its runs, for every configuration of the drill; and the configurations
    whose scenario.yaml cannot be read (their runs cannot be paired by content)."""
    runs_by_label: dict[str, list[dict[str, Any]]] = {}
    for result in drill.results:
        runs_by_label.setdefault(str(result["label"]), []).append(result)
    scenarios: dict[str, _Scenario] = {}
    unread: list[str] = []
    for label, runs in runs_by_label.items():
        scenario = drill.run_folders[str(runs[0]["run"])] / "scenario.yaml"
        try:
            text = scenario.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            unread.append(f"scenario {label} ({len(runs)} run{'s' * (len(runs) != 1)}; "
                          "its scenario.yaml cannot be read)")
            continue
        counted = [r for r in runs if r["status"] != "error"]
        entry = scenarios.setdefault(_what_it_does(text), _Scenario([]))
        entry.labels.append(label)
        entry.passed += sum(r["status"] == "passed" for r in counted)
        entry.counted += len(counted)
    return scenarios, unread


def compare(base: Drill, new: Drill) -> Comparison:
    old_profile, new_profile = build_profile(base.results), build_profile(new.results)
    comparison = Comparison(
        ", ".join(map(str, base.sources)),
        ", ".join(map(str, new.sources)),
        base.settings,
        new.settings,
        [
            CompareRow("overall", "any fault", old_profile.overall.perturbed, new_profile.overall.perturbed),
            CompareRow("clean", "no fault", old_profile.overall.clean, new_profile.overall.clean),
        ],
        notes=[*base.warnings, *new.warnings],
    )
    _pair(
        comparison,
        "component",
        _rows(old_profile, "component"),
        _rows(new_profile, "component"),
        order=list(COMPONENTS),
    )
    _pair(comparison, "fault", _rows(old_profile, "fault"), _rows(new_profile, "fault"))
    (old_scenarios, old_unread), (new_scenarios, new_unread) = _scenario_rates(base), _scenario_rates(new)
    shared = sorted(
        old_scenarios.keys() & new_scenarios.keys(), key=lambda t: _label_order(old_scenarios[t].labels[0])
    )
    for text in shared:
        old, now = old_scenarios[text], new_scenarios[text]
        name = old.name if old.name == now.name else f"{old.name} (new: {now.name})"
        comparison.rows.append(
            CompareRow("scenario", name, Rate(old.passed, old.counted), Rate(now.passed, now.counted))
        )
    comparison.only_base += [
        f"scenario {entry.name}" for text, entry in old_scenarios.items() if text not in new_scenarios
    ] + old_unread
    comparison.only_new += [
        f"scenario {entry.name}" for text, entry in new_scenarios.items() if text not in old_scenarios
    ] + new_unread
    old_config, new_config = base.settings.get("config") or {}, new.settings.get("config") or {}
    comparison.settings_differ = [
        (key, _shown(old_config.get(key)), _shown(new_config.get(key)))
        for key in COMPARED_SETTINGS
        if _setting(key, old_config.get(key)) != _setting(key, new_config.get(key))
    ]
    if base.settings.get("seed") != new.settings.get("seed"):
        comparison.settings_differ.insert(0, ("seed", base.settings.get("seed"), new.settings.get("seed")))
    return comparison


def _shown(value: Any) -> Any:
    """A setting as a comparison shows it: a URL in it without secrets (a folder written before drills
    redacted their upstream may still hold its credentials)."""
    return redacted_url(value) if isinstance(value, str) else value


def _setting(key: str, value: Any) -> Any:
    """A setting as compared: file paths normalised (a drill file's paths are relative to its folder)."""
    if key == "suite" and isinstance(value, str):
        return os.path.normpath(value)
    if key == "scenarios" and isinstance(value, list):
        return [os.path.normpath(path) for path in value]
    return value


def _label_order(label: str) -> tuple[int, str]:
    """clean first, then sample-N in number order, then scenario files by name."""
    head, _, number = label.rpartition("-")
    if label == "clean":
        return -1, ""
    return (int(number), "") if head == "sample" and number.isdigit() else (10**9, label)


def _rows(profile: Profile, section: str) -> dict[str, Rate]:
    rows = profile.by_component if section == "component" else profile.by_fault
    return {row.name: row.perturbed for row in rows}


def _pair(
    comparison: Comparison,
    section: str,
    old: dict[str, Rate],
    new: dict[str, Rate],
    order: list[str] | None = None,
) -> None:
    names = order if order is not None else sorted(old.keys() | new.keys())
    for name in names:
        if name in old and name in new:
            comparison.rows.append(CompareRow(section, name, old[name], new[name]))
        elif name in old:
            comparison.only_base.append(f"{section} {name}")
        elif name in new:
            comparison.only_new.append(f"{section} {name}")
