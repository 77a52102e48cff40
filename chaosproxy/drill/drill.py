"""A drill as a whole: plan it, carry out its runs into its folder, or replay one run.

The drill's folder holds drill.json (the settings and the root seed), results.jsonl (one line per
run) and one folder per run with everything needed to explain and replay it.
"""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from chaosproxy import __version__
from chaosproxy.drill.config import DrillConfig
from chaosproxy.drill.plan import RunSpec, plan_runs
from chaosproxy.drill.runner import RUN_FILE, Progress, Run, execute_all
from chaosproxy.engine import draw_seed

RESULTS_FILE = "results.jsonl"
DRILL_FILE = "drill.json"


def run_drill(config: DrillConfig) -> tuple[Path, list[dict[str, Any]]]:
    """Plan and carry out a drill; returns its folder and the results. Raises ScenarioError on bad input
    and FileExistsError when the folder is already used."""
    seed = config.seed if config.seed is not None else draw_seed()
    specs = plan_runs(config, seed)
    folder = config.out or Path("drills") / datetime.now(UTC).strftime("drill-%Y%m%d-%H%M%S")
    folder.mkdir(parents=True, exist_ok=True)
    if any(folder.iterdir()):
        raise FileExistsError(f"{folder} is not empty; give the drill a new folder with --out")
    started = datetime.now(UTC).isoformat(timespec="seconds")
    settings = {"version": __version__, "seed": seed, "started": started, "runs": len(specs),
                "config": config.model_dump(mode="json")}
    (folder / DRILL_FILE).write_text(json.dumps(settings, indent=2) + "\n", encoding="utf-8")
    runs = [Run(spec, folder / spec.name, config) for spec in specs]
    results = asyncio.run(execute_all(runs, config.jobs, folder / RESULTS_FILE, Progress(len(runs))))
    return folder, [result.record() for result in results]


def replay(run_folder: Path, agent: str | None = None) -> tuple[Path, dict[str, Any], dict[str, Any] | None]:
    """Run one drill run again (same scenario, same seed; another agent if given) in RUN/replay-N.

    Returns the replay's folder, its result and the original run's result.
    """
    recorded = json.loads((run_folder / RUN_FILE).read_text(encoding="utf-8"))
    settings = {key: recorded[key] for key in ("judge", "timeout", "upstream", "stdio")}
    config = DrillConfig.model_validate({**settings, "agent": agent or recorded["agent"]})
    spec = RunSpec(recorded["run"], recorded["label"], recorded["kind"],
                   (run_folder / "scenario.yaml").read_text(encoding="utf-8"), recorded["seed"],
                   recorded.get("scenario_dir"))
    n = 1
    while (run_folder / f"replay-{n}").exists():
        n += 1
    folder = run_folder / f"replay-{n}"
    result = asyncio.run(execute_all([Run(spec, folder, config)], 1, None, Progress(1)))[0]
    return folder, result.record(), recorded["result"]
