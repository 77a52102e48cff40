"""The README and the docs site (issue 30): a short README whose links into the docs resolve, a site that
builds strictly, a fault reference that lists every registered fault, and a mode table the CLI agrees with.

The code blocks of both run in tests/test_readme.py.
"""

from __future__ import annotations

import html
import importlib.util
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from markdown.extensions.toc import slugify

from chaosproxy.cli import build_parser
from chaosproxy.engine.scenario import parse_scenario
from chaosproxy.faults import all_faults

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
README_LIMIT = 12 * 1024
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*(?:\{#([\w-]+)\})?\s*$", re.M)


def _reference() -> Any:
    """docs/hooks/fault_reference.py, the mkdocs hook, as a module."""
    spec = importlib.util.spec_from_file_location("fault_reference", DOCS / "hooks" / "fault_reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def anchors(path: Path) -> set[str]:
    """The ids of a page's headings, as mkdocs' toc makes them (an explicit {#id} wins)."""
    headings = _HEADING.findall(path.read_text())
    return {explicit or slugify(re.sub(r"[`*]", "", text), "-") for text, explicit in headings}


def test_the_readme_is_short_and_every_link_into_the_docs_resolves() -> None:
    text = README.read_text()
    assert len(text.encode()) < README_LIMIT
    links = [link for link in _LINK.findall(text) if not re.match(r"\w+:", link)]
    into_docs = [link for link in links if link.startswith("docs/")]
    assert len(into_docs) >= 15  # the mode table, the pages, the picture
    for link in links:
        target, _, anchor = link.partition("#")
        path = ROOT / target
        assert path.is_file(), f"README links to {link}: no such file"
        if anchor:
            assert anchor in anchors(path), f"README links to {link}: {target} has no such heading"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site, built as CI builds it: strictly, so a broken link, anchor or nav entry fails."""
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={"NO_MKDOCS_2_WARNING": "1", "PATH": str(Path(sys.executable).parent)})
    assert done.returncode == 0, done.stderr[-4000:]
    return out


def test_the_fault_reference_lists_every_registered_fault(site: Path) -> None:
    page = (site / "faults" / "index.html").read_text()
    shown = set(re.findall(r'<h3 id="([\w]+)">', page))
    assert shown == all_faults().keys()
    for name, cls in all_faults().items():
        section = page.split(f'<h3 id="{name}">', 1)[1].split("<h3 ", 1)[0]
        assert cls.summary().replace("`", "") in html.unescape(re.sub(r"<[^>]+>", "", section)), name
        assert f"<strong>{cls.component}</strong>" in section and f"<code>{cls.level}</code>" in section, name
        for key, info in cls.model_fields.items():
            if key != "type":
                assert f"<code>{key}</code>" in section, (name, key)
                assert ("required" if info.is_required() else "<code>") in section, (name, key)
        assert "Reproduces:" in section and '<span class="nt">rules</span>' in section, name  # its example


def test_every_example_in_the_fault_reference_is_a_valid_scenario_of_its_fault() -> None:
    reference = _reference()
    examples = re.findall(r"^### `(\w+)`.*?^```yaml\n(.*?)^```", reference.fault_reference(), re.M | re.S)
    assert [name for name, _ in examples] == [name for name, _ in sorted(all_faults().items(),
                                                                          key=reference.by_component)]
    for name, text in examples:
        scenario = parse_scenario(text, f"faults.md ({name})")
        assert [rule.fault.type for rule in scenario.rules] == [name]


def test_the_reference_says_what_a_bundled_scenario_reproduces() -> None:
    reference = _reference()
    bundled = reference.bundled_examples()
    path, reproduces, rule = bundled["http_error"]
    assert path == ROOT / "scenarios" / "transition" / "server_error.yaml"
    assert reproduces == "the tool server (or the gateway in front of it) fails with 503 without doing the work."
    assert rule["fault"] == {"type": "http_error", "status": 503}
    section = reference.fault_section("http_error", all_faults()["http_error"], bundled["http_error"])
    assert f"**Reproduces:** {reproduces} (`scenarios/transition/server_error.yaml`)" in section


def test_a_fault_without_a_bundled_scenario_fails_the_build_naming_the_file_to_write() -> None:
    with pytest.raises(ValueError, match=r"scenarios/transition/latency\.yaml"):
        _reference().fault_section("latency", all_faults()["latency"], None)


def mode_table() -> list[dict[str, str]]:
    """The README's "Which mode do I need" rows, by column."""
    text = README.read_text().split("## Which mode do I need", 1)[1].split("\n## ", 1)[0]
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in text.splitlines()
            if line.startswith("|")]
    header, _, *body = rows
    return [dict(zip(header, row, strict=True)) for row in body]


# What each mode's --help must say for the table's row to be true of it.
HELP_SAYS = {
    "run": ("MCP", "streamable", "base_url", ".../v1", "anthropic", "--upstream URL", "--route PREFIX=URL"),
    "stdio": ("MCP", "--scenario FILE scenario YAML", "-- COMMAND"),  # its usage and its options agree
    "mitm": ("HTTPS_PROXY", "[mitm]", "--hosts"),
}


def _help(command: str) -> str:
    done = subprocess.run([sys.executable, "-m", "chaosproxy", command, "--help"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    return re.sub(r"\s+", " ", done.stdout)


@pytest.mark.parametrize("row", mode_table(), ids=lambda row: row["mode"])
def test_each_mode_in_the_readme_table_is_a_command_its_help_agrees_with(row: dict[str, str]) -> None:
    command = re.match(r"`(chaosproxy [^`]+)`", row["mode"])
    assert command, f"the mode cell names no command: {row['mode']}"
    words = shlex.split(command.group(1))[1:]
    placeholders = {"URL": "http://127.0.0.1:9", "FILE": "chaos.yaml", "HOST": "api.example.com", "DIR": "cassette",
                    "LOG.eval": "log.eval", "COMMAND": "server"}
    build_parser().parse_args([placeholders.get(word, word) for word in words])  # the table's line parses
    help_text = _help(words[0])
    for option in (word for word in words if word.startswith("--") and len(word) > 2):
        assert option in help_text, f"{words[0]} --help does not mention {option}"
    for phrase in HELP_SAYS.get(words[0], ()):
        assert phrase in help_text, f"{words[0]} --help does not say {phrase!r}"
    assert re.search(rf"\b{re.escape(words[0])}\b", _help_of_chaosproxy()), f"chaosproxy --help omits {words[0]}"


def _help_of_chaosproxy() -> str:
    done = subprocess.run([sys.executable, "-m", "chaosproxy", "--help"], capture_output=True, text=True, timeout=60)
    return done.stdout


def test_the_top_level_help_says_what_chaosproxy_is() -> None:
    text = re.sub(r"\s+", " ", _help_of_chaosproxy())
    assert "The `chaosproxy` command line" not in text
    assert "fault-injecting proxy" in text and "chaosproxy demo" in text


def test_report_and_demo_help_open_with_what_they_do() -> None:
    report = _help("report")
    assert "The robustness profile of a drill" in report and "their flags and what they write" not in report
    demo = _help("demo")
    assert "an MCP server and a model API" in demo and "three scripted agents" in demo
    assert "printed as it goes" not in demo and "temporary folder" in demo


def test_the_blocks_that_run_keep_their_files_in_their_own_folder() -> None:
    """A block once logged to /tmp/llm-faults.jsonl: every test run wrote the file the reader was told to read."""
    from tests.test_readme import BLOCKS

    running = [b for b in BLOCKS if b.lang in ("sh", "python") and "skip" not in b.options]
    assert len(running) >= 10
    for block in running:
        assert not re.search(r"(?<![\w.])/tmp/", block.text), f"{block.id} names a file under /tmp"


def test_the_docs_name_every_page_in_the_nav() -> None:
    """Every page is reachable from the nav (mkdocs only warns of an omitted one: strict makes it fail)."""
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text().replace("!!python", ""))
    listed = set(re.findall(r"[\w/-]+\.md", yaml.safe_dump(config["nav"])))
    pages = {str(path.relative_to(DOCS)) for path in DOCS.rglob("*.md")}
    assert listed == pages
