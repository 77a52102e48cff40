"""Hostile and broken scenarios: refused with a reason, never a traceback, never a frozen proxy.

Alias bombs, deep nesting, oversize documents, files named outside the scenario's folder (absolute,
`../`, through a symlink), a FIFO; over `validate`, `run --scenario`, PUT /scenario and drills.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from chaosproxy.engine.scenario import ScenarioError, load_scenario
from chaosproxy.records.logfile import read_events
from tests.helpers.support import free_port, wait_listening

PHRASES = "Search the web: Look things up online\n"
SECRET = "root:$6$hunter2-is-the-password:19000:0:99999:7:::"


def alias_bomb(levels: int = 9) -> str:
    text, previous = "a: &a [x, x, x, x, x, x, x, x, x, x]\n", "a"
    for name in "bcdefghijklmnop"[:levels - 1]:
        text += f"{name}: &{name} [" + ", ".join([f"*{previous}"] * 10) + "]\n"
        previous = name
    return text + "rules: []\n"


def deep(levels: int) -> str:
    return "rules:\n  - name: d\n    fault: {type: http_error}\n    description: " + "[" * levels + "]" * levels + "\n"


def paraphrase(mapping: str) -> str:
    return f"rules:\n  - name: p\n    fault: {{type: paraphrase_description, mapping: '{mapping}'}}\n"


def big(rules: int = 9000) -> str:
    return "rules:\n" + "".join(f"  - {{name: r{i}, match: {{path: /x{i}}}, fault: {{type: http_error}}}}\n"
                                for i in range(rules))


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """A scenario folder with a mapping beside it, and a secret file outside it."""
    (tmp_path / "scenarios").mkdir()
    (tmp_path / "scenarios" / "phrases.yaml").write_text(PHRASES)
    (tmp_path / "secret").write_text(SECRET + "\n")
    return tmp_path / "scenarios"


def validate(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "chaosproxy", "validate", *args], capture_output=True, text=True,
                          timeout=60, cwd=cwd)


@pytest.mark.parametrize("name,text,reason", [
    ("bomb", alias_bomb(), "aliases expand this document past 100000 nodes"),
    ("deep-flow", "rules: " + "[" * 5000 + "]" * 5000 + "\n", "nesting depth"),
    ("deep-block", "rules:\n" + "- " * 3000 + "x\n", "nesting depth"),
    ("deep-value", deep(200), "nested deeper than 64 levels"),
    ("huge", big(), "more than the 256 KiB"),
    ("recursive", "rules: &r [*r]\n", "an alias refers to a node that contains it"),
])
@pytest.mark.slow
def test_validate_refuses_hostile_yaml_with_exit_2_and_a_reason(tmp_path: Path, name: str, text: str, reason: str):
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    started = time.monotonic()
    done = validate(str(path))
    assert (done.returncode, done.stdout) == (2, ""), done.stderr
    assert reason in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert time.monotonic() - started < 20


def test_the_duplicate_key_check_visits_each_aliased_node_once(tmp_path: Path):
    path = tmp_path / "aliases.yaml"  # 10,000 nodes expanded: under the cap, checked in a blink
    path.write_text(alias_bomb(4).replace("rules: []", "rules: []\nrules: []"))
    started = time.perf_counter()
    with pytest.raises(ScenarioError) as caught:
        load_scenario(path)
    assert time.perf_counter() - started < 1
    assert caught.value.problems == [f"{path}:6: duplicate key 'rules' (first on line 5)"]


@pytest.mark.slow
@pytest.mark.parametrize("mapping", ["{secret}", "../secret", "link/secret"])
def test_a_scenario_names_only_files_under_its_own_folder(folder: Path, mapping: str):
    (folder / "link").symlink_to(folder.parent)  # inside the folder by name, outside once resolved
    path = folder / "s.yaml"
    path.write_text(paraphrase(mapping.format(secret=folder.parent / "secret")))
    done = validate(str(path))
    assert done.returncode == 2
    assert "is outside the folders a scenario may read from" in done.stderr, done.stderr
    assert "hunter2" not in done.stderr
    allowed = validate("--scenario-dir", str(folder.parent), str(path))
    assert "is outside" not in allowed.stderr  # named by --scenario-dir it may be read (and is no mapping)
    assert allowed.returncode == 2 and "hunter2" not in allowed.stderr, allowed.stderr


@pytest.mark.slow
def test_errors_about_a_named_file_never_quote_it(folder: Path):
    (folder / "secret.yaml").write_text(f"'{SECRET}': [1]\n'{SECRET}2': {{a: b}}\n")
    (folder / "broken.yaml").write_text(f"{SECRET}: [unclosed\n")
    for name in ("secret.yaml", "broken.yaml"):
        (folder / "s.yaml").write_text(paraphrase(name))
        done = validate(str(folder / "s.yaml"))
        assert done.returncode == 2 and re.search(r"line [12]: ", done.stderr), done.stderr
        assert "hunter2" not in done.stderr and "99999" not in done.stderr


@pytest.mark.slow
def test_a_fifo_is_refused_at_once(folder: Path):
    os.mkfifo(folder / "fifo")
    (folder / "s.yaml").write_text(paraphrase("fifo"))
    done = validate(str(folder / "s.yaml"))
    assert done.returncode == 2 and "is not a regular file" in done.stderr, done.stderr
    done = validate(str(folder / "fifo"))
    assert done.returncode == 2 and "is not a regular file" in done.stderr, done.stderr


@pytest.mark.slow
def test_a_relative_mapping_is_the_scenario_folders_not_the_working_directorys(folder: Path, tmp_path: Path):
    (folder / "s.yaml").write_text(paraphrase("phrases.yaml"))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = validate(str(folder / "s.yaml"), cwd=elsewhere)
    assert done.returncode == 0, done.stderr


@pytest.mark.slow
def test_a_drill_run_finds_a_relative_mapping_beside_the_original_scenario(folder: Path, tmp_path: Path,
                                                                          upstream: str):
    (folder / "s.yaml").write_text(paraphrase("phrases.yaml"))
    out = tmp_path / "drill"
    done = subprocess.run([sys.executable, "-m", "chaosproxy", "drill", "--agent", f"{sys.executable} -c pass",
                           "--upstream", upstream, "--scenario", str(folder / "s.yaml"), "--baseline", "1",
                           "--timeout", "30", "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    clean, run = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert (clean["status"], run["status"]) == ("passed", "passed"), run
    assert next(read_events(out / "run-2" / "log.jsonl"))["rules"] == ["p"]


# --- PUT /scenario against a running `chaosproxy run` ----------------------------------------------

class Proxy:
    def __init__(self, port: int, control: int) -> None:
        self.port, self.control = port, control

    def request(self, method: str, path: str, body: str | None = None, *, control: bool = False,
                timeout: float = 30) -> tuple[int, bytes, float]:
        started = time.monotonic()
        conn = http.client.HTTPConnection("127.0.0.1", self.control if control else self.port, timeout=timeout)
        try:
            conn.request(method, path, body=body.encode() if body is not None else None)
            response = conn.getresponse()
            return response.status, response.read(), time.monotonic() - started
        finally:
            conn.close()


@pytest.fixture
def running(folder: Path, upstream: str, tmp_path: Path) -> Iterator[Proxy]:
    scenario = folder / "start.yaml"
    scenario.write_text(paraphrase("phrases.yaml"))
    port, control = free_port(), free_port()
    proc = subprocess.Popen([sys.executable, "-m", "chaosproxy", "run", "--upstream", upstream, "--scenario",
                             str(scenario), "--listen", f"127.0.0.1:{port}", "--control", f"127.0.0.1:{control}",
                             "--log", str(tmp_path / "log.jsonl")], stderr=subprocess.PIPE)
    try:
        wait_listening(port, proc)
        wait_listening(control, proc)
        yield Proxy(port, control)
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.mark.slow
def test_hostile_puts_are_refused_with_reasons_while_the_proxy_keeps_answering(running: Proxy, folder: Path):
    os.mkfifo(folder / "fifo")
    hostile = [(alias_bomb(), 400, "aliases expand"), (deep(3000), 400, "nesting"),
               (deep(100), 400, "nested deeper than 64"), (big(), 413, "at most 256 KiB"),
               (paraphrase(str(folder.parent / "secret")), 400, "is outside the folders"),
               (paraphrase("../secret"), 400, "is outside the folders"), (paraphrase("fifo"), 400, "not a regular"),
               ("rules: &r [*r]\n", 400, "contains it")] * 3
    answers: list[tuple[int, bytes]] = []

    def put_all() -> None:
        for text, _, _ in hostile:
            status, body, _ = running.request("PUT", "/scenario", text, control=True)
            answers.append((status, body))

    sender = threading.Thread(target=put_all)
    sender.start()
    slowest = 0.0
    while sender.is_alive():
        for path, control in (("/api/weather?city=oslo", False), ("/healthz", True)):
            status, _, took = running.request("GET", path, control=control, timeout=5)
            assert status == 200
            slowest = max(slowest, took)
    sender.join()
    assert slowest < 1.0, slowest
    for (status, body), (_, expected, reason) in zip(answers, hostile, strict=True):
        assert status == expected and reason in body.decode() and b"hunter2" not in body, body[:300]
    status, body, _ = running.request("GET", "/scenario", control=True)
    assert json.loads(body)["rules"][0]["name"] == "p"  # the start-up scenario stayed in force
    assert running.request("PUT", "/scenario", paraphrase("phrases.yaml"), control=True)[0] == 200
