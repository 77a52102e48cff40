"""What each sample-epoch of a benchmark meets: clean, a scenario file, or a draw from a suite, with its seed.

A plan draws per (sample, epoch) from its root seed alone, as a drill plans from its root seed: the
same plan meets the same faults on a rerun, and two policies run under one plan meet the same faults
sample by sample (a paired comparison). A share of the sample-epochs (`baseline`) runs clean; the
rest take one of the configurations (each scenario file, or the suite) uniformly, a suite sampled
with the sample-epoch's own seed, as `chaosproxy drill --randomize` samples it.
"""

from __future__ import annotations

import fnmatch
import random
import re
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml

from chaosproxy.drill.plan import CLEAN, CLEAN_SCENARIO, derive_seed
from chaosproxy.drill.suite import Suite, load_suite
from chaosproxy.engine.named_files import ScenarioFiles
from chaosproxy.engine.scenario import Scenario, check_seed, load_scenario, parse_scenario
from chaosproxy.faults import fault_class
from chaosproxy.harness.gateway import ModelGateway

Scope = Literal["tools", "model", "both"]
SCOPES: tuple[Scope, ...] = ("tools", "model", "both")
# What Inspect's MCP client sends before a tool can be called: a fault that fails one of these takes the
# server's tools away for the sample-epoch (chaosproxy.harness.tools), not a tool error the model sees.
HANDSHAKE = ("initialize", "notifications/initialized", "tools/list")
_AGENT_NAME = re.compile(r"[A-Za-z0-9._~:@/+=-]{1,128}")  # what X-Chaosproxy-Agent accepts


@dataclass(frozen=True, slots=True)
class Draw:
    """One sample-epoch's configuration: a drill run's label, kind, scenario and seed."""

    kind: str  # clean, scenario or sample (as a drill's runs)
    label: str  # clean, a scenario file's stem, or the suite rules drawn
    seed: int
    scenario_text: str
    scenario_dir: str | None = None  # where files the scenario names lie

    def scenario(self) -> Scenario:
        files = ScenarioFiles.under([Path(self.scenario_dir)]) if self.scenario_dir else None
        return parse_scenario(self.scenario_text, f"<{self.label}>", files)

    def rules(self) -> list[dict[str, Any]]:
        """The scenario's rules as written (to send to a running proxy, which validates them again)."""
        return list((yaml.safe_load(self.scenario_text) or {}).get("rules") or [])


class ChaosPlan:
    """A benchmark's chaos: scenario files and/or a suite, the clean share, the scope and the root seed.

    `scope`: the tool servers (MCP tool sources from chaosproxy.harness), the model API (through
    `gateway(...)`), or both. Each sample-epoch's log and scenario go to a folder of its own under
    `log_dir` (default: a new temporary folder). Raises ScenarioError when a scenario or the suite is
    invalid.
    """

    def __init__(self, scenarios: list[str | Path] | None = None, suite: str | Path | None = None, *,
                 baseline: float = 0.2, scope: Scope = "tools", seed: int = 0,
                 log_dir: str | Path | None = None) -> None:
        if scope not in SCOPES:
            raise ValueError(f"scope must be one of {', '.join(SCOPES)}, got {scope!r}")
        if not 0 <= baseline <= 1:
            raise ValueError(f"baseline is the share of clean sample-epochs, from 0 to 1, got {baseline}")
        self.scenario_paths = [Path(path) for path in scenarios or []]
        self.suite: Suite | None = load_suite(suite) if suite is not None else None
        if not self.scenario_paths and self.suite is None and baseline < 1:
            raise ValueError("give scenarios, a suite, or baseline=1 (every sample-epoch clean)")
        for path in self.scenario_paths:
            load_scenario(path)
        self.baseline = baseline
        self.scope = scope
        self.seed = check_seed(seed)
        self.folder = Path(log_dir) if log_dir is not None else Path(tempfile.mkdtemp(prefix="chaosproxy-inspect-"))
        self.gateways: dict[str, ModelGateway] = {}
        if scope != "model":
            for warning in handshake_warnings(self):
                warnings.warn(warning, stacklevel=2)

    def gateway(self, upstream: str) -> str:
        """The base URL to give the model for `upstream` (the provider's base URL, path kept): one gateway
        per upstream for the plan's life, where each sample-epoch meets its own draw (scope model or both)."""
        if upstream not in self.gateways:
            self.folder.mkdir(parents=True, exist_ok=True)
            self.gateways[upstream] = ModelGateway(upstream, seed=self.seed,
                                                   log_path=self.folder / f"gateway-{len(self.gateways) + 1}.jsonl")
        return self.gateways[upstream].url

    def sample_folder(self, agent: str) -> Path:
        """A new folder for a sample-epoch's scenario and log (a rerun of the eval gets new ones)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=f"{agent}-", dir=self.folder))

    def close(self) -> None:
        """Stop the gateways (they also stop with the process)."""
        for gateway in self.gateways.values():
            gateway.close()
        self.gateways.clear()

    def settings(self) -> dict[str, Any]:
        """What decides the draws, as a drill folder's config records it."""
        return {"scenarios": [str(path) for path in self.scenario_paths],
                "suite": str(self.suite.path) if self.suite else None,
                "baseline": self.baseline, "scope": self.scope}

    def draw(self, sample_id: int | str, epoch: int) -> Draw:
        """The configuration of sample `sample_id` in `epoch`: a function of the root seed and both."""
        seed = derive_seed(self.seed, f"{sample_id}/{epoch}")
        rng = random.Random(seed)
        choices = len(self.scenario_paths) + (self.suite is not None)
        if rng.random() < self.baseline or choices == 0:
            return Draw(CLEAN, CLEAN, seed, CLEAN_SCENARIO)
        pick = rng.randrange(choices)
        if pick < len(self.scenario_paths):
            path = self.scenario_paths[pick]
            return Draw("scenario", path.stem, seed, path.read_text(encoding="utf-8"), str(path.parent.resolve()))
        assert self.suite is not None
        sampled = self.suite.sample(derive_seed(seed, "suite"))
        header = f"# drawn from the suite {self.suite.path} for sample {sample_id}, epoch {epoch}\n"
        return Draw("sample", "+".join(rule["name"] for rule in sampled["rules"]), seed,
                    header + yaml.safe_dump(sampled, sort_keys=False), str(self.suite.path.parent.resolve()))


def agent_name(task: str, sample_id: int | str, epoch: int) -> str:
    """The sample-epoch's name on the wire (X-Chaosproxy-Agent) and in file names."""
    name = f"{task}.{sample_id}.e{epoch}"
    if _AGENT_NAME.fullmatch(name) and "/" not in name:
        return name
    import hashlib

    return f"sample-{hashlib.sha256(name.encode()).hexdigest()[:16]}.e{epoch}"


def _templates(plan: ChaosPlan) -> list[tuple[str, dict[str, Any]]]:
    """(source, rule) for every rule a draw can put in force (suite rules as templates)."""
    rules = [(str(path), rule) for path in plan.scenario_paths
             for rule in (yaml.safe_load(path.read_text(encoding="utf-8")) or {}).get("rules") or []]
    if plan.suite is not None:
        rules += [(str(plan.suite.path), rule) for rule in plan.suite.rules]
    return rules


def handshake_warnings(plan: ChaosPlan) -> list[str]:
    """One line per rule that can fail the MCP handshake: the sample-epoch then runs without that server's
    tools (no tool error the model could react to), which is rarely what a rule on tool calls means."""
    found = []
    for source, rule in _templates(plan):
        fault, match = rule.get("fault") or {}, rule.get("match") or {}
        try:
            kind = fault_class(str(fault.get("type")))
        except KeyError:
            continue
        method = match.get("method")
        hit = [name for name in HANDSHAKE if (kind.methods is None or name in kind.methods)
               and (not isinstance(method, str) or fnmatch.fnmatchcase(name, method))]
        if kind.component == "transition" and hit and match.get("tool") is None:
            found.append(f"{source}: rule {rule.get('name')!r} ({fault.get('type')}) can hit the MCP handshake "
                         f"({', '.join(hit)}): the sample then runs without that server's tools instead of "
                         "showing the model a tool error; add `match: {method: tools/call}` to fault tool calls only")
    return found
