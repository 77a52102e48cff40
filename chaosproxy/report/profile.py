"""The robustness profile of a drill: success clean vs perturbed, by POMDP component, fault type and scenario.

A perturbed run counts for a component (or fault type) when at least one fault of it fired in the
run; a run of a faulty scenario where nothing fired counts as neither clean nor perturbed. Runs the
drill's own machinery failed (status `error`) count for nothing.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Any

from chaosproxy.report.stats import Rate, difference_interval

COMPONENTS = ("observation", "action", "reward", "transition")


@dataclass(frozen=True, slots=True)
class ProfileRow:
    name: str
    clean: Rate
    perturbed: Rate

    @property
    def drop(self) -> float | None:
        if self.clean.value is None or self.perturbed.value is None:
            return None
        return self.clean.value - self.perturbed.value

    @property
    def drop_interval(self) -> tuple[float, float] | None:
        return difference_interval(self.clean, self.perturbed)


@dataclass(frozen=True, slots=True)
class ConfigurationRow:
    """One configuration of the matrix (clean, a scenario file, a sample) and how its runs ended."""

    label: str
    kind: str
    rate: Rate
    statuses: dict[str, int]
    faults: dict[str, int]


@dataclass(frozen=True)
class Profile:
    runs: int
    errors: int
    unexposed: int
    overall: ProfileRow
    by_component: list[ProfileRow]
    by_fault: list[ProfileRow]
    by_configuration: list[ConfigurationRow] = field(default_factory=list)


def _rate(results: list[dict[str, Any]]) -> Rate:
    return Rate(sum(1 for r in results if r["status"] == "passed"), len(results))


def _fault_counts(results: list[dict[str, Any]]) -> dict[str, int]:
    total: collections.Counter[str] = collections.Counter()
    for result in results:
        total.update(result.get("faults", {}))
    return dict(total)


def build_profile(results: list[dict[str, Any]]) -> Profile:
    counted = [r for r in results if r["status"] != "error"]
    clean = [r for r in counted if r["kind"] == "clean"]
    perturbed = [r for r in counted if r["kind"] != "clean" and r.get("faults")]
    clean_rate = _rate(clean)

    def rows(key: str, names: list[str]) -> list[ProfileRow]:
        return [ProfileRow(name, clean_rate, _rate([r for r in perturbed if r.get(key, {}).get(name)]))
                for name in names]

    fault_types = sorted({name for r in perturbed for name in r["faults"]})
    components = [c for c in COMPONENTS if any(r.get("components", {}).get(c) for r in perturbed)]
    by_label: dict[str, list[dict[str, Any]]] = {}
    for result in results:
        by_label.setdefault(result["label"], []).append(result)
    configurations = [
        ConfigurationRow(label, runs[0]["kind"], _rate([r for r in runs if r["status"] != "error"]),
                         dict(collections.Counter(r["status"] for r in runs)),
                         _fault_counts(runs))
        for label, runs in by_label.items()]
    return Profile(
        runs=len(results), errors=len(results) - len(counted),
        unexposed=sum(1 for r in counted if r["kind"] != "clean" and not r.get("faults")),
        overall=ProfileRow("any fault", clean_rate, _rate(perturbed)),
        by_component=rows("components", components), by_fault=rows("faults", fault_types),
        by_configuration=configurations)
