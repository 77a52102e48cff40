"""Drills on a Ray cluster: a real two-node cluster on loopback (a head and a worker node, started by the
test and ended by their process groups), the same results as the local executor, and no run lost when a
worker dies mid-drill."""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from chaosproxy.drill.config import DrillConfig
from chaosproxy.drill.plan import RunSpec
from tests.helpers.otlp import Receiver
from tests.helpers.support import ServerLoop, free_port

pytest.importorskip("ray")

CHAOSPROXY = [sys.executable, "-m", "chaosproxy"]
RAY = str(Path(sys.executable).parent / "ray")
SUITE = """\
pick: 1
rules:
  - name: flaky
    match: {path: /api/weather}
    probability: !range [0.2, 0.6]
    fault: {type: http_error, status: 503}
  - name: slow
    match: {path: /api/weather}
    fault: {type: latency, delay_ms: !range [1, 5]}
"""
# argv: a folder to leave a marker in (named run, the pid of the process that started it, its own pid; holding
# the proxy's URL), and how long to wait before the calls, so a test can see which Ray worker carries out
# which run, and with which proxy.
AGENT = """
import os, pathlib, sys, time, urllib.error, urllib.request
run = os.path.basename(os.environ["CHAOSPROXY_RUN"])
(pathlib.Path(sys.argv[1]) / f"{run}-{os.getppid()}-{os.getpid()}").write_text(os.environ["CHAOSPROXY_URL"])
time.sleep(float(sys.argv[2]))
for city in ("lima", "oslo", "pune"):
    try:
        urllib.request.urlopen(os.environ["CHAOSPROXY_URL"] + "/api/weather?city=" + city, timeout=10).read()
    except urllib.error.HTTPError:
        sys.exit(1)
"""
# The test's cluster wants this token from every node and driver (Ray's dashboard and job API have none).
RAY_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
# Loopback addresses Ray takes as they are (it swaps 127.0.0.1 for a routable one in a multi-node cluster).
HEAD_IP, WORKER_IP = "127.0.0.2", "127.0.0.3"
RUN_FILES = {"scenario.yaml", "log.jsonl", "agent.stdout", "agent.stderr", "proxy.stderr", "run.json"}


def _start_node(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    """`ray start ... --block` in its own process group, once it says the node runs."""
    with open(log, "wb") as out:
        node = subprocess.Popen(
            [RAY, "start", *args, "--num-cpus=1", "--disable-usage-stats", "--block"],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, **RAY_ENV},
        )
    deadline = time.monotonic() + 90
    while b"Ray runtime started" not in log.read_bytes():
        assert node.poll() is None and time.monotonic() < deadline, log.read_text(errors="replace")[-2000:]
        time.sleep(0.2)
    return node


def _stop_node(node: subprocess.Popen[bytes]) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(node.pid, sig)
        except ProcessLookupError:
            return
        try:
            node.wait(10)
        except subprocess.TimeoutExpired:
            continue
        time.sleep(1)  # the group's other processes (raylet, workers) go after the leader


@pytest.fixture(scope="module")
def cluster() -> Iterator[str]:
    """A head node and a worker node on loopback, one CPU each; yields the head's address."""
    temp = Path(tempfile.mkdtemp(prefix="cpray-"))  # short: Ray's socket paths live under it
    port = free_port()
    head = _start_node(
        [
            "--head",
            f"--node-ip-address={HEAD_IP}",
            f"--port={port}",
            "--include-dashboard=false",
            f"--temp-dir={temp}",
        ],
        temp / "head.log",
    )
    nodes = [head]
    try:
        nodes.append(
            _start_node(
                [f"--address={HEAD_IP}:{port}", f"--node-ip-address={WORKER_IP}"], temp / "worker.log"
            )
        )
        yield f"{HEAD_IP}:{port}"
    finally:
        for node in reversed(nodes):
            _stop_node(node)
        shutil.rmtree(temp, ignore_errors=True)


@pytest.fixture
def drill_file(tmp_path: Path, upstream: str) -> Path:
    (tmp_path / "suite.yaml").write_text(SUITE)
    (tmp_path / "agent.py").write_text(AGENT)
    (tmp_path / "markers").mkdir()
    drill = tmp_path / "drill.yaml"
    drill.write_text(
        f"agent: {sys.executable} {tmp_path / 'agent.py'} {tmp_path / 'markers'} 0\n"
        f"upstream: {upstream}\nsuite: {tmp_path / 'suite.yaml'}\nrandomize: 4\nrepeat: 2\n"
        "baseline: 2\nseed: 12\ntimeout: 60\njobs: 2\n"
    )
    return drill


def drill(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CHAOSPROXY, "drill", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **RAY_ENV},
    )


def results(folder: Path) -> list[dict[str, Any]]:
    lines = (folder / "results.jsonl").read_text().splitlines()
    return sorted((json.loads(line) for line in lines), key=lambda r: int(r["run"].split("-")[1]))


def outcome(folder: Path) -> list[tuple[Any, ...]]:
    return [
        (r["run"], r["label"], r["seed"], r["status"], r["exit_code"], r["faults"]) for r in results(folder)
    ]


@pytest.mark.timeout(900)
def test_a_drill_on_a_ray_cluster_gives_the_local_executors_results(
    cluster: str, drill_file: Path, tmp_path: Path
) -> None:
    local = drill(str(drill_file), "--out", str(tmp_path / "local"))
    assert local.returncode == 0, local.stderr
    on_ray = drill(
        str(drill_file),
        "--executor",
        "ray",
        "--ray-address",
        cluster,
        "--ray-num-cpus",
        "0.5",
        "--out",
        str(tmp_path / "ray"),
    )
    assert on_ray.returncode == 0, on_ray.stderr
    assert outcome(tmp_path / "ray") == outcome(tmp_path / "local")
    assert {status for *_, status, _, _ in outcome(tmp_path / "local")} == {"passed", "failed"}
    progress = [line for line in on_ray.stderr.splitlines() if line.startswith("drill: ")]
    assert len(progress) == 10 and progress[-1].startswith("drill: 10/10 runs (")
    assert on_ray.stdout.split("\n\n")[0] == local.stdout.split("\n\n")[0]  # the same summary
    for run in ("run-1", "run-10"):
        assert {p.name for p in (tmp_path / "ray" / run).iterdir()} == RUN_FILES
    parents = {marker.name.split("-")[2] for marker in (tmp_path / "markers").iterdir()}
    assert len(parents) >= 3  # local runs' drill process, and Ray workers on both nodes


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _processes_mentioning(text: str) -> list[int]:
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and text in (proc / "cmdline").read_bytes().decode(errors="replace"):
                pids.append(int(proc.name))
        except OSError:
            continue
    return [pid for pid in pids if _alive(pid)]


@pytest.mark.timeout(900)
def test_killing_a_ray_worker_mid_drill_loses_no_run(cluster: str, drill_file: Path, tmp_path: Path) -> None:
    markers, out = tmp_path / "markers", tmp_path / "ray"
    drill_file.write_text(drill_file.read_text().replace(f"{markers} 0", f"{markers} 1.5"))
    proc = subprocess.Popen(
        [
            *CHAOSPROXY,
            "drill",
            str(drill_file),
            "--executor",
            "ray",
            "--ray-address",
            cluster,
            "--out",
            str(out),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **RAY_ENV},
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not (started := sorted(markers.iterdir())):
            assert proc.poll() is None and time.monotonic() < deadline, "no run started"
            time.sleep(0.05)
        victim_run, worker, agent = re.fullmatch(r"(run-\d+)-(\d+)-(\d+)", started[0].name).groups()  # type: ignore[union-attr]
        os.kill(int(worker), signal.SIGKILL)  # a Ray worker process of the test's own cluster
        stdout, stderr = proc.communicate(timeout=400)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    assert proc.returncode == 0, stderr
    runs = results(out)
    assert [r["run"] for r in runs] == [f"run-{n}" for n in range(1, 11)]
    assert all(r["status"] in ("passed", "failed") for r in runs), [r for r in runs if r["status"] == "error"]
    tries = [m.name for m in markers.iterdir() if m.name.startswith(f"{victim_run}-")]
    assert len(tries) >= 2, tries  # the lost run was carried out again
    assert not _alive(int(agent))  # the lost try's agent died with its worker
    assert _processes_mentioning(str(out)) == []
    proxy = urllib.parse.urlsplit(started[0].read_text())  # and its proxy (forked by the worker's launcher)
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((proxy.hostname, proxy.port), timeout=5).close()


@pytest.fixture
def worker() -> Iterator[Any]:
    """This process as a Ray worker carrying out runs (carry_out), its proxy launcher closed after."""
    from chaosproxy.drill.ray_executor import _Worker

    yield _Worker
    if _Worker.launcher is not None and _Worker.loop is not None:
        _Worker.loop.run_until_complete(_Worker.launcher.close())
        _Worker.launcher = None


@pytest.fixture
def run_config(upstream: str, tmp_path: Path) -> DrillConfig:
    """The settings a Ray task gets: the marking agent, against the test's upstream."""
    (tmp_path / "markers").mkdir()
    (tmp_path / "agent.py").write_text(AGENT)
    return DrillConfig(
        agent=f"{sys.executable} {tmp_path / 'agent.py'} {tmp_path / 'markers'} 0", upstream=upstream, timeout=30
    )


def test_a_ray_worker_forks_the_proxies_of_all_its_runs_from_one_warm_launcher(
    run_config: DrillConfig, tmp_path: Path, worker: Any
) -> None:
    from chaosproxy.drill.ray_executor import carry_out

    launchers = []
    for n in (1, 2):
        spec = RunSpec(f"run-{n}", "clean", "clean", "rules: []\n", n)
        result, _ = carry_out(spec, run_config, str(tmp_path / "drill" / spec.name), "0" * 64, str(tmp_path), 12)
        assert result.status == "passed"
        assert worker.launcher is not None and worker.launcher.proc.returncode is None
        launchers.append(worker.launcher.proc.pid)
    assert launchers[0] == launchers[1]  # one launcher for the worker's runs
    assert worker.launcher.next_id == 3  # which forked both runs' proxies (after its hello)
    os.kill(launchers[0], signal.SIGKILL)  # a launcher lost: no run is, and the worker starts another
    for n in (3, 4):
        spec = RunSpec(f"run-{n}", "clean", "clean", "rules: []\n", n)
        result, _ = carry_out(spec, run_config, str(tmp_path / "drill" / spec.name), "0" * 64, str(tmp_path), 12)
        assert result.status == "passed", (tmp_path / "drill" / spec.name / "proxy.stderr").read_text()
    assert worker.launcher is not None and worker.launcher.proc.pid != launchers[0]


def test_a_node_that_cannot_see_the_drill_folder_sends_the_run_folder_back(
    run_config: DrillConfig, tmp_path: Path, worker: Any
) -> None:
    from chaosproxy.drill.ray_executor import carry_out

    spec = RunSpec("run-3", "clean", "clean", "rules: []\n", 77)
    result, files = carry_out(spec, run_config, str(tmp_path / "elsewhere" / "run-3"), "0" * 64, str(tmp_path), 12)
    assert (result.run, result.status, result.seed) == ("run-3", "passed", 77)
    assert files is not None and set(files) == RUN_FILES
    assert files["scenario.yaml"] == b"rules: []\n" and json.loads(files["run.json"])["seed"] == 77
    assert not (tmp_path / "elsewhere").exists()


@pytest.mark.timeout(900)
def test_runs_on_ray_get_their_root_spans_like_local_runs(
    cluster: str, drill_file: Path, tmp_path: Path, server_loop: ServerLoop
) -> None:
    """The driver's OTEL_* variables reach the tasks: each run's root span, its proxy's call spans in
    the run's trace, exported from the node that carried it out to a real OTLP receiver."""
    receiver = Receiver()
    server_loop.run(receiver.start())
    try:
        drill_file.write_text(drill_file.read_text().replace("randomize: 4\nrepeat: 2\n", "randomize: 1\n"))
        on_ray = subprocess.run(
            [*CHAOSPROXY, "drill", str(drill_file), "--executor", "ray", "--ray-address", cluster,
             "--ray-num-cpus", "0.5", "--out", str(tmp_path / "ray")],
            capture_output=True, text=True, timeout=600,
            env={**os.environ, **RAY_ENV, "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
                 "OTEL_BSP_SCHEDULE_DELAY": "100"},
        )
        assert on_ray.returncode == 0, on_ray.stderr
        ran = results(tmp_path / "ray")
        assert len(ran) == 3 and all(r["trace_id"] for r in ran)
        spans = receiver.wait_for(lambda spans: sum(s.name.startswith("chaosproxy.drill") for s in spans) == 3
                                  and sum(s.name == "GET" for s in spans) >= 9, timeout=60)
    finally:
        server_loop.run(receiver.stop())
    for result in ran:
        [root] = [s for s in spans if s.name == f"chaosproxy.drill {result['run']}"]
        assert (root.trace_id, root.parent_id, root.kind) == (result["trace_id"], "", "INTERNAL")
        assert root.attributes["chaosproxy.run.status"] == result["status"]
        assert root.resource["chaosproxy.run_id"] == "ray" and root.resource["chaosproxy.seed"] == 12
        calls = [s for s in spans if s.name == "GET" and s.trace_id == root.trace_id]
        assert len(calls) == 3 and all(call.parent_id == root.span_id for call in calls)
