"""A fault on the MCP handshake inside an Inspect eval: the sample goes on without that server's tools and
is scored (the model answers without them), the transcript naming the fault; a real failure of the
handshake, with no fault behind it, is still the sample's error, as Inspect makes it."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

pytest.importorskip("inspect_ai", reason="the Inspect integration needs inspect-ai (pip install 'chaosproxy[inspect]')")

from inspect_ai import eval  # noqa: E402

from chaosproxy.harness import ChaosPlan  # noqa: E402
from tests.harness.test_inspect_harness import bench, chaos, mcp_url  # noqa: E402,F401  (a fixture)

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]  # Inspect evals
DOWN = "rules:\n  - name: down\n    match: {method: initialize}\n    fault: {type: http_error, status: 503}\n"


def run(plan: ChaosPlan, url: str, tmp_path: Path):
    [log] = eval(bench.benchmark_task(plan, url=url, samples=2, epochs=1), model=bench.policy_model("naive"),
                 log_dir=str(tmp_path / "inspect"), display="none", max_samples=2)
    assert log.status == "success", log.error
    return log


def test_a_fault_on_the_handshake_takes_the_tools_away_and_the_sample_is_scored(mcp_url, tmp_path):  # noqa: F811
    scenario = tmp_path / "down.yaml"
    scenario.write_text(DOWN)
    with pytest.warns(UserWarning, match="runs without that server's tools"):
        plan = ChaosPlan([scenario], baseline=0.0, seed=3, log_dir=tmp_path / "proxy")
    log = run(plan, mcp_url, tmp_path)
    for sample in log.samples:
        assert sample.error is None, sample.error
        assert sample.scores["chaos_includes"].value == "I"  # no tool: no right answer
        assert chaos(sample)["faults"] == {"http_error": 1}
        [told] = [event.data for event in sample.events if event.event == "info" and event.source == "chaosproxy"]
        assert told["server"] == mcp_url and told["unavailable"].startswith("MCPError: ")
        assert [(fault["rule"], fault["method"], fault["params"]) for fault in told["faults"]] == [
            ("down", "initialize", {"status": 503})]


def test_a_handshake_that_fails_without_a_fault_is_the_samples_error(tmp_path):
    with socket.socket() as probe:  # a port nothing listens on: the proxy answers 502, no fault fired
        probe.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{probe.getsockname()[1]}/mcp"
    log = run(ChaosPlan(baseline=1.0, seed=3, log_dir=tmp_path / "proxy"), dead, tmp_path)
    assert all(sample.error is not None for sample in log.samples)
