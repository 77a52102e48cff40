"""A drill as a whole: plan it, carry out its runs into its folder, or replay one run.

The drill's folder holds drill.json (the settings, the root seed, the shard), results.jsonl (one line
per run) and one folder per run with everything needed to explain and replay it.
"""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from chaosproxy import __version__
from chaosproxy.drill.config import DrillConfig
from chaosproxy.drill.plan import RunSpec, Shard, plan_runs
from chaosproxy.drill.runner import RUN_FILE, Progress, Run, execute_all
from chaosproxy.engine.core import draw_seed
from chaosproxy.records.drill_folder import DRILL_FILE, RESULTS_FILE
from chaosproxy.telemetry.redact import was_redacted
from chaosproxy.telemetry.tracing import exporting


def plan(config: DrillConfig, shard: Shard | None = None) -> tuple[int, list[RunSpec], list[RunSpec]]:
    """The root seed, the whole plan and the runs to carry out (a shard's, or all). Raises ScenarioError
    on bad input, ValueError for a shard without a root seed (each shard would draw its own plan)."""
    if shard is not None and config.seed is None:
        raise ValueError("a sharded drill needs --seed: every shard must draw the same plan")
    seed = config.seed if config.seed is not None else draw_seed()
    specs = plan_runs(config, seed)
    return seed, specs, shard.select(specs) if shard is not None else specs


def run_drill(config: DrillConfig, shard: Shard | None = None) -> tuple[Path, list[dict[str, Any]]]:
    """Plan and carry out a drill (or one shard of it); returns its folder and the results. Raises
    ScenarioError or ValueError on bad input and FileExistsError when the folder is already used."""
    seed, specs, chosen = plan(config, shard)
    folder = config.out or Path("drills") / datetime.now(UTC).strftime("drill-%Y%m%d-%H%M%S")
    folder.mkdir(parents=True, exist_ok=True)
    if any(folder.iterdir()):
        raise FileExistsError(f"{folder} is not empty; give the drill a new folder with --out")
    started = datetime.now(UTC).isoformat(timespec="seconds")
    settings: dict[str, Any] = {"version": __version__, "seed": seed, "started": started, "runs": len(specs),
                                "config": config.recorded()}
    if shard is not None:
        settings["shard"] = {"index": shard.index, "count": shard.count, "runs": len(chosen)}
    (folder / DRILL_FILE).write_text(json.dumps(settings, indent=2) + "\n", encoding="utf-8")
    (folder / RESULTS_FILE).touch()  # a shard may have no run, and is still a drill's folder
    progress = Progress(len(chosen))
    if config.executor == "ray":
        from chaosproxy.drill.ray_executor import execute_on_ray

        runs = [Run(spec, folder / spec.name, config) for spec in chosen]
        results = execute_on_ray(runs, config, folder / RESULTS_FILE, progress, seed)
    else:
        with exporting(run_id=folder.name, seed=seed) as tracing:  # a root span per run when OTEL_* asks
            runs = [Run(spec, folder / spec.name, config, tracing) for spec in chosen]
            results = asyncio.run(execute_all(runs, config.jobs, folder / RESULTS_FILE, progress))
    return folder, [result.record() for result in results]


def replay(run_folder: Path, agent: str | None = None,
           upstream: str | None = None) -> tuple[Path, dict[str, Any], dict[str, Any] | None]:
    """Run one drill run again (same scenario, same seed; another agent, or upstream, if given) in
    RUN/replay-N. An upstream whose secrets the run file left out must be given again. Raises ValueError
    when it is not.

    Returns the replay's folder, its result and the original run's result.
    """
    recorded = json.loads((run_folder / RUN_FILE).read_text(encoding="utf-8"))
    settings = {key: recorded.get(key) for key in ("judge", "timeout", "upstream", "stdio", "replay_cassette")}
    if upstream is not None:
        settings["upstream"] = upstream
    elif isinstance(settings["upstream"], str) and was_redacted(settings["upstream"]):
        raise ValueError(f"{run_folder / RUN_FILE}: the run's upstream {settings['upstream']} had credentials or a "
                         "signature, which a drill's folder does not keep: give it again with --upstream")
    config = DrillConfig.model_validate({**settings, "agent": agent or recorded["agent"]})
    spec = RunSpec(recorded["run"], recorded["label"], recorded["kind"],
                   (run_folder / "scenario.yaml").read_text(encoding="utf-8"), recorded["seed"],
                   recorded.get("scenario_dir"))
    n = 1
    while (run_folder / f"replay-{n}").exists():
        n += 1
    folder = run_folder / f"replay-{n}"
    with exporting(run_id=run_folder.parent.name, seed=spec.seed) as tracing:  # its root span, as in the drill
        result = asyncio.run(execute_all([Run(spec, folder, config, tracing)], 1, None, Progress(1)))[0]
    return folder, result.record(), recorded["result"]
