"""The drill matrix: clean baseline runs, each scenario file, each sampled scenario, times repetitions.

Every seed comes from the drill's root seed and a label, so a drill's plan is reproducible from
its root seed alone, and one run from its own folder.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import yaml

from chaosproxy.drill.config import DrillConfig
from chaosproxy.drill.suite import load_suite
from chaosproxy.engine.scenario import load_scenario

CLEAN = "clean"
CLEAN_SCENARIO = "# The clean baseline: no rules, the proxy passes everything through untouched.\nrules: []\n"


@dataclass(frozen=True, slots=True)
class RunSpec:
    """One run to carry out: which scenario (its text, as written to the run folder) and which seed."""

    name: str  # run-17: the run's folder
    label: str  # the configuration it repeats: clean, a scenario file's stem, sample-3
    kind: str  # clean, scenario or sample
    scenario_text: str
    seed: int
    scenario_dir: str | None = None  # where the scenario came from: files it names are found there


def injected_faults(scenario_text: str) -> list[str]:
    """The fault types a scenario's enabled rules inject, in rule order, each once (to name a sample)."""
    try:
        data = yaml.safe_load(scenario_text)
    except yaml.YAMLError:
        return []
    rules = data.get("rules") if isinstance(data, dict) else None
    types = [rule["fault"].get("type") for rule in rules or []
             if isinstance(rule, dict) and rule.get("enabled", True) and isinstance(rule.get("fault"), dict)]
    return list(dict.fromkeys(str(name) for name in types if name is not None))


def derive_seed(root: int, label: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{root}:{label}".encode()).digest()[:4], "big")


def plan_runs(config: DrillConfig, root_seed: int) -> list[RunSpec]:
    """The runs of a drill, in order. Raises ScenarioError when a scenario or the suite is invalid."""
    configurations: list[tuple[str, str, str, int, str | None]] = [
        (CLEAN, CLEAN, CLEAN_SCENARIO, config.baseline_runs, None)]
    stems = [path.stem for path in config.scenarios]
    for path, stem in zip(config.scenarios, stems, strict=True):
        load_scenario(path)
        label = stem if stems.count(stem) == 1 and stem != CLEAN else str(path)
        configurations.append((label, "scenario", Path(path).read_text(encoding="utf-8"), config.repeat,
                               str(Path(path).parent.resolve())))
    if config.suite is not None:
        suite = load_suite(config.suite)
        for k in range(1, config.randomize + 1):
            seed = derive_seed(root_seed, f"sample-{k}")
            header = f"# sample {k} of the suite {config.suite}, drawn with seed {seed}\n"
            text = header + yaml.safe_dump(suite.sample(seed), sort_keys=False)
            configurations.append((f"sample-{k}", "sample", text, config.repeat, str(config.suite.parent.resolve())))
    runs: list[RunSpec] = []
    for label, kind, text, count, folder in configurations:
        for _ in range(count):
            name = f"run-{len(runs) + 1}"
            runs.append(RunSpec(name, label, kind, text, derive_seed(root_seed, name), folder))
    return runs


@dataclass(frozen=True, slots=True)
class Shard:
    """Shard `index` of `count` (index from 0, as Kubernetes' JOB_COMPLETION_INDEX): every count-th run of
    the plan from run index+1 on, so each shard gets its share of clean runs and of every scenario."""

    index: int
    count: int

    @classmethod
    def parse(cls, text: str) -> Shard:
        index, sep, count = text.partition("/")
        if not sep or not index.strip().isdigit() or not count.strip().isdigit():
            raise ValueError(f"expected I/N (e.g. 0/3, I from 0 to N-1), got {text!r}")
        shard = cls(int(index), int(count))
        if not 0 <= shard.index < shard.count:
            raise ValueError(f"shard {text}: I must be from 0 to N-1 (e.g. 0/3, 1/3, 2/3)")
        return shard

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    def of(self, position: int) -> bool:
        """Whether the run at `position` (from 0) in the plan is this shard's."""
        return position % self.count == self.index

    def select(self, runs: list[RunSpec]) -> list[RunSpec]:
        return [run for position, run in enumerate(runs) if self.of(position)]
