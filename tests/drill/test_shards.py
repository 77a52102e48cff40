"""The plan, shards of it, and their merge: a sharded drill is the unsharded drill, run for run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from chaosproxy.drill.config import DrillConfig
from chaosproxy.drill.plan import Shard, plan_runs
from chaosproxy.report.build import build_report

CHAOSPROXY = [sys.executable, "-m", "chaosproxy"]
SUITE = """\
pick: 1
rules:
  - name: flaky
    match: {path: /api/weather}
    probability: !range [0.1, 0.6]
    fault: {type: http_error, status: !choice [500, 503]}
  - name: slow
    match: {path: /api/weather}
    fault: {type: latency, delay_ms: !range [1, 5]}
"""
AGENT = """
import os, sys, urllib.error, urllib.request
for city in ("lima", "oslo", "pune"):
    try:
        urllib.request.urlopen(os.environ["CHAOSPROXY_URL"] + "/api/weather?city=" + city, timeout=10).read()
    except urllib.error.HTTPError:
        sys.exit(1)
"""


def chaosproxy(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CHAOSPROXY, *args], capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def drill_file(tmp_path: Path, upstream: str) -> Path:
    """A 30-run drill: 6 clean runs and 8 sampled scenarios x 3, some runs failing, all deterministic."""
    (tmp_path / "suite.yaml").write_text(SUITE)
    (tmp_path / "agent.py").write_text(AGENT)
    drill = tmp_path / "drill.yaml"
    drill.write_text(
        f"agent: {sys.executable} {tmp_path / 'agent.py'}\nupstream: {upstream}\n"
        f"suite: {tmp_path / 'suite.yaml'}\nrandomize: 8\nrepeat: 3\nbaseline: 6\n"
        "seed: 31\ntimeout: 30\njobs: 2\n"
    )
    return drill


def runs(folder: Path) -> list[tuple[str, str, int, str]]:
    lines = (folder / "results.jsonl").read_text().splitlines()
    results = sorted((json.loads(line) for line in lines), key=lambda r: int(r["run"].split("-")[1]))
    return [(r["run"], r["label"], r["seed"], r["status"]) for r in results]


def test_shards_take_every_nth_run_of_one_plan_and_parse_like_job_indexes() -> None:
    config = DrillConfig(agent="true", upstream="http://127.0.0.1:1", repeat=1, baseline=7)
    plan = plan_runs(config, root_seed=3)
    shards = [Shard.parse(f"{i}/3").select(plan) for i in range(3)]
    assert [[spec.name for spec in shard] for shard in shards] == [
        ["run-1", "run-4", "run-7"],
        ["run-2", "run-5"],
        ["run-3", "run-6"],
    ]
    assert sorted((s for shard in shards for s in shard), key=lambda s: int(s.name[4:])) == plan
    for bad in ("3/3", "1", "-1/3", "a/b", "1/0"):
        with pytest.raises(ValueError, match="I/N|from 0 to N-1"):
            Shard.parse(bad)


def test_the_plan_is_printed_or_written_and_nothing_runs(drill_file: Path, tmp_path: Path) -> None:
    shown = chaosproxy("drill", str(drill_file), "--plan", "--out", str(tmp_path / "never"))
    assert shown.returncode == 0, shown.stderr
    header, *rows = shown.stdout.splitlines()
    assert header.split() == ["run", "shard", "kind", "scenario", "seed"]
    assert len(rows) == 30 and rows[0].split()[:4] == ["run-1", "0/1", "clean", "clean"]
    assert "30 runs (6 clean, 24 sample), root seed 31" in shown.stderr
    written = chaosproxy("drill", str(drill_file), "--plan", str(tmp_path / "plan.jsonl"), "--shard", "2/3")
    assert written.returncode == 0, written.stderr
    lines = [json.loads(line) for line in (tmp_path / "plan.jsonl").read_text().splitlines()]
    assert [line["run"] for line in lines] == [f"run-{n}" for n in range(3, 31, 3)]
    assert {line["shard"] for line in lines} == {"2/3"} and lines[0]["root_seed"] == 31
    assert lines[-1]["scenario_text"].startswith("# sample 8 of the suite")
    assert "shard 2/3: 10 of the plan's 30 runs" in written.stderr
    assert not (tmp_path / "never").exists()
    unseeded = chaosproxy("drill", str(drill_file), "--seed", "0", "--plan", "--shard", "0/2")
    assert unseeded.returncode == 0
    drill_file.write_text(drill_file.read_text().replace("seed: 31\n", ""))
    refused = chaosproxy("drill", str(drill_file), "--plan", "--shard", "0/2")
    assert refused.returncode == 2 and "a sharded drill needs --seed" in refused.stderr


@pytest.mark.timeout(900)
def test_three_shards_merged_equal_the_unsharded_drill_run_for_run(drill_file: Path, tmp_path: Path) -> None:
    whole = chaosproxy("drill", str(drill_file), "--out", str(tmp_path / "whole"))
    assert whole.returncode == 0, whole.stderr
    shards = [tmp_path / f"shard-{i}" for i in range(3)]
    for i, folder in enumerate(shards):
        done = chaosproxy("drill", str(drill_file), "--shard", f"{i}/3", "--out", str(folder))
        assert done.returncode == 0, done.stderr
        assert json.loads((folder / "drill.json").read_text())["shard"] == {
            "index": i,
            "count": 3,
            "runs": 10,
        }
    expected = runs(tmp_path / "whole")
    statuses = {status for *_, status in expected}
    assert len(expected) == 30 and statuses == {"passed", "failed"}  # the comparison can tell them apart
    merged = chaosproxy("merge", *map(str, shards), "--out", str(tmp_path / "merged"))
    assert merged.returncode == 0, merged.stderr
    assert runs(tmp_path / "merged") == expected
    assert {p.name for p in (tmp_path / "merged").iterdir()} == {
        "drill.json",
        "results.jsonl",
        *(f"run-{n}" for n in range(1, 31)),
    }
    for n in (1, 17, 30):
        assert (tmp_path / "merged" / f"run-{n}" / "scenario.yaml").read_text() == (
            tmp_path / "whole" / f"run-{n}" / "scenario.yaml"
        ).read_text()
    whole_json, merged_json = tmp_path / "whole.json", tmp_path / "merged.json"
    assert chaosproxy("report", str(tmp_path / "whole"), "--json", str(whole_json)).returncode == 0
    in_place = chaosproxy("report", *map(str, shards), "--merge", "--json", str(merged_json))
    assert in_place.returncode == 0, in_place.stderr
    assert json.loads(merged_json.read_text())["profile"] == json.loads(whole_json.read_text())["profile"]
    assert build_report(tmp_path / "merged").profile == build_report(tmp_path / "whole").profile


def _shard_folder(folder: Path, index: int, count: int, results: list[dict[str, Any]], seed: int = 5) -> Path:
    folder.mkdir()
    settings = {
        "version": "0.1.0",
        "seed": seed,
        "runs": 4,
        "shard": {"index": index, "count": count, "runs": len(results)},
        "config": {"agent": "a", "out": str(folder)},
    }
    (folder / "drill.json").write_text(json.dumps(settings))
    (folder / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in results))
    return folder


def _result(n: int) -> dict[str, Any]:
    return {"run": f"run-{n}", "label": "clean", "kind": "clean", "seed": n, "status": "passed", "faults": {}}


def test_a_merge_refuses_what_is_not_shards_of_one_drill_and_warns_of_missing_ones(tmp_path: Path) -> None:
    a = _shard_folder(tmp_path / "a", 0, 3, [_result(1), _result(4)])
    b = _shard_folder(tmp_path / "b", 1, 3, [_result(2)])
    other_seed = _shard_folder(tmp_path / "c", 2, 3, [_result(3)], seed=6)
    twice = _shard_folder(tmp_path / "d", 1, 3, [_result(5)])
    for folders, message in [
        ([a, other_seed], "another root seed"),
        ([b, twice], "the same shard given twice"),
        ([a, a], "the same shard given twice"),
    ]:
        done = chaosproxy("merge", *map(str, folders), "--out", str(tmp_path / "out"))
        assert done.returncode == 2 and message in done.stderr, done.stderr
    done = chaosproxy("merge", str(a), str(b), "--out", str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr
    assert "shard(s) 2/3 not given" in done.stderr
    assert [r[0] for r in runs(tmp_path / "out")] == ["run-1", "run-2", "run-4"]
