"""Reading drill folders back: one drill, a drill still running, or the shards of one drill merged.

A drill's folder holds drill.json (written first: the settings, the root seed, the shard if any),
results.jsonl (a line per run, appended as runs finish) and a folder per run. A drill stopped while
writing leaves a cut last line in results.jsonl: it is skipped with a warning, never a traceback, as
is any line that is not a whole run's result (FILE:LINE and why). A drill.json that is not a drill's
settings is refused, naming the file and the key.
Shards of one plan (`--shard I/N`, same settings and root seed) merge into the drill they split.

What a drill's results fall short of its plan by (runs without a result, lines skipped, shards not
given) is its `gaps`: a report shows them as warnings, and a gate on such a drill cannot pass.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaosproxy.errors import ConfigError

RESULTS_FILE = "results.jsonl"
DRILL_FILE = "drill.json"
STATUSES = ("passed", "failed", "timeout", "error")
QUOTED = 40  # characters of a value quoted in a warning (what a results line holds is not trusted)
# Settings that change where and how fast a drill runs, not what it runs or what it finds.
EXECUTION_SETTINGS = frozenset({"out", "jobs", "executor", "ray_address", "ray_num_cpus", "workdir"})


class DrillFolderError(ConfigError):
    """A folder that cannot be read as a drill; the message names the folder or file and says why."""


@dataclass
class Drill:
    """A drill's settings and results as read from one folder or merged from its shards."""

    sources: list[Path]
    settings: dict[str, Any]  # drill.json ({} when missing); `runs` is the plan's size
    results: list[dict[str, Any]]  # in run order
    run_folders: dict[str, Path]  # run name -> its folder
    warnings: list[str] = field(default_factory=list)
    gaps: list[str] = field(default_factory=list)  # why its results are not its whole plan (also warned)

    @property
    def plan_settings(self) -> dict[str, Any]:
        """What decides the runs: the settings but for where and how fast they ran."""
        config = self.settings.get("config") or {}
        return {key: value for key, value in config.items() if key not in EXECUTION_SETTINGS}

    def log(self, run: str) -> Path:
        return self.run_folders[run] / "log.jsonl"


def is_drill_folder(path: Path) -> bool:
    return path.is_dir() and ((path / DRILL_FILE).is_file() or (path / RESULTS_FILE).is_file())


def _run_number(result: dict[str, Any]) -> int:
    return int(str(result["run"]).rpartition("-")[2])


def _quoted(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= QUOTED else text[:QUOTED] + "..."


def _counts(value: Any) -> bool:
    return isinstance(value, dict) and all(
        isinstance(name, str) and type(count) is int and count >= 0 for name, count in value.items())


def result_problem(result: Any) -> str | None:
    """Why a results line is not a run's result, or None when it is one (what the reports read of it)."""
    if not isinstance(result, dict):
        return "not a run's result (a JSON object)"
    run = result.get("run")
    head, _, number = run.rpartition("-") if isinstance(run, str) else ("", "", "")
    if head != "run" or not number.isdigit():
        return f"run: expected run-N, got {_quoted(run)}"
    for key in ("label", "kind"):
        if not isinstance(result.get(key), str):
            return f"{key}: not a string" if key in result else f"no {key}"
    if "status" not in result:
        return "no status"
    if result["status"] not in STATUSES:
        return f"status: {_quoted(result['status'])} is not one of {', '.join(STATUSES)}"
    for key in ("faults", "components"):
        if key in result and not isinstance(result[key], dict):
            return f"{key}: not an object"
        if not _counts(result.get(key, {})):
            return f"{key}: not counts by name (name: whole number)"
    return None


def read_results(path: Path) -> tuple[list[dict[str, Any]], list[str]]:
    """results.jsonl's runs in run order, and a warning per line skipped: one cut short (the last, as a
    drill stopped while writing leaves it) or one that is not a run's result (FILE:LINE: why)."""
    results: list[dict[str, Any]] = []
    warnings: list[str] = []
    try:
        lines = path.read_bytes().splitlines()
    except OSError as exc:
        raise DrillFolderError(f"{path}: cannot read: {exc.strerror or exc}") from None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            result = json.loads(line)
        except ValueError:
            last = number == len(lines)
            why = "cut short (the drill was stopped while writing it?)" if last else "not JSON"
            warnings.append(f"{path}:{number}: skipped a line {why}")
            continue
        if (problem := result_problem(result)) is not None:
            warnings.append(f"{path}:{number}: skipped a line that is not a run's result: {problem}")
            continue
        results.append(result)
    return sorted(results, key=_run_number), warnings


def _whole_number(value: Any) -> bool:
    return type(value) is int and value >= 0


def settings_problem(settings: dict[str, Any]) -> str | None:
    """Why drill.json's content is not a drill's settings (KEY: reason), or None."""
    for key in ("runs", "seed"):
        if settings.get(key) is not None and not _whole_number(settings[key]):
            return f"{key}: not a whole number"
    if settings.get("config") is not None and not isinstance(settings["config"], dict):
        return "config: not an object"
    shard = settings.get("shard")
    if shard is None:
        return None
    if not isinstance(shard, dict):
        return "shard: not an object"
    for key in ("index", "count", "runs"):
        if not _whole_number(shard.get(key)):
            return f"shard.{key}: not a whole number"
    return None


def read_drill(folder: Path) -> Drill:
    """One drill's folder. Raises DrillFolderError when it is not one, or no run has finished yet."""
    settings_path, results_path = folder / DRILL_FILE, folder / RESULTS_FILE
    if not results_path.is_file():
        if settings_path.is_file():
            raise DrillFolderError(
                f"{folder}: a drill in progress: no run has finished yet ({DRILL_FILE} "
                f"but no {RESULTS_FILE}); report it once runs are done"
            )
        raise DrillFolderError(
            f"{folder}: neither a perturbation log nor a drill's folder (no {RESULTS_FILE})"
        )
    settings: dict[str, Any] = {}
    warnings: list[str] = []
    if settings_path.is_file():
        try:
            loaded = json.loads(settings_path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise DrillFolderError(f"{settings_path}: not a drill's settings: {exc}") from None
        if not isinstance(loaded, dict):
            raise DrillFolderError(f"{settings_path}: not a drill's settings (a JSON object)")
        if (problem := settings_problem(loaded)) is not None:
            raise DrillFolderError(f"{settings_path}: {problem}")
        settings = loaded
    results, skipped = read_results(results_path)
    gaps = list(skipped)
    shard = settings.get("shard")
    expected = shard["runs"] if shard is not None else settings.get("runs")
    if expected is None:
        gaps.append(f"{folder}: no {DRILL_FILE} saying how many runs were planned")
    elif len(results) < expected:
        gaps.append(_shortfall(folder, len(results), expected))
    warnings += gaps
    return Drill([folder], settings, results, {str(r["run"]): folder / str(r["run"]) for r in results},
                 warnings, gaps)


def _shortfall(folder: Path | str, results: int, planned: int) -> str:
    return f"{folder}: {results} of {planned} runs have results (a drill in progress, or one that was stopped)"


def merge(folders: list[Path]) -> Drill:
    """The shards of one drill as that drill. Raises DrillFolderError when they are not shards of one plan."""
    shards = [read_drill(folder) for folder in folders]
    first = shards[0]
    for shard in shards[1:]:
        for key, what in (("seed", "root seed"), ("version", "chaosproxy version")):
            if shard.settings.get(key) != first.settings.get(key):
                raise DrillFolderError(
                    f"{shard.sources[0]}: another {what} than {first.sources[0]} "
                    f"({shard.settings.get(key)} vs {first.settings.get(key)}): "
                    "not shards of one drill"
                )
        if shard.plan_settings != first.plan_settings:
            differ = sorted(
                key
                for key in shard.plan_settings.keys() | first.plan_settings.keys()
                if shard.plan_settings.get(key) != first.plan_settings.get(key)
            )
            raise DrillFolderError(
                f"{shard.sources[0]}: other settings than {first.sources[0]} "
                f"({', '.join(differ)}): not shards of one drill"
            )
    counts = {(shard.settings.get("shard") or {}).get("count") for shard in shards}
    indexes = [(shard.settings.get("shard") or {}).get("index") for shard in shards]
    warnings = [warning for shard in shards for warning in shard.warnings]
    gaps = [gap for shard in shards for gap in shard.gaps]
    if len(counts) == 1 and isinstance(count := counts.pop(), int):
        if len(set(indexes)) < len(indexes):
            raise DrillFolderError(
                "the same shard given twice: "
                + ", ".join(
                    f"{shard.sources[0]} ({index}/{count})"
                    for shard, index in zip(shards, indexes, strict=True)
                )
            )
        if missing := sorted(set(range(count)) - set(indexes)):
            gaps.append(
                f"shard(s) {', '.join(f'{i}/{count}' for i in missing)} not given: "
                "their runs are missing from the merge"
            )
            warnings.append(gaps[-1])
    results: dict[str, dict[str, Any]] = {}
    run_folders: dict[str, Path] = {}
    for shard in shards:
        for result in shard.results:
            run = str(result["run"])
            if run in results:
                raise DrillFolderError(
                    f"{run} is in both {run_folders[run].parent} and {shard.sources[0]}: "
                    "shards of one drill share no run"
                )
            results[run], run_folders[run] = result, shard.run_folders[run]
    settings = {key: value for key, value in first.settings.items() if key != "shard"}
    settings["merged_from"] = [
        {"folder": str(shard.sources[0]), "shard": shard.settings.get("shard")} for shard in shards
    ]
    ordered = sorted(results.values(), key=_run_number)
    planned = settings.get("runs")
    if not gaps and planned is not None and len(ordered) < planned:  # (shards that say nothing of themselves)
        gaps.append(_shortfall("the merge", len(ordered), planned))
        warnings.append(gaps[-1])
    return Drill([s.sources[0] for s in shards], settings, ordered, run_folders, warnings, gaps)


def write_merged(drill: Drill, out: Path) -> None:
    """The merged drill as one folder: drill.json, results.jsonl and every run's folder, copied."""
    import shutil

    out.mkdir(parents=True, exist_ok=True)
    if any(out.iterdir()):
        raise DrillFolderError(f"{out} is not empty; give the merged drill a new folder")
    (out / DRILL_FILE).write_text(json.dumps(drill.settings, indent=2) + "\n", encoding="utf-8")
    with open(out / RESULTS_FILE, "w", encoding="utf-8") as stream:
        for result in drill.results:
            stream.write(json.dumps(result) + "\n")
    for run, folder in drill.run_folders.items():
        if folder.is_dir():
            shutil.copytree(folder, out / run)
