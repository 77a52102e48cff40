"""`chaosproxy import-inspect LOG.eval`: an Inspect eval of a chaos task as a drill's folder.

Each scored sample-epoch becomes a run: its result line (harness.results: the same reading of the
score as the chaos metrics), and a folder with its scenario and log (from the store), so `report`,
compare, `--fail-under`, `merge` and `export` apply unchanged. A sample-epoch that errored without a
score is a run with status `error` (it counts for nothing, as a drill run whose machinery failed).
Run names follow the sample id and epoch, so the shards of one eval (`--shard I/N`) share none and
merge back into the eval they split.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson

from chaosproxy.drill.plan import Shard
from chaosproxy.harness.results import run_name, sample_result
from chaosproxy.harness.sample import STORE_KEY
from chaosproxy.records.drill_folder import DRILL_FILE, RESULTS_FILE


class InspectLogError(ValueError):
    """An Inspect log that cannot be imported; the message names the log and says why."""


def import_eval(log_path: Path, out: Path, *, scorer: str | None = None, shard: Shard | None = None) -> int:
    """Write the drill folder `out` (new or empty) from the eval log; returns the number of runs."""
    from inspect_ai.log import read_eval_log

    try:
        log = read_eval_log(str(log_path))
    except Exception as exc:  # Inspect raises what its readers raise: the reason is in the message
        raise InspectLogError(f"{log_path}: not an Inspect eval log ({type(exc).__name__}: {exc})") from None
    samples = sorted(log.samples or [], key=lambda s: (str(s.id), s.epoch))
    name = scorer or _chaos_scorer(log_path, samples)
    epochs = log.eval.config.epochs or 1
    runs: list[tuple[dict[str, Any], dict[str, Any] | None]] = []
    for sample in samples:
        score = (sample.scores or {}).get(name)
        result = sample_result(score.value, score.metadata) if score is not None else None
        record = (sample.store or {}).get(STORE_KEY)
        if result is None:
            if record is None:
                continue  # not a sample of a chaos task
            result = {"label": record["label"], "kind": record["kind"], "seed": record["seed"], "status": "error",
                      "success": None, "faults": record["faults"], "components": record["components"],
                      "error": sample.error.message if sample.error else "no score"}
        runs.append(({"run": run_name(sample.id, sample.epoch, epochs), **result, "sample_id": sample.id,
                      "epoch": sample.epoch}, record))
    if not runs:
        raise InspectLogError(f"{log_path}: no sample scored by a chaos task's scorer (chaosproxy.harness.chaos_task)")
    _write(out, log_path, log, name, runs, shard)
    return len(runs)


def _chaos_scorer(log_path: Path, samples: list[Any]) -> str:
    """The first scorer whose scores carry the chaos metadata."""
    for sample in samples:
        for name, score in (sample.scores or {}).items():
            if STORE_KEY in (score.metadata or {}):
                return name
    raise InspectLogError(f"{log_path}: no score carries chaosproxy's metadata: not an eval of a chaos task "
                       "(chaosproxy.harness.chaos_task), or it has not been scored")


def _write(out: Path, log_path: Path, log: Any, scorer: str,
           runs: list[tuple[dict[str, Any], dict[str, Any] | None]], shard: Shard | None) -> None:
    out.mkdir(parents=True, exist_ok=True)
    if any(out.iterdir()):
        raise InspectLogError(f"{out} is not empty; give the imported eval a new folder")
    first = next(record for _, record in runs if record is not None)
    spec = log.eval
    settings: dict[str, Any] = {
        "version": first["version"], "seed": first.get("plan_seed"), "started": spec.created,
        "runs": len(runs) if shard is None else None, "inspect_log": str(log_path),
        "config": {"source": "inspect", "task": spec.task, "model": spec.model, "scorer": scorer,
                   "epochs": spec.config.epochs, "plan": first.get("plan")}}
    if shard is not None:
        settings["shard"] = {"index": shard.index, "count": shard.count, "runs": len(runs)}
    (out / DRILL_FILE).write_text(json.dumps(settings, indent=2, default=str) + "\n", encoding="utf-8")
    with open(out / RESULTS_FILE, "w", encoding="utf-8") as results:
        for result, record in runs:
            results.write(json.dumps(result, default=str) + "\n")
            folder = out / result["run"]
            folder.mkdir()
            if record is not None:
                (folder / "scenario.yaml").write_text(record["scenario"], encoding="utf-8")
                with open(folder / "log.jsonl", "wb") as lines:
                    for line in record["log"]:
                        lines.write(orjson.dumps(line, option=orjson.OPT_APPEND_NEWLINE))
