"""What a new user met on a fresh clone (issue 30): the CLI's listings cut short by `head`, lines wider than a
terminal, and report bars that did not show or say what they were."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from chaosproxy.faults import all_faults
from chaosproxy.report.compare import CompareRow
from chaosproxy.report.stats import Rate
from chaosproxy.report.svg import MIN_BAR_W, OTHER_COLOUR, comparison_chart
from tests.report.test_compare import _drill

CHAOSPROXY = [sys.executable, "-m", "chaosproxy"]


@pytest.mark.slow
@pytest.mark.parametrize("command", ["faults", "schema"])
def test_a_listing_read_by_head_ends_quietly(command: str) -> None:
    """`chaosproxy faults | head` once ended in a BrokenPipeError traceback."""
    line = " ".join(CHAOSPROXY) + f" {command} | head -1; exit ${{PIPESTATUS[0]}}"
    done = subprocess.run(["bash", "-c", line], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stderr) == (0, "")
    assert len(done.stdout.splitlines()) == 1


@pytest.mark.slow
def test_the_fault_listing_fits_a_terminal_and_names_every_fault() -> None:
    listing = subprocess.run([*CHAOSPROXY, "faults"], capture_output=True, text=True, timeout=60, check=True).stdout
    assert max(map(len, listing.splitlines())) <= 100
    blocks = {block.split()[0]: block for block in listing.split("\n\n")}
    assert blocks.keys() == all_faults().keys()
    for name, fault in all_faults().items():
        head, *rest = blocks[name].splitlines()
        assert head == f"{name}  ({fault.component}, {fault.level})"
        text = " ".join(line.strip() for line in rest)
        assert fault.summary() in text
        for parameter in fault.model_fields.keys() - {"type"}:
            assert re.search(rf"\b{parameter}\b", text.partition("parameters:")[2]), (name, parameter)


def test_a_bar_at_zero_shows_its_colour_and_says_its_value() -> None:
    """A 0 % bar was 1 px wide: only its whisker showed."""
    chart = comparison_chart([CompareRow("component", "transition", Rate(0, 6), Rate(6, 6))], "component")
    widths = [float(w) for w in re.findall(r'<rect [^>]*width="([\d.]+)"', chart)]
    assert min(widths) >= MIN_BAR_W
    assert re.search(r'<g class="bar base">.*<text [^>]*>0%</text></g>', chart)
    assert not re.search(r'<g class="bar new">.*<text ', chart)  # a full bar needs no label


@pytest.mark.slow
def test_the_comparison_legend_names_every_colour_its_bars_have(tmp_path: Path) -> None:
    """The "new" bars of overall, clean and scenario rows had a colour the legend did not name."""
    scenarios = {"clean": "rules: []\n", "s": "rules:\n  - name: e\n    fault: {type: http_error}\n"}
    results = [("run-1", "clean", "passed", {}), ("run-2", "s", "failed", {"transition": 1})]
    base = _drill(tmp_path / "base", 1, results, scenarios)
    new = _drill(tmp_path / "new", 1, results, scenarios)
    html = tmp_path / "compare.html"
    subprocess.run([*CHAOSPROXY, "report", str(base), str(new), "--html", str(html)], check=True, timeout=60)
    page = html.read_text()
    legend = re.search(r'<p class="legend">(.*?)</p>', page).group(1)
    bar_colours = set(re.findall(r'<g class="bar new">.*?fill="(#[0-9a-f]+)"', page))
    assert OTHER_COLOUR in bar_colours
    assert all(f"background:{colour}" in legend for colour in bar_colours)
