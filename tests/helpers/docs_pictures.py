"""Make the pictures the README and the docs show, from real runs, in a real headless Chromium.

    python -m tests.helpers.docs_pictures [compare] [console]      (both when none is named)

- docs/compare.png: the comparison report's paired bars (by POMDP component) of two small drills, the
  naive and the retrying example agent over the same faults sampled from every component (a few minutes).
- docs/console.png: the live console while the demo's three agents run through its proxy.
"""

from __future__ import annotations

import asyncio
import importlib.resources
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.helpers.browser import open_tab
from tests.helpers.mcp_support import serve

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
COMPARED = ("naive", "retry")
# The chart by POMDP component under its heading, the legend put just above it, with a margin.
COMPARISON_AREA = """(() => {
  const heading = document.getElementById('component'), chart = heading.nextElementSibling;
  chart.before(document.querySelector('p.legend').cloneNode(true));
  const boxes = [heading, chart].map(e => e.getBoundingClientRect());
  const x = boxes[0].left - 12, y = boxes[0].top + scrollY - 12;
  return {x, y, width: Math.max(boxes[0].right, boxes[1].right) + 12 - x, height: boxes[1].bottom + scrollY + 12 - y};
})()"""

# The console has polled since the last fault: its fault count is the feed's.
CAUGHT_UP = ("document.getElementById('faults').textContent == "
             "String(document.querySelectorAll('#feed div[data-rule]').length)")


def compare_picture(out: Path) -> None:
    with tempfile.TemporaryDirectory() as work, serve("http") as url:
        folders = [Path(work) / agent for agent in COMPARED]
        for agent, folder in zip(COMPARED, folders, strict=True):
            subprocess.run([sys.executable, "-m", "chaosproxy", "drill", "--agent",
                            f"{sys.executable} examples/agent_{agent}.py", "--upstream", f"{url}/mcp",
                            "--suite", "scenarios/suites/components.yaml", "--randomize", "16", "--baseline", "2",
                            "--seed", "2026", "--jobs", "2", "--timeout", "60", "--out", str(folder)],
                           cwd=ROOT, check=True, timeout=900)
        page = Path(work) / "compare.html"
        subprocess.run([sys.executable, "-m", "chaosproxy", "report", *map(str, folders), "--html", str(page)],
                       cwd=ROOT, check=True, timeout=120)
        asyncio.run(_shoot(page.as_uri(), out, COMPARISON_AREA))


async def _shoot(url: str, out: Path, area: str) -> None:
    async with open_tab(url) as tab:
        await tab.screenshot(out, width=1100, height=900, clip=area)


def console_picture(out: Path) -> None:
    asyncio.run(_console(out))


async def _console(out: Path) -> None:
    """The demo, with the control API on its engine and the console open while the agents run."""
    from chaosproxy.control.api import start_control
    from chaosproxy.control.runtime import open_engine
    from chaosproxy.demo import story
    from chaosproxy.engine.scenario import parse_scenario

    text = importlib.resources.files("chaosproxy").joinpath("data/demo.yaml").read_text()
    with tempfile.TemporaryDirectory() as work, open_engine(
            "demo.yaml", scenario=parse_scenario(text, "demo.yaml"), log_path=Path(work) / "demo.jsonl") as engine:
        control, port = await start_control(engine)
        try:
            async with open_tab(f"http://127.0.0.1:{port}/") as tab:
                await story._demo(engine)
                await tab.wait_for(CAUGHT_UP)
                await tab.screenshot(out, height=1000)  # at once: the last second's rates still show
        finally:
            await control.stop()


if __name__ == "__main__":
    wanted = set(sys.argv[1:]) or {"compare", "console"}
    if "compare" in wanted:
        compare_picture(DOCS / "compare.png")
    if "console" in wanted:
        console_picture(DOCS / "console.png")
