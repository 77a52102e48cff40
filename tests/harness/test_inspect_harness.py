"""The Inspect AI integration (chaosproxy.harness), acceptance offline and on loopback: Inspect evals with
the scripted `mockllm` policies over the bundled MCP server (HTTP and stdio) and with Inspect's OpenAI
provider against the bundled model server through the gateway; what each sample-epoch met against the
proxies' own logs; reruns; `import-inspect` then `chaosproxy report` against Inspect's metrics."""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("inspect_ai", reason="the Inspect integration needs inspect-ai (pip install 'chaosproxy[inspect]')")

from inspect_ai import Task, eval  # noqa: E402
from inspect_ai.dataset import Sample  # noqa: E402
from inspect_ai.log import EvalLog  # noqa: E402
from inspect_ai.model import get_model  # noqa: E402
from inspect_ai.scorer import includes  # noqa: E402
from inspect_ai.solver import generate, use_tools  # noqa: E402
from inspect_ai.tool import tool  # noqa: E402

from chaosproxy.cli import main as cli  # noqa: E402
from chaosproxy.harness import ChaosPlan, chaos_task, mcp_server_http  # noqa: E402
from chaosproxy.harness.plan import handshake_warnings  # noqa: E402

pytestmark = pytest.mark.timeout(300)
ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("inspect_benchmark", ROOT / "examples" / "inspect_benchmark.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)  # type: ignore[union-attr]

# 503 on a tool call, one in two: the case the prototype measured
TOOL_503 = "rules:\n  - name: tool-503\n    match: {method: tools/call}\n    probability: 0.5\n" \
           "    fault: {type: http_error, status: 503}\n"


@pytest.fixture(scope="module")
def mcp_url():
    server, url = bench.serve_mcp_http()
    yield url
    server.terminate()
    server.wait(10)


@pytest.fixture
def tool_503(tmp_path: Path) -> Path:
    path = tmp_path / "tool_503.yaml"
    path.write_text(TOOL_503)
    return path


def run(plan: ChaosPlan, policy: str, tmp_path: Path, *, url: str | None, samples: int = 6,
        epochs: int = 2) -> EvalLog:
    [log] = eval(bench.benchmark_task(plan, url=url, samples=samples, epochs=epochs), model=bench.policy_model(policy),
                 log_dir=str(tmp_path / "inspect"), display="none", max_samples=4)
    assert log.status == "success", log.error
    return log


def metrics(log: EvalLog) -> dict[str, float]:
    return {f"{name}": metric.value for score in log.results.scores for name, metric in score.metrics.items()}


def chaos(sample: Any) -> dict[str, Any]:
    return sample.store["chaosproxy"]


def fault_lines(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [line for line in lines if line["event"] == "fault"]


@pytest.mark.parametrize("transport", ["http", "stdio"])
def test_clean_runs_score_one(transport, mcp_url, tmp_path):
    plan = ChaosPlan(baseline=1.0, seed=1, log_dir=tmp_path / "proxy")
    log = run(plan, "naive", tmp_path, url=mcp_url if transport == "http" else None, samples=4, epochs=1)
    assert metrics(log)["accuracy"] == 1.0
    assert metrics(log)["clean"] == 1.0 and math.isnan(metrics(log)["faulted"])
    for sample in log.samples:
        record = chaos(sample)
        assert (record["kind"], record["faults"], record["faulted"]) == ("clean", {}, False)
        calls = [line for line in record["log"] if line["event"] == "call" and line.get("method") == "tools/call"]
        assert [line["tool"] for line in calls] == [sample.input.split("call ")[1].split("(")[0]]


def test_naive_and_retrying_separate_under_503_on_tool_calls(mcp_url, tool_503, tmp_path):
    plan = ChaosPlan([tool_503], baseline=0.25, seed=7, log_dir=tmp_path / "proxy")
    naive = metrics(run(plan, "naive", tmp_path / "naive", url=mcp_url, samples=8, epochs=3))
    retrying = metrics(run(plan, "retrying", tmp_path / "retrying", url=mcp_url, samples=8, epochs=3))
    assert naive["clean"] == retrying["clean"] == 1.0
    assert naive["faulted"] < 0.7 < retrying["faulted"]
    assert naive["transition"] == naive["faulted"] and retrying["http_error"] == retrying["faulted"]
    assert naive["drop_ci95_low"] > 0  # the naive policy's weakness is real at this size
    assert naive["pass2_clean"] == retrying["pass2_clean"] == 1.0  # every sample with two clean epochs
    assert naive["pass2_faulted"] < retrying["pass2_faulted"]


def test_each_sample_holds_exactly_its_proxy_log_faults_and_the_transcript_shows_them(mcp_url, tool_503, tmp_path):
    plan = ChaosPlan([tool_503], baseline=0.25, seed=11, log_dir=tmp_path / "proxy")
    log = run(plan, "retrying", tmp_path, url=mcp_url)
    fired = 0
    for sample in log.samples:
        record = chaos(sample)
        [folder] = (tmp_path / "proxy").glob(f"{record['agent']}-*")
        on_disk = [json.loads(line) for line in (folder / "log.jsonl").read_text().splitlines()]
        assert fault_lines(record["log"]) == fault_lines(on_disk)
        faults = fault_lines(on_disk)
        fired += len(faults)
        assert record["faults"] == ({"http_error": len(faults)} if faults else {})
        assert sample.scores["chaos_includes"].metadata["chaosproxy"]["faults"] == record["faults"]
        shown = [fault for event in sample.events if event.event == "info" and event.source == "chaosproxy"
                 for fault in event.data["faults"]]
        assert shown == faults  # each beside the tool call it hit, none left out
        assert {line["seed"] for line in on_disk if line["event"] == "run"} == {record["seed"]}
    assert fired > 0


def test_the_same_seed_meets_the_same_faults_on_a_rerun(mcp_url, tool_503, tmp_path):
    def met(log: EvalLog) -> dict[tuple[Any, int], Any]:
        return {(s.id, s.epoch): (chaos(s)["kind"], chaos(s)["seed"],
                                  [(f["rule"], f["method"], f["tool"], f["match_index"]) for f in
                                   fault_lines(chaos(s)["log"])]) for s in log.samples}

    first = met(run(ChaosPlan([tool_503], seed=5, log_dir=tmp_path / "a"), "retrying", tmp_path / "a", url=mcp_url))
    again = met(run(ChaosPlan([tool_503], seed=5, log_dir=tmp_path / "b"), "retrying", tmp_path / "b", url=mcp_url))
    other = met(run(ChaosPlan([tool_503], seed=6, log_dir=tmp_path / "c"), "retrying", tmp_path / "c", url=mcp_url))
    assert first == again
    assert first != other
    assert any(faults for _, _, faults in first.values())


def test_stdio_sessions_meet_faults_and_retries_get_through(tool_503, tmp_path):
    plan = ChaosPlan([tool_503], baseline=0.0, seed=3, log_dir=tmp_path / "proxy")
    log = run(plan, "retrying", tmp_path, url=None, samples=4, epochs=1)
    lines = [line for sample in log.samples for line in chaos(sample)["log"]]
    assert fault_lines(lines) and {line["transport"] for line in fault_lines(lines)} == {"stdio"}
    seeds = [line["seed"] for line in lines if line["event"] == "run"]
    assert len(seeds) == len(set(seeds))  # each stdio session its own seed
    assert metrics(log)["faulted"] > 0


@tool
def weather():
    async def execute(city: str) -> str:
        """Current weather for a city.

        Args:
            city: The city.
        """
        return json.dumps({"city": city, "temp_c": 14})
    return execute


@pytest.fixture(scope="module")
def model_server():
    import socket
    import time

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "chaosproxy.demo.llm_server", "--port", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            time.sleep(0.05)
    yield f"http://127.0.0.1:{port}/v1"
    server.terminate()
    server.wait(10)


def test_model_api_faults_through_the_gateway_are_each_samples_own(model_server, tmp_path):
    scenario = tmp_path / "broken_calls.yaml"
    scenario.write_text("rules:\n  - name: broken-call\n    fault: {type: malformed_tool_call, kind: truncated}\n")
    plan = ChaosPlan([scenario], baseline=0.5, scope="model", seed=4, log_dir=tmp_path / "proxy")
    model = get_model("openai/scripted", base_url=plan.gateway(model_server), api_key="offline",
                      responses_api=False, memoize=False)
    task = Task(dataset=[Sample(input=f"call weather(city=paris) #{i}", target="14") for i in range(8)],
                solver=[use_tools(weather()), generate()], scorer=includes())
    try:
        [log] = eval(chaos_task(task, plan), model=model, display="none", log_dir=str(tmp_path / "inspect"))
    finally:
        plan.close()
    assert log.status == "success", log.error
    gateway = [json.loads(line) for line in (tmp_path / "proxy" / "gateway-1.jsonl").read_text().splitlines()]
    kinds = set()
    for sample in log.samples:
        record = chaos(sample)
        kinds.add(record["kind"])
        mine = [line for line in gateway if line.get("session") == record["agent"]]
        assert record["log"] == mine
        assert {line["rule"] for line in fault_lines(mine)} == (
            set() if record["kind"] == "clean" else {f"{record['agent']}/broken-call"})
        assert sample.scores["chaos_includes"].value == ("C" if record["kind"] == "clean" else "I")
    assert kinds == {"clean", "scenario"}
    assert metrics(log)["clean"] == 1.0 and metrics(log)["faulted"] == 0.0


def test_import_inspect_then_report_gives_the_inspect_metrics(mcp_url, tool_503, tmp_path, capsys):
    plan = ChaosPlan([tool_503], baseline=0.3, seed=9, log_dir=tmp_path / "proxy")
    log = run(plan, "naive", tmp_path, url=mcp_url, samples=6, epochs=3)
    folder = tmp_path / "drill"
    assert cli(["import-inspect", log.location, "--out", str(folder)]) == 0
    assert cli(["report", str(folder), "--json", str(tmp_path / "report.json")]) == 0
    profile = json.loads((tmp_path / "report.json").read_text())["profile"]
    seen = metrics(log)
    assert profile["runs"] == 18 and profile["errors"] == 0
    overall = profile["overall"]
    assert overall["clean"]["rate"] == seen["clean"] and overall["perturbed"]["rate"] == seen["faulted"]
    assert overall["drop"] == pytest.approx(seen["drop"])
    assert overall["drop_ci95"] == [round(seen["drop_ci95_low"], 4), round(seen["drop_ci95_high"], 4)]
    for row in profile["by_component"] + profile["by_fault"]:
        assert row["perturbed"]["rate"] == seen[row["name"]]
    gate = cli(["report", str(folder), "--fail-under", f"transition={min(1.0, seen['transition'] + 0.01)}"])
    assert gate == 3
    assert cli(["export", str(folder), "--format", "trajectories", "-o", str(tmp_path / "t.jsonl")]) == 0
    assert (tmp_path / "t.jsonl").read_text().count("\n") >= 18


def test_shards_of_an_eval_merge_into_the_whole(mcp_url, tool_503, tmp_path):
    plan = ChaosPlan([tool_503], baseline=0.3, seed=9, log_dir=tmp_path / "proxy")
    whole = run(plan, "naive", tmp_path / "whole", url=mcp_url, samples=4, epochs=1)
    task = bench.benchmark_task(plan, url=mcp_url, samples=4, epochs=1)
    shards = []
    for index, ids in enumerate(([1, 2], [3, 4])):
        [log] = eval(task, model=bench.policy_model("naive"), sample_id=ids, log_dir=str(tmp_path / f"s{index}"),
                     display="none")
        assert cli(["import-inspect", log.location, "--shard", f"{index}/2", "--out", str(tmp_path / f"d{index}")]) == 0
        shards.append(str(tmp_path / f"d{index}"))
    assert cli(["merge", *shards, "--out", str(tmp_path / "merged")]) == 0
    assert cli(["import-inspect", whole.location, "--out", str(tmp_path / "all")]) == 0
    runs = [[(r["run"], r["label"], r["status"], r["faults"])
             for r in map(json.loads, (tmp_path / name / "results.jsonl").read_text().splitlines())]
            for name in ("merged", "all")]
    assert sorted(runs[0]) == sorted(runs[1])


def test_a_rule_that_can_fail_the_handshake_is_warned_of(tool_503):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ChaosPlan([ROOT / "scenarios" / "transition" / "server_error.yaml"])
        ChaosPlan([tool_503])
    assert len(caught) == 1 and "server-error" in str(caught[0].message) and "initialize" in str(caught[0].message)
    assert not handshake_warnings(ChaosPlan([tool_503]))


def test_a_plan_draws_per_sample_and_epoch_from_its_seed_alone():
    plan = ChaosPlan(suite=ROOT / "scenarios" / "suites" / "robustbench-tc.yaml", baseline=0.2, seed=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        again = ChaosPlan(suite=ROOT / "scenarios" / "suites" / "robustbench-tc.yaml", baseline=0.2, seed=1)
    draws = [plan.draw(sample, epoch) for sample in range(1, 101) for epoch in (1, 2)]
    assert draws == [again.draw(sample, epoch) for sample in range(1, 101) for epoch in (1, 2)]
    clean = sum(draw.kind == "clean" for draw in draws)
    assert 20 <= clean <= 60  # a fifth of 200
    assert len({draw.label for draw in draws if draw.kind == "sample"}) >= 15  # the suite's types, one each
    assert len({draw.seed for draw in draws}) == len(draws)


def test_mcp_servers_outside_a_chaos_task_say_what_is_missing(mcp_url, tmp_path):
    task = Task(dataset=[Sample(input="call weather(city=paris)", target="14")],
                solver=[use_tools(mcp_server_http(url=mcp_url)), generate()], scorer=includes())
    [log] = eval(task, model=bench.policy_model("naive"), display="none", log_dir=str(tmp_path))
    assert "chaos_task(task, plan)" in log.samples[0].error.message if log.samples else "chaos_task" in str(log.error)


def test_import_inspect_refuses_what_is_not_a_chaos_eval(tmp_path, capsys):
    not_a_log = tmp_path / "x.eval"
    not_a_log.write_text("nothing")
    assert cli(["import-inspect", str(not_a_log), "--out", str(tmp_path / "d")]) == 2
    assert "not an Inspect eval log" in capsys.readouterr().err
