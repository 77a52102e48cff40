"""The CI and Kubernetes examples: their YAML parsed and checked, and the commands they run carried out here
against the bundled MCP server, as the pipelines would run them (the tool server at 127.0.0.1)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import pytest
import yaml

from tests.helpers.mcp_support import serve

ROOT = Path(__file__).resolve().parents[2]
CI = ROOT / "examples" / "ci"
BIN = str(Path(sys.executable).parent)
# Steps that install, or talk to the forge's own API: not ours to run here.
FORGE_STEPS = ("pip install", "gh pr comment")


@pytest.fixture(scope="module")
def tools() -> Iterator[str]:
    with serve("http") as url:
        yield f"{url}/mcp"


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """A checkout as the pipeline sees it: the agent's examples and the suites, nothing else."""
    for name in ("examples", "scenarios"):
        (tmp_path / name).symlink_to(ROOT / name)
    return tmp_path


def sh(command: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-eo", "pipefail", "-c", command],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", **env},
    )


@pytest.mark.timeout(900)
def test_the_github_workflow_drills_reports_summarises_and_gates(tools: str, workdir: Path) -> None:
    workflow = yaml.safe_load((CI / "github-actions.yaml").read_text())
    assert workflow[True] == "pull_request"  # YAML 1.1 reads the key `on` as true
    job = workflow["jobs"]["drill"]
    assert job["services"]["tools"]["ports"] == ["9001:9001"] and job["env"]["TOOLS_URL"].startswith(
        "http://127.0.0.1:9001/"
    )
    steps = {step.get("name", step.get("uses")): step for step in job["steps"]}
    upload = steps["Upload the report"]
    assert upload["uses"].startswith("actions/upload-artifact@") and upload["if"] == "always()"
    assert "chaos-report.html" in upload["with"]["path"]
    assert "--fail-under" in steps["Gate"]["run"] and "if" not in steps["Gate"]
    summary = workdir / "summary.md"
    env = {**job["env"], "TOOLS_URL": tools, "GITHUB_STEP_SUMMARY": str(summary)}
    ran = []
    for name, step in steps.items():
        command = step.get("run")
        if command is None or command.startswith(FORGE_STEPS):
            continue
        done = sh(command, workdir, env)
        assert done.returncode == 0, (name, done.stderr[-3000:])
        ran.append(name)
    assert ran == ["Drill", "Report", "Summary", "Gate"]
    assert summary.read_text().startswith("# chaosproxy robustness report")
    report = json.loads((workdir / "chaos-report.json").read_text())
    assert report["drill"]["seed"] == 2026 and report["profile"]["runs"] == 13
    assert "<svg" in (workdir / "chaos-report.html").read_text()


class _Notes(BaseHTTPRequestHandler):
    """GitLab's merge request notes endpoint, as far as the pipeline's curl uses it."""

    received: list[tuple[str, str, str]] = []

    def do_POST(self) -> None:  # noqa: N802 (the handler's name is http.server's)
        length = int(self.headers["Content-Length"])
        body = parse_qs(self.rfile.read(length).decode())["body"][0]
        self.received.append((self.path, self.headers["PRIVATE-TOKEN"], body))
        self.send_response(201)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b'{"id": 1}')

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.mark.timeout(900)
def test_the_gitlab_job_drills_reports_gates_and_notes_the_merge_request(tools: str, workdir: Path) -> None:
    if shutil.which("curl") is None:
        pytest.skip("curl is not installed")
    job = yaml.safe_load((CI / "gitlab-ci.yaml").read_text())["agent-robustness"]
    assert job["rules"] == [{"if": '$CI_PIPELINE_SOURCE == "merge_request_event"'}]
    assert job["services"] == [{"name": "$TOOL_SERVER_IMAGE", "alias": "tools"}]
    assert job["artifacts"]["when"] == "always" and "chaos-report.html" in job["artifacts"]["paths"]
    assert job["before_script"] == ["pip install -r requirements.txt"]
    env = {**job["variables"], "TOOLS_URL": tools}
    for command in job["script"]:
        done = sh(command, workdir, env)
        assert done.returncode == 0, (command, done.stderr[-3000:])
    assert (workdir / "chaos-report.md").read_text().startswith("# chaosproxy robustness report")
    server = HTTPServer(("127.0.0.1", 0), _Notes)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        forge = {
            "CI_API_V4_URL": f"http://127.0.0.1:{server.server_port}/api/v4",
            "CI_PROJECT_ID": "7",
            "CI_MERGE_REQUEST_IID": "12",
        }
        [after] = job["after_script"]
        assert sh(after, workdir, {**env, **forge, "CHAOS_REPORT_TOKEN": ""}).returncode == 0
        assert _Notes.received == []  # no token: no note
        done = sh(after, workdir, {**env, **forge, "CHAOS_REPORT_TOKEN": "glpat-test"})
        assert done.returncode == 0, done.stderr
    finally:
        server.shutdown()
        server.server_close()
    [(path, token, body)] = _Notes.received
    assert (path, token) == ("/api/v4/projects/7/merge_requests/12/notes", "glpat-test")
    assert body == (workdir / "chaos-report.md").read_text()


@pytest.mark.timeout(900)
def test_the_kubernetes_indexed_job_shards_merge_into_one_drill(tools: str, workdir: Path) -> None:
    config_map, job, claim = yaml.safe_load_all(
        (ROOT / "examples" / "kubernetes-indexed-job.yaml").read_text()
    )
    [report_pod] = yaml.safe_load_all((ROOT / "examples" / "kubernetes-drill-report.yaml").read_text())
    spec = job["spec"]
    assert (spec["completionMode"], spec["completions"], spec["parallelism"]) == ("Indexed", 4, 4)
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    [container] = spec["template"]["spec"]["containers"]
    [command] = container["args"]
    assert '--shard "$JOB_COMPLETION_INDEX/4"' in command
    # The pods' files here: the ConfigMap in etc/, the shared volume in drills/, a smaller plan (flags win).
    etc, volume = workdir / "etc", workdir / "drills"
    etc.mkdir()
    for name, text in config_map["data"].items():
        (etc / name).write_text(text.replace("/etc/drill", str(etc)))
    drill = yaml.safe_load((etc / "drill.yaml").read_text())
    assert drill["seed"] is not None and drill["suite"] == f"{etc}/suite.yaml"
    here = {"/etc/drill": str(etc), "/drills": str(volume)}

    def local(text: str) -> str:
        for pod_path, path in here.items():
            text = text.replace(pod_path, path)
        return text

    shard_command = local(command).replace(
        "drill.yaml",
        f"drill.yaml --agent 'python examples/agent_retry.py' --upstream {tools} "
        "--randomize 3 --repeat 1 --baseline 2",
    )
    pods = [
        subprocess.Popen(
            ["sh", "-c", shard_command],
            cwd=workdir,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", "JOB_COMPLETION_INDEX": str(index)},
        )
        for index in range(4)
    ]
    for pod in pods:
        _, stderr = pod.communicate(timeout=600)
        assert pod.returncode == 0, stderr[-3000:]
    [merge_and_report] = report_pod["spec"]["containers"][0]["args"]
    done = sh(local(merge_and_report), workdir, {})
    assert done.returncode == 0, done.stderr[-3000:]
    lines = (volume / "all" / "results.jsonl").read_text().splitlines()
    assert [json.loads(line)["run"] for line in lines] == [f"run-{n}" for n in range(1, 6)]
    assert (volume / "report.html").is_file() and (volume / "report.md").is_file()
