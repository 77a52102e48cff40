"""Comparing two drills and gating on them: the naive and the retrying example agents over the same faults,
the comparison in a real headless Chromium, and drill folders that are cut short or still running."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.browser import load
from tests.helpers.mcp_support import serve

CHAOSPROXY = [sys.executable, "-m", "chaosproxy"]
ROOT = Path(__file__).resolve().parents[2]
SUITE = ROOT / "scenarios" / "suites" / "transient.yaml"


def chaosproxy(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CHAOSPROXY, *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT)


@pytest.fixture(scope="module")
def drills(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    """The naive and the retrying agent drilled over the same sampled transient faults, gated on
    transition."""
    base = tmp_path_factory.mktemp("agents")
    folders = {}
    with serve("http") as url:
        for agent in ("naive", "retry"):
            folders[agent] = base / agent
            done = chaosproxy(
                "drill",
                "--agent",
                f"{sys.executable} examples/agent_{agent}.py",
                "--upstream",
                f"{url}/mcp",
                "--suite",
                str(SUITE),
                "--randomize",
                "6",
                "--baseline",
                "2",
                "--seed",
                "2026",
                "--jobs",
                "2",
                "--timeout",
                "60",
                "--fail-under",
                "transition=0.8",
                "--out",
                str(folders[agent]),
            )
            folders[f"{agent}-exit"] = done.returncode  # type: ignore[assignment]
            folders[f"{agent}-stderr"] = done.stderr  # type: ignore[assignment]
    yield folders


@pytest.mark.timeout(900)
def test_the_drill_gate_fails_the_naive_agent_and_passes_the_retrying_one(drills: dict[str, Any]) -> None:
    assert drills["naive-exit"] == 3, drills["naive-stderr"]
    assert (
        "gate failed: transition: " in drills["naive-stderr"]
        and "under the minimum 80%" in drills["naive-stderr"]
    )
    assert drills["retry-exit"] == 0, drills["retry-stderr"]
    for agent, expected in (("naive", 3), ("retry", 0)):
        done = chaosproxy(
            "report",
            str(drills[agent]),
            "--fail-under",
            "transition=0.8,overall=80%",
            "--md",
            str(drills[agent].parent / f"{agent}.md"),
        )
        assert done.returncode == expected, done.stderr
    missed = chaosproxy(
        "report", str(drills["naive"]), "--fail-under", "transition=0.8,overall=0.8,reward=0.5"
    )
    assert missed.returncode == 3
    failed = [line for line in missed.stderr.splitlines() if "gate failed" in line]
    assert [line.split("gate failed: ")[1].split(":")[0] for line in failed] == [
        "transition",
        "overall",
        "reward",
    ]
    assert "no run where a reward fault fired" in failed[2]
    bad = chaosproxy("report", str(drills["naive"]), "--fail-under", "transition=1.5")
    assert bad.returncode == 2 and "RATE from 0 to 1" in bad.stderr


@pytest.mark.timeout(900)
def test_the_comparison_flags_transition_as_a_real_improvement(
    drills: dict[str, Any], tmp_path: Path
) -> None:
    out = tmp_path / "compare.json"
    done = chaosproxy(
        "report",
        str(drills["naive"]),
        str(drills["retry"]),
        "--json",
        str(out),
        "--md",
        str(tmp_path / "compare.md"),
        "--max-regression",
        "5",
    )
    assert done.returncode == 0, done.stderr
    data = json.loads(out.read_text())
    rows = {(row["section"], row["name"]): row for row in data["rows"]}
    transition = rows[("component", "transition")]
    assert transition["real_change"] == "better" and transition["difference_ci95"][0] > 0
    assert transition["new"]["rate"] == 1.0 and transition["base"]["rate"] < 0.5
    assert rows[("clean", "no fault")]["real_change"] is None  # both pass every clean run
    assert {name for section, name in rows if section == "scenario"} == {
        "clean",
        *(f"sample-{k}" for k in range(1, 7)),
    }
    assert data["settings_differ"] == [
        {
            "setting": "agent",
            "base": f"{sys.executable} examples/agent_naive.py",
            "new": f"{sys.executable} examples/agent_retry.py",
        }
    ]
    markdown = (tmp_path / "compare.md").read_text()
    assert "**Real changes:** " in markdown and "component transition better" in markdown
    backwards = chaosproxy("report", str(drills["retry"]), str(drills["naive"]), "--max-regression", "5")
    assert backwards.returncode == 3
    assert "gate failed: component transition: " in backwards.stderr and "real: worse" in backwards.stdout


@pytest.mark.timeout(900)
def test_the_comparison_html_shows_paired_bars_in_chromium_without_errors(
    drills: dict[str, Any], tmp_path: Path
) -> None:
    html = tmp_path / "compare.html"
    done = chaosproxy("report", str(drills["naive"]), str(drills["retry"]), "--html", str(html))
    assert done.returncode == 0, done.stderr
    page = asyncio.run(
        load(
            html.as_uri(),
            {
                "title": "document.title",
                "charts": "document.querySelectorAll('svg.chart.comparison').length",
                "pairs": "[...document.querySelectorAll('svg.comparison')].map(s => "
                "[s.querySelectorAll('.bar.base').length, s.querySelectorAll('.bar.new').length])",
                "bars_drawn": "[...document.querySelectorAll('svg.comparison .bar rect')]"
                ".every(r => r.getBBox().width > 0)",
                "improved": "[...document.querySelectorAll('svg.comparison text.better')]"
                ".map(t => t.textContent)",
                "fetched": "performance.getEntriesByType('resource').length",
            },
        )
    )
    assert page.problems == []
    assert page.values["title"] == "chaosproxy drill comparison"
    assert page.values["charts"] == 4 and page.values["bars_drawn"] and page.values["fetched"] == 0
    assert all(base == new > 0 for base, new in page.values["pairs"])
    assert any(text.endswith("▲") for text in page.values["improved"])


def _drill(
    folder: Path, seed: int, results: list[tuple[str, str, str, dict[str, int]]], scenarios: dict[str, str]
) -> Path:
    """A hand-made drill folder: results (run, label, status, components) and each label's scenario text."""
    folder.mkdir()
    (folder / "drill.json").write_text(
        json.dumps({"seed": seed, "runs": len(results), "config": {"agent": "a", "suite": "s.yaml"}})
    )
    lines = []
    for run, label, status, components in results:
        (folder / run).mkdir()
        (folder / run / "scenario.yaml").write_text(scenarios[label])
        kind = "clean" if label == "clean" else "sample"
        faults = {"http_error" if c == "transition" else "typos": n for c, n in components.items()}
        lines.append(
            json.dumps(
                {
                    "run": run,
                    "label": label,
                    "kind": kind,
                    "seed": 1,
                    "status": status,
                    "faults": faults,
                    "components": components,
                }
            )
        )
    (folder / "results.jsonl").write_text("\n".join(lines) + "\n")
    return folder


def test_drills_with_other_seeds_are_compared_on_what_they_share(tmp_path: Path) -> None:
    clean, a, b = "rules: []\n", "rules: [{name: a, fault: {type: reset}}]\n", "rules: [{name: b}]\n"
    base = _drill(
        tmp_path / "base",
        1,
        [
            ("run-1", "clean", "passed", {}),
            ("run-2", "sample-1", "failed", {"transition": 1}),
            ("run-3", "sample-2", "passed", {"observation": 2}),
        ],
        {"clean": clean, "sample-1": a, "sample-2": b},
    )
    new = _drill(
        tmp_path / "new",
        2,
        [
            ("run-1", "clean", "passed", {}),
            ("run-2", "sample-1", "passed", {"transition": 1}),
            ("run-3", "sample-2", "passed", {"transition": 1}),
        ],
        {"clean": clean, "sample-1": b.replace("b", "c"), "sample-2": a},
    )
    out = tmp_path / "c.json"
    done = chaosproxy("report", str(base), str(new), "--json", str(out))
    assert done.returncode == 0, done.stderr
    data = json.loads(out.read_text())
    assert [(row["section"], row["name"]) for row in data["rows"]] == [
        ("overall", "any fault"),
        ("clean", "no fault"),
        ("component", "transition"),
        ("fault", "http_error"),
        ("scenario", "clean"),
        ("scenario", "sample-1 (new: sample-2)"),
    ]
    assert data["only_in_base"] == ["component observation", "fault typos", "scenario sample-2"]
    assert data["only_in_new"] == ["scenario sample-1"]
    assert data["settings_differ"] == [{"setting": "seed", "base": 1, "new": 2}]
    assert all(row["real_change"] is None for row in data["rows"])  # one run a side proves nothing
    text = chaosproxy("report", str(base), str(new)).stdout
    assert "## What the drills do not share" in text and "- seed: base 1, new 2" in text


def test_a_cut_results_line_is_skipped_with_a_warning_naming_the_file(tmp_path: Path) -> None:
    folder = _drill(
        tmp_path / "d",
        1,
        [("run-1", "clean", "passed", {}), ("run-2", "sample-1", "failed", {"transition": 1})],
        {"clean": "rules: []\n", "sample-1": "rules: []\n"},
    )
    with open(folder / "results.jsonl", "a") as out:
        out.write('{"run": "run-3", "label": "sampl')
    results = folder / "results.jsonl"
    for args in (
        ["report", str(folder)],
        ["report", str(folder), "--json", str(tmp_path / "r.json")],
        ["export", str(folder), "--format", "trajectories"],
    ):
        done = chaosproxy(*args)
        assert done.returncode == 0, done.stderr
        assert "Traceback" not in done.stderr
        assert f"warning: {results}:3: skipped a line cut short" in done.stderr
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["profile"]["runs"] == 2 and any("cut short" in note for note in data["notes"])


def test_a_drill_folder_with_only_its_settings_is_a_drill_in_progress(tmp_path: Path) -> None:
    folder = tmp_path / "running"
    folder.mkdir()
    (folder / "drill.json").write_text(json.dumps({"seed": 1, "runs": 10, "config": {}}))
    for command in (["report", str(folder)], ["export", str(folder), "--format", "trajectories"]):
        done = chaosproxy(*command)
        assert done.returncode == 2 and "Traceback" not in done.stderr
        assert f"{folder}: a drill in progress: no run has finished yet" in done.stderr
    (folder / "results.jsonl").write_text(
        json.dumps({"run": "run-1", "label": "clean", "kind": "clean", "seed": 1, "status": "passed"}) + "\n"
    )
    done = chaosproxy("report", str(folder))
    assert done.returncode == 0 and f"warning: {folder}: 1 of 10 runs have results" in done.stderr
    (folder / "drill.json").write_text("{not json")
    done = chaosproxy("report", str(folder))
    assert done.returncode == 2 and f"{folder / 'drill.json'}: not a drill's settings" in done.stderr
