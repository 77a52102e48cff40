"""README.md and the docs (docs/**/*.md) are executable: every fenced sh, python, yaml, json and text block
is checked.

A block is run as its language says, shaped by an HTML comment right above it:

    <!-- readme: session=NAME exit=N skip="why" command="..." kind=scenario|suite|log|pytest|output|config -->

- `sh` blocks run in bash, in a fresh folder that sees the repository's examples, scenarios, tests
  and bench: the documents' ports (9000, 9001, 9100, 8800, 8801, 8100) are replaced by free ones.
  Blocks of one `session` (of one file) run as one script in order, `python` blocks of the session as
  `python FILE` in their place; a line ending in `&` keeps running until the session ends, and the
  session's processes are stopped by their process group. A block waits for what it started, as a
  reader pasting it must: nothing here waits for it. `exit=N` is the expected exit status (default 0).
- `text` blocks marked `kind=output` follow a session's block: each line must appear in that
  session's output, `...` matching anything. With `command="..."` the block is that command's output
  instead (run on its own in a fresh folder).
- `yaml` blocks validate as scenarios (`kind=suite`: as a drill suite); `json` blocks parse
  (`kind=log`: the log example, compared field by field with the lines of a real run).
- `python` blocks marked `kind=pytest` run as a test file and must pass; others run as scripts.
- `skip="why"` is for what cannot run here (a container engine, a fresh machine's install), and
  must say why.

So drift between the documents and the code fails CI.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.helpers.support import free_port

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCUMENTS = [README, *sorted((ROOT / "docs").rglob("*.md"))]
BIN = Path(sys.executable).parent
README_PORTS = ("9000", "9001", "9100", "8800", "8801", "8100")
_FENCE = re.compile(r"^```(\w*)\s*$")
_DIRECTIVE = re.compile(r"<!--\s*readme:(.*?)-->", re.S)


@dataclass
class Block:
    lang: str
    text: str
    line: int
    options: dict[str, str] = field(default_factory=dict)
    source: str = "README.md"

    @property
    def id(self) -> str:
        return f"{self.source}:{self.line}:{self.lang}"

    @property
    def session(self) -> str | None:
        """The session's name, of its file: the same name in two files is two sessions."""
        return f"{self.source}:{self.options['session']}" if "session" in self.options else None


def parse_readme(text: str, source: str = "README.md") -> list[Block]:
    blocks: list[Block] = []
    lines = text.splitlines()
    pending: dict[str, str] = {}
    i = 0
    while i < len(lines):
        line = lines[i]
        if m := _DIRECTIVE.search(line):
            pending = dict(_options(m.group(1)))
        elif (m := _FENCE.match(line)) and m.group(1):
            start = i
            i += 1
            body: list[str] = []
            while i < len(lines) and not lines[i].startswith("```"):
                body.append(lines[i])
                i += 1
            blocks.append(Block(m.group(1), "\n".join(body) + "\n", start + 1, pending, source))
            pending = {}
        elif line.strip():
            pending = {}  # a directive applies to the block right below it only
        i += 1
    return blocks


def _options(text: str) -> list[tuple[str, str]]:
    return [tuple(word.split("=", 1)) if "=" in word else (word, "") for word in shlex.split(text)]  # type: ignore[misc]


BLOCKS = [block for path in DOCUMENTS for block in parse_readme(path.read_text(), str(path.relative_to(ROOT)))]
CHECKED = [b for b in BLOCKS if b.lang in ("sh", "python", "yaml", "json", "text")]


def test_every_skip_says_why() -> None:
    for block in BLOCKS:
        if "skip" in block.options:
            assert block.options["skip"].strip(), f"{block.id}: skip needs a reason"


def test_readme_has_the_two_fresh_machine_commands() -> None:
    shell = "\n".join(b.text for b in BLOCKS if b.lang == "sh" and b.source == "README.md")
    assert "chaosproxy demo" in shell
    ci = (ROOT / ".ci" / "run").read_text()
    test_command = next(line for line in shell.splitlines() if line.rstrip().endswith(".venv/bin/pytest"))
    assert test_command.strip() in ci, "the README's test command is the one .ci/run calls"


@pytest.mark.parametrize("block", [b for b in CHECKED if b.lang == "yaml" and "skip" not in b.options],
                         ids=lambda b: b.id)
def test_yaml_blocks_validate(block: Block, tmp_path: Path) -> None:
    path = tmp_path / "block.yaml"
    path.write_text(block.text)
    if block.options.get("kind") == "suite":
        from chaosproxy.drill.suite import load_suite
        load_suite(path)
    else:
        from chaosproxy.engine.scenario import load_scenario
        load_scenario(path)


@pytest.mark.parametrize("block", [b for b in CHECKED if b.lang == "json" and "skip" not in b.options],
                         ids=lambda b: b.id)
def test_json_blocks(block: Block, tmp_path: Path) -> None:
    if block.options.get("kind") == "log":
        _check_log_example(block, tmp_path)
        return
    json.loads(block.text)


def _check_log_example(block: Block, tmp_path: Path) -> None:
    """Every line of the example has exactly the keys real lines of its kind have."""
    example = _json_lines(block.text)
    shown = {line["event"]: line for line in example}
    real = _real_log(tmp_path, shown)
    same = ("rule", "fault", "component", "level", "transport", "route", "action", "outcome", "status", "faults",
            "params", "effect", "match_index", "perturbed_digest")
    for kind, line in shown.items():
        alike = [r for r in real if r["event"] == kind and set(r) == set(line)]
        assert alike, (f"{block.id}: no real {kind!r} line has the example's keys; example {sorted(line)}, "
                       f"real {[sorted(r) for r in real if r['event'] == kind]}")
        assert any(all(r[key] == line[key] for key in same if key in line) for r in alike), (
            f"{block.id}: the example's {kind!r} line differs from a real run's in {same}: {alike}")


def _json_lines(text: str) -> list[dict]:
    """The example's objects: one per JSON value, even when one is wrapped over several lines."""
    decoder, values, pos = json.JSONDecoder(), [], 0
    text = text.strip()
    while pos < len(text):
        value, end = decoder.raw_decode(text, pos)
        values.append(value)
        pos = end
        while pos < len(text) and text[pos].isspace():
            pos += 1
    return values


def _real_log(tmp_path: Path, shown: dict[str, dict]) -> list[dict]:
    """Run the proxy in front of the tool server and make the example's request."""
    fault = shown.get("fault", {})
    scenario = {"seed": fault.get("seed", 1), "rules": [{
        "name": fault.get("rule", "err"), "first": 1, "after": max(fault.get("match_index", 1) - 1, 0),
        "fault": {"type": fault.get("fault", "http_error"), **fault.get("params", {})}}]}
    path = shown.get("call", fault).get("path", "/api/weather")
    log = tmp_path / "log.jsonl"
    (tmp_path / "scenario.yaml").write_text(json.dumps(scenario))
    with _servers(tmp_path) as ports:
        proxy_port = free_port()
        proxy = _spawn([str(BIN / "chaosproxy"), "run", "--upstream", f"http://127.0.0.1:{ports['9000']}",
                        "--listen", f"127.0.0.1:{proxy_port}", "--scenario", str(tmp_path / "scenario.yaml"),
                        "--log", str(log)], tmp_path / "proxy.out")
        try:
            _wait_ports([proxy_port], proxy)
            import urllib.error
            import urllib.request
            for _ in range(scenario["rules"][0]["after"] + 1):
                with contextlib.suppress(urllib.error.HTTPError):
                    urllib.request.urlopen(f"http://127.0.0.1:{proxy_port}{path}", timeout=10).read()
        finally:
            _stop(proxy)
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


@pytest.mark.parametrize("block", [b for b in CHECKED if b.lang == "python"
                                   and not {"skip", "session"} & b.options.keys()], ids=lambda b: b.id)
def test_python_blocks(block: Block, tmp_path: Path) -> None:
    with _servers(tmp_path) as ports:
        source = _with_ports(block.text, ports)
        if block.options.get("kind") == "pytest":
            path = tmp_path / "test_readme_snippet.py"
            path.write_text(source)
            command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(path)]
        else:
            path = tmp_path / "snippet.py"
            path.write_text(source)
            command = [sys.executable, str(path)]
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120, env=_env())
    assert done.returncode == int(block.options.get("exit", 0)), done.stdout + done.stderr
    if block.options.get("kind") == "pytest":
        assert " passed" in done.stdout and "skipped" not in done.stdout, done.stdout


SESSIONS = sorted({b.session for b in BLOCKS if b.session is not None})


@pytest.mark.parametrize("session", SESSIONS)
def test_sh_sessions(session: str, tmp_path: Path) -> None:
    blocks = [b for b in BLOCKS if b.session == session and "skip" not in b.options]
    commands = [b for b in blocks if b.lang in ("sh", "python")]
    outputs = [b for b in blocks if b.lang == "text" and b.options.get("kind") == "output"]
    assert any(b.lang == "sh" for b in commands), f"session {session!r} has no sh block"
    with _servers(tmp_path, start=False) as ports:
        work = _work_folder(tmp_path)
        script = "\n".join(_script_line(b, _with_ports(b.text, ports), work) for b in commands)
        status, output = _run_script(script, work, tmp_path / "session.out")
        outputs = [Block(b.lang, _with_ports(b.text, ports), b.line, b.options, b.source) for b in outputs]
    expected = int(commands[-1].options.get("exit", 0))
    assert status == expected, f"session {session} exited {status}, expected {expected}:\n{output[-4000:]}"
    for block in outputs:
        _check_output(block, output)


@pytest.mark.parametrize("block", [b for b in CHECKED if "command" in b.options and "skip" not in b.options],
                         ids=lambda b: b.id)
def test_command_outputs(block: Block, tmp_path: Path) -> None:
    status, output = _run_script(block.options["command"], _work_folder(tmp_path), tmp_path / "command.out")
    assert status == 0, output[-4000:]
    _check_output(block, output)


def _check_output(block: Block, output: str) -> None:
    """Each line of the block appears in the output, in any order; `...` matches anything."""
    for wanted in filter(str.strip, block.text.splitlines()):
        pattern = ".*".join(re.escape(part.strip()) for part in re.split(r"\.\.\.|…", wanted))
        assert re.search(pattern, output), f"{block.id}: {wanted!r} not in the output:\n{output[-4000:]}"


def _work_folder(tmp_path: Path) -> Path:
    """A folder of its own for a session, seeing the repository's files."""
    work = tmp_path / "work"
    work.mkdir()
    for name in ("examples", "scenarios", "tests", "bench"):
        (work / name).symlink_to(ROOT / name)
    return work


def _script_line(block: Block, text: str, work: Path) -> str:
    """A session's block as script: an sh block as it is, a python block as a file run with python."""
    if block.lang == "sh":
        return text
    path = work / f"block_{block.line}.py"
    path.write_text(text)
    return f"python {path.name}"


def _run_script(script: str, work: Path, out: Path) -> tuple[int, str]:
    """Run a script in `work` (its temporary files too: the demo's log and report), bounded in time."""
    proc = _spawn(["bash", "-c", "set -eo pipefail\n" + script], out, cwd=work, temp=work)
    try:
        status = proc.wait(timeout=240)
    finally:
        _stop(proc)
    return status, out.read_text()


class _servers:
    """Free ports for the README's ports; with `start`, the bundled tool servers on the first two."""

    def __init__(self, tmp_path: Path, *, start: bool = True) -> None:
        self.tmp_path = tmp_path
        self.start = start
        self.procs: list[subprocess.Popen] = []

    def __enter__(self) -> dict[str, int]:
        ports = {port: free_port() for port in README_PORTS}
        if self.start:
            self.procs = [
                _spawn([sys.executable, "-m", "chaosproxy.demo.tool_server", "--port", str(ports["9000"])],
                       self.tmp_path / "tool_server.out"),
                _spawn([sys.executable, "-m", "chaosproxy.demo.mcp_server", "http", "--port", str(ports["9001"])],
                       self.tmp_path / "mcp_server.out")]
            for proc, port in zip(self.procs, (ports["9000"], ports["9001"]), strict=True):
                _wait_ports([port], proc)
        return ports

    def __exit__(self, *exc: object) -> None:
        for proc in self.procs:
            _stop(proc)


def _with_ports(text: str, ports: dict[str, int]) -> str:
    for readme_port, port in ports.items():
        text = re.sub(rf"(?<=[:= ]){readme_port}\b", str(port), text)
    return text


def _env(temp: Path | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHAOSPROXY_")}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = str(ROOT)
    if temp is not None:
        env["TMPDIR"] = str(temp)
    return env


def _spawn(command: list[str], out: Path, cwd: Path | None = None, temp: Path | None = None) -> subprocess.Popen:
    return subprocess.Popen(command, cwd=cwd or ROOT, env=_env(temp), stdout=out.open("w"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def _wait_ports(ports: list[int], proc: subprocess.Popen, timeout: float = 30) -> None:
    from tests.helpers.readme_wait import wait
    deadline = time.monotonic() + timeout
    for port in ports:
        assert wait(port, deadline, alive=lambda: proc.poll() is None), f"nothing listening on {port}"


def _stop(proc: subprocess.Popen) -> None:
    """The process and everything it started (its process group): SIGTERM, then SIGKILL."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)
