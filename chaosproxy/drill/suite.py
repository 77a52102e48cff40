"""Drill suites: rule templates whose values may be distributions, sampled into concrete scenarios.

A suite is a scenario whose values may be YAML-tagged distributions, plus how many rules a sample
takes:

    description: Transient errors a retrying agent should ride out.
    pick: 1                               # rules per sampled scenario (default 1)
    rules:
      - name: server-error
        probability: !range [0.3, 0.8]    # uniform float in [0.3, 0.8]
        first: !range [1, 3]              # both bounds integers: an integer in 1..3
        fault: {type: http_error, status: !choice [500, 502, 503]}

`!range [low, high]` draws uniformly (integers when both bounds are integers, bounds included);
`!choice [a, b, ...]` takes one option, which may itself hold distributions. Only a tag makes a
distribution, so a header named `range` or a key named `choice` keeps its plain meaning.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from chaosproxy.engine.named_files import ScenarioFiles
from chaosproxy.engine.scenario import (
    Rule,
    Scenario,
    ScenarioError,
    compose,
    locate,  # the scenario's own FILE:LINE logic, tags skipped
    read_text,
)
from chaosproxy.engine.yaml_limits import BoundedLoader


@dataclass(frozen=True, slots=True)
class Range:
    low: int | float
    high: int | float

    def draw(self, rng: random.Random) -> int | float:
        if isinstance(self.low, int) and isinstance(self.high, int):
            return rng.randint(self.low, self.high)
        return rng.uniform(self.low, self.high)


@dataclass(frozen=True, slots=True)
class Choice:
    options: tuple[Any, ...]


class _SuiteLoader(BoundedLoader):
    """SafeLoader that also knows `!range` and `!choice`; problems are collected with their line."""

    problems: list[str]
    source: str


def _construct_range(loader: _SuiteLoader, node: yaml.Node) -> Range:
    bounds = loader.construct_sequence(node) if isinstance(node, yaml.SequenceNode) else None
    numbers = bounds is not None and len(bounds) == 2 and all(
        isinstance(b, int | float) and not isinstance(b, bool) for b in bounds)
    if not numbers or bounds[0] > bounds[1]:  # type: ignore[index]
        loader.problems.append(f"{loader.source}:{node.start_mark.line + 1}: !range takes [low, high], "
                               "two numbers with low <= high")
        return Range(0, 0)
    return Range(bounds[0], bounds[1])  # type: ignore[index]


def _construct_choice(loader: _SuiteLoader, node: yaml.Node) -> Choice:
    options = loader.construct_sequence(node, deep=True) if isinstance(node, yaml.SequenceNode) else []
    if not options:
        loader.problems.append(f"{loader.source}:{node.start_mark.line + 1}: !choice takes a non-empty list")
        return Choice((None,))
    return Choice(tuple(options))


_SuiteLoader.add_constructor("!range", _construct_range)
_SuiteLoader.add_constructor("!choice", _construct_choice)


def draw(value: Any, rng: random.Random) -> Any:
    """`value` with every distribution in it replaced by a draw, depth first, in document order."""
    match value:
        case Range():
            return value.draw(rng)
        case Choice(options):
            return draw(rng.choice(options), rng)
        case dict():
            return {key: draw(item, rng) for key, item in value.items()}
        case list():
            return [draw(item, rng) for item in value]
    return value


def _corners(value: Any) -> Iterator[Any]:
    """Concrete values that between them use every bound and every option of every distribution once."""
    match value:
        case Range(low, high):
            yield from (low, high)
        case Choice(options):
            for option in options:
                yield from _corners(option)
        case dict() | list():
            keys = list(value) if isinstance(value, dict) else list(range(len(value)))
            alternatives = {key: list(_corners(value[key])) for key in keys}
            base = {key: values[0] for key, values in alternatives.items()}
            yield base if isinstance(value, dict) else list(base.values())
            for key, values in alternatives.items():
                for option in values[1:]:
                    variant = {**base, key: option}
                    yield variant if isinstance(value, dict) else list(variant.values())
        case _:
            yield value


@dataclass(frozen=True)
class Suite:
    path: Path
    description: str | None
    pick: int
    rules: list[dict[str, Any]]

    def sample(self, seed: int) -> dict[str, Any]:
        """A concrete scenario: `pick` of the rules (in suite order), every distribution drawn from `seed`."""
        rng = random.Random(seed)
        chosen = sorted(rng.sample(range(len(self.rules)), self.pick))
        rules = [draw(self.rules[i], rng) for i in chosen]
        scenario = {"description": f"sampled from {self.path} with seed {seed}: "
                                   + ", ".join(rule["name"] for rule in rules),
                    "rules": rules}
        # load checked each bound and option, not every combination of them
        Scenario.model_validate(scenario, context={"files": ScenarioFiles.beside(self.path)})
        return scenario


def load_suite(path: str | Path) -> Suite:
    """Read and check a suite: every bound and option of every template must make a valid rule."""
    path = Path(path)
    loader = _SuiteLoader(read_text(path))
    loader.problems, loader.source = [], str(path)
    root, data = compose(loader, str(path))
    if loader.problems:
        raise ScenarioError(loader.problems)
    if not isinstance(data, dict) or not isinstance(data.get("rules"), list) or not data["rules"]:
        raise ScenarioError([f"{path}:1: a suite is a mapping with a non-empty 'rules' list"])
    if unknown := set(data) - {"description", "pick", "rules"}:
        raise ScenarioError([(f"{path}:1: unknown suite keys: {', '.join(sorted(map(str, unknown)))} "
                             "(a suite has description, pick and rules)")])
    rules: list[Any] = data["rules"]
    pick = data.get("pick", 1)
    if not isinstance(pick, int) or isinstance(pick, bool) or not 1 <= pick <= len(rules):
        raise ScenarioError([f"{path}:1: pick must be from 1 to {len(rules)}, the number of rules"])
    assert isinstance(root, yaml.MappingNode)
    rules_node = next(value for key, value in root.value if key.value == "rules")
    files = ScenarioFiles.beside(path)  # a relative mapping: is the suite's folder's, not the working directory's
    problems = [problem for i, (rule, node) in enumerate(zip(rules, rules_node.value, strict=True))
                for problem in _check_template(rule, node, i, str(path), files)]
    names = [rule["name"] for rule in rules if isinstance(rule, dict) and isinstance(rule.get("name"), str)]
    problems += [f"{path}:1: two rules are named {name!r}" for name in sorted({n for n in names
                                                                              if names.count(n) > 1})]
    if problems:
        raise ScenarioError(problems)
    return Suite(path, data.get("description"), pick, rules)


def _check_template(template: Any, node: yaml.Node, index: int, source: str, files: ScenarioFiles) -> list[str]:
    """Problems as SUITE:LINE: rules[i] (name): path: reason, the line that of the value at fault."""
    if not isinstance(template, dict) or not isinstance(template.get("name"), str):
        where = f"{source}:{node.start_mark.line + 1}: rules[{index}]"
        return [f"{where}: a rule template is a mapping with a plain string name"]
    problems: dict[str, None] = {}  # ordered and deduplicated: many corners share one mistake
    for corner in _corners(template):
        try:
            Rule.model_validate(corner, context={"files": files})
        except ValidationError as exc:
            for error in exc.errors():
                line, where = locate(node, error["loc"])
                problems[f"{source}:{line}: rules[{index}] ({template['name']}): {where}: "
                         f"{error['msg'].removeprefix('Value error, ')}"] = None
    return list(problems)
