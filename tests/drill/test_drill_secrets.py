"""A drill's folder and a comparison of drills show the upstream as the proxy shows URLs: no userinfo and
no signed-URL value in any file or output, whatever the drill was given. A replay of such a run is given
the upstream again (the folder does not keep its secret)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.drill.test_drill import CHAOSPROXY, ENV_AGENT, drill, python, write

pytestmark = pytest.mark.slow  # drills
SECRET, OTHER_SECRET, SIGNATURE = "s3cr3t-pass", "0ther-s3cr3t", "sig-abcdef"


def with_userinfo(upstream: str, password: str) -> str:
    return upstream.replace("http://", f"http://agent:{password}@") + "/api"


def secrets_in(folder: Path, *outputs: str) -> list[str]:
    """Where the secrets turn up: each file under `folder` (by path) and each output (by index)."""
    found = [str(path) for path in folder.rglob("*") if path.is_file() and any(
        secret.encode() in path.read_bytes() for secret in (SECRET, OTHER_SECRET, SIGNATURE))]
    return found + [f"output {i}" for i, text in enumerate(outputs)
                    if any(secret in text for secret in (SECRET, OTHER_SECRET, SIGNATURE))]


def run_drill(upstream: str, out: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    agent = write(tmp_path / "agent.py", ENV_AGENT)
    slow = write(tmp_path / "slow.yaml", "rules: [{name: slow, fault: {type: latency, delay_ms: 5}}]\n")
    done = drill("--agent", python(agent), "--upstream", upstream, "--scenario", str(slow), "--baseline", "1",
                 "--timeout", "30", "--seed", "3", "--out", str(out))
    assert done.returncode == 0, done.stderr
    return done


def test_a_drill_keeps_no_secret_of_its_upstream_and_its_replay_asks_for_it(upstream: str, tmp_path: Path) -> None:
    secret_upstream = with_userinfo(upstream, SECRET)
    out = tmp_path / "drill"
    done = run_drill(secret_upstream, out, tmp_path)
    assert json.loads((out / "drill.json").read_text())["config"]["upstream"] == \
        upstream.replace("http://", "http://REDACTED:REDACTED@") + "/api"
    assert json.loads((out / "run-1" / "run.json").read_text())["upstream"].startswith("http://REDACTED:REDACTED@")
    refused = drill("--replay", str(out / "run-2"))
    assert refused.returncode == 2 and "give it again with --upstream" in refused.stderr, refused.stderr
    replayed = drill("--replay", str(out / "run-2"), "--upstream", secret_upstream)
    assert replayed.returncode == 0 and "passed (the original run: passed)" in replayed.stdout, replayed.stderr
    assert secrets_in(out, done.stdout, done.stderr, refused.stdout, refused.stderr, replayed.stdout,
                      replayed.stderr) == []


def test_a_comparison_shows_no_secret_of_either_drills_upstream(upstream: str, tmp_path: Path) -> None:
    base, new = tmp_path / "base", tmp_path / "new"
    run_drill(with_userinfo(upstream, SECRET), base, tmp_path)
    run_drill(with_userinfo(upstream, OTHER_SECRET), new, tmp_path)
    settings = json.loads((new / "drill.json").read_text())  # as a drill written before they were redacted
    settings["config"]["upstream"] = with_userinfo(upstream, OTHER_SECRET) + f"?X-Amz-Signature={SIGNATURE}"
    (new / "drill.json").write_text(json.dumps(settings))
    compared = subprocess.run([*CHAOSPROXY, "report", str(base), str(new), "--json", str(tmp_path / "c.json"),
                               "--md", str(tmp_path / "c.md")], capture_output=True, text=True, timeout=120)
    assert compared.returncode == 0, compared.stderr
    [differ] = json.loads((tmp_path / "c.json").read_text())["settings_differ"]
    assert differ["setting"] == "upstream" and "X-Amz-Signature=REDACTED" in differ["new"]
    assert "REDACTED:REDACTED@" in differ["base"] and "REDACTED:REDACTED@" in differ["new"]
    assert secrets_in(base, compared.stdout, compared.stderr, (tmp_path / "c.md").read_text(),
                      (tmp_path / "c.json").read_text()) == []
