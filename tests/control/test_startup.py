"""What a proxy loads on its way to listening: only the faults its scenario names, none of the optional parts.

A drill starts a proxy per run, so start-up is paid on every run. The time itself is measured in
bench/startup.py; these tests keep the causes away: importing every fault (and building all their
pydantic models), the control API's HTTP stack, or an optional extra the command does not use.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from chaosproxy.faults import TYPES, Fault, base
from chaosproxy.faults.base import register

ROOT = Path(__file__).resolve().parents[2]
NOT_ON_THE_WAY_TO_LISTENING = ("aiohttp", "prometheus_client", "ray", "mitmproxy", "opentelemetry",
                               "chaosproxy.control.api", "chaosproxy.drill.runner", "chaosproxy.report.compare")


# `chaosproxy ARGV...` as a user runs it, noting which modules it has when it says it listens (importlib's
# imports, as the fault registry's, show neither in -X importtime nor in audit hooks).
NOTE_MODULES = """
import runpy, sys
NOTES = sys.argv[1]
class Stderr:
    def __init__(self, real):
        self.real = real
    def write(self, text):
        if "listening on" in text:
            with open(NOTES, "w") as out:
                out.write("\\n".join(sorted(sys.modules)))
        return self.real.write(text)
    def __getattr__(self, name):
        return getattr(self.real, name)
sys.stderr = Stderr(sys.stderr)
sys.argv = ["chaosproxy", *sys.argv[2:]]
runpy.run_module("chaosproxy", run_name="__main__", alter_sys=True)
"""


def imported_until_listening(*argv: str, tmp_path: Path) -> set[str]:
    """The modules a real `chaosproxy ARGV...` had imported when it said it listens."""
    modules = tmp_path / "modules.txt"
    proc = subprocess.Popen([sys.executable, "-c", NOTE_MODULES, str(modules), *argv],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=ROOT)
    try:
        deadline = time.monotonic() + 60
        while not modules.exists():
            assert proc.poll() is None, proc.communicate()[1].decode(errors="replace")[-2000:]
            assert time.monotonic() < deadline, "the proxy did not start within 60 s"
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=10)
    return set(modules.read_text().split())


@pytest.mark.slow
def test_run_loads_only_its_scenario_faults_and_no_optional_part(tmp_path: Path):
    scenario = tmp_path / "scenario.yaml"
    scenario.write_text("rules:\n  - {name: slow, fault: {type: latency, delay_ms: 5}}\n"
                        "  - {name: down, fault: {type: http_error, status: 503}}\n")
    modules = imported_until_listening("run", "--upstream", "http://127.0.0.1:9", "--listen", "127.0.0.1:0",
                                       "--scenario", str(scenario), "--log", str(tmp_path / "log.jsonl"),
                                       tmp_path=tmp_path)
    assert "chaosproxy.adapters.http" in modules  # the listing is the proxy's real one
    faults = {name.rsplit(".", 1)[1] for name in modules if name.startswith("chaosproxy.faults.")}
    assert faults & TYPES == {"latency", "http_error"}
    loaded = sorted(name for name in modules if name.split(".")[0] in NOT_ON_THE_WAY_TO_LISTENING
                    or name in NOT_ON_THE_WAY_TO_LISTENING)
    assert loaded == []


@pytest.mark.slow
def test_the_registry_still_lists_every_fault():
    code = ("import sys\nfrom chaosproxy.faults import REGISTRY\n"
            "print(len(REGISTRY), sum(m.startswith('chaosproxy.faults.') for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code],
                         capture_output=True, text=True, check=True, cwd=ROOT)
    registered, modules = map(int, out.stdout.split())
    assert registered == len(TYPES) >= 30
    assert modules > registered  # every fault's module, plus base and the shared helpers


def test_a_fault_outside_its_own_module_is_refused():
    """The registry finds a type by its module's name, so a fault elsewhere could never be loaded."""
    with pytest.raises(ValueError, match=r"chaosproxy/faults/misplaced\.py"):
        @register
        class Misplaced(Fault):  # defined here, in tests/, not in chaosproxy/faults/misplaced.py
            type: str = "misplaced"
    assert "misplaced" not in base.REGISTRY
