"""Record, perturb, replay with real servers and real clients (issue 29's acceptance), loopback only.

Recorded: server-everything over streamable HTTP and mcp-server-time over stdio driven by the mcp SDK
client, and an openai SDK tool-calling loop against the bundled model server. Each server is stopped
before its cassette is replayed: the same client code gets the same results, and a scenario gives the
same faults for the same seed, live and replayed.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from mcp import Client, StdioServerParameters
from openai import OpenAI

from chaosproxy.cassette.format import CASSETTE_FILE, read_folder
from chaosproxy.demo import llm_server
from tests.helpers.cassette_support import proxy_to, replaying
from tests.helpers.llm_support import CHAT_TOOLS
from tests.helpers.mcp_support import client, dump
from tests.peers import peers

if (reason := peers.missing()) and not os.environ.get("CI"):
    pytest.skip(reason, allow_module_level=True)

CALLS = [("echo", {"message": f"message {i}"}) for i in range(4)] + \
    [("get-sum", {"a": i, "b": 40}) for i in range(4)]
SCENARIO = {"rules": [
    {"name": "sum-down", "match": {"tool": "get-sum"}, "probability": 0.5,
     "fault": {"type": "rpc_error", "code": -32000, "message": "backend down"}},
    {"name": "echo-noise", "match": {"tool": "echo"}, "probability": 0.5,
     "fault": {"type": "noise", "kind": "homoglyphs"}},
]}


async def everything_session(url: str) -> dict:
    """What the agent does against server-everything: list, then call each tool; errors are results too."""
    async with asyncio.timeout(60), client(url, "legacy", read_timeout_seconds=20) as session:
        results = {"tools": dump(await session.list_tools())}
        for number, (tool, arguments) in enumerate(CALLS):
            try:
                results[f"{number} {tool}"] = dump(await session.call_tool(tool, arguments))
            except Exception as exc:  # an rpc_error fault: the client raises, the agent sees it
                results[f"{number} {tool}"] = f"error: {exc}"
        return results


@pytest.fixture(scope="module")
def everything_cassette(tmp_path_factory, server_loop):
    """A clean session recorded against server-everything, which is stopped afterwards; and its results."""
    folder = tmp_path_factory.mktemp("everything") / "cassette"
    with peers.everything_http("streamableHttp") as server, \
            proxy_to(server_loop, server.base, folder.parent / "log.jsonl", record=folder) as proxy:
        recorded = asyncio.run(everything_session(proxy.url + "/mcp"))
    return folder, recorded


def test_server_everything_replayed_gives_the_client_the_same_results(server_loop, everything_cassette):
    folder, recorded = everything_cassette
    assert recorded["0 echo"]["content"][0]["text"] == "Echo: message 0"
    assert len(recorded["tools"]["tools"]) > 5
    with replaying(server_loop, folder) as replay:
        assert asyncio.run(everything_session(replay.url + "/mcp")) == recorded
        assert replay.replay.unmatched == []
    cassette = read_folder(folder)
    methods = [json.loads(e.request.body).get("method") for e in cassette.exchanges if e.request.body]
    assert methods[:2] == ["initialize", "notifications/initialized"] and "tools/list" in methods
    assert any(e.response.events for e in cassette.exchanges)  # the POSTs were answered as SSE streams


def test_a_scenario_meets_the_same_faults_for_a_seed_live_and_replayed(server_loop, everything_cassette, tmp_path):
    folder, _ = everything_cassette
    with peers.everything_http("streamableHttp") as server, \
            proxy_to(server_loop, server.base, tmp_path / "live.jsonl", scenario=SCENARIO, seed=11) as live:
        live_results = asyncio.run(everything_session(live.url + "/mcp"))
    with replaying(server_loop, folder) as replay, \
            proxy_to(server_loop, replay.url, tmp_path / "replayed.jsonl", scenario=SCENARIO, seed=11) as replayed:
        replayed_results = asyncio.run(everything_session(replayed.url + "/mcp"))
        assert replay.replay.unmatched == []
    faults = live.faults()
    assert replayed.faults() == faults
    assert replayed_results == live_results
    assert {rule for rule, *_ in faults} == {"sum-down", "echo-noise"} and len(faults) < len(CALLS)


def test_a_drill_with_a_scenario_runs_offline_on_the_cassette_with_the_live_faults(everything_cassette, tmp_path):
    """`chaosproxy drill` live, then `--replay-cassette` with no server: the same faults for the same seed."""
    folder, _ = everything_cassette
    agent = tmp_path / "agent.py"
    agent.write_text(f"import asyncio, os, sys\nsys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})\n"
                     "from tests.cassette.test_cassette_peers import everything_session\n"
                     "asyncio.run(everything_session(os.environ['CHAOSPROXY_URL']))\n")
    scenario = tmp_path / "scenario.yaml"
    scenario.write_text(json.dumps(SCENARIO))

    def drill(out: Path, *target: str) -> list[tuple]:
        done = subprocess.run([sys.executable, "-m", "chaosproxy", "drill", "--agent", f"{sys.executable} {agent}",
                               *target, "--scenario", str(scenario), "--baseline", "0", "--seed", "5",
                               "--timeout", "90", "--out", str(out)], capture_output=True, text=True, timeout=240)
        assert done.returncode == 0, done.stdout + done.stderr
        log = [json.loads(line) for line in (out / "run-1" / "log.jsonl").read_text().splitlines()]
        return [(line["rule"], line["fault"], line.get("tool")) for line in log if line["event"] == "fault"]

    with peers.everything_http("streamableHttp") as server:
        live = drill(tmp_path / "live", "--upstream", server.url)
    replayed = drill(tmp_path / "replayed", "--replay-cassette", str(folder), "--upstream", server.url)
    assert replayed == live and live


def time_session(command: list[str]) -> dict:
    async def run() -> dict:
        params = StdioServerParameters(command=command[0], args=command[1:])
        async with asyncio.timeout(60), Client(params, mode="legacy", read_timeout_seconds=20) as session:
            return {"tools": dump(await session.list_tools()),
                    "now": dump(await session.call_tool("get_current_time", {"timezone": "Asia/Tokyo"})),
                    "convert": dump(await session.call_tool("convert_time", {
                        "source_timezone": "Europe/Paris", "time": "14:30", "target_timezone": "America/Lima"}))}
    return asyncio.run(run())


def test_mcp_server_time_over_stdio_replayed_gives_the_client_the_same_results(tmp_path):
    folder = tmp_path / "time"
    chaosproxy = [sys.executable, "-m", "chaosproxy"]
    recorded = time_session([*chaosproxy, "stdio", "--log", str(tmp_path / "log.jsonl"), "--record", str(folder),
                             "--", *peers.time_stdio()])
    assert "Asia/Tokyo" in json.dumps(recorded["now"])
    frames = read_folder(folder).frames
    assert [frame.side for frame in frames[:2]] == ["client", "server"]
    assert frames[1].t > frames[0].t
    for timing in (["--no-delay"], []):  # at once, and as recorded
        replayed = time_session([*chaosproxy, "replay", str(folder), "--stdio", *timing])
        assert replayed == recorded  # the recorded time, the same results: no time server ran


def chat_loop(base_url: str, *, stream: bool) -> list:
    """An openai SDK tool-calling loop: the model calls tools, the agent answers, until it says something."""
    model = OpenAI(base_url=base_url, api_key="sk-openai-secret-7c1d9e", max_retries=0, timeout=20)
    messages = [{"role": "user", "content": "Weather `call get_weather(city=Paris)` then `call search_docs("
                                            "query=umbrella)`"}]
    said = []
    for _ in range(4):
        if stream:
            calls: dict[int, dict] = {}
            text = ""
            for chunk in model.chat.completions.create(model="scripted", messages=messages, tools=CHAT_TOOLS,
                                                       stream=True, extra_body={"api_key": "body-secret-5e2f"}):
                delta = chunk.choices[0].delta if chunk.choices else None
                text += (delta.content or "") if delta else ""
                for call in (delta.tool_calls or []) if delta else []:
                    entry = calls.setdefault(call.index, {"id": "", "name": "", "arguments": ""})
                    entry["id"] += call.id or ""
                    entry["name"] += call.function.name or ""
                    entry["arguments"] += call.function.arguments or ""
            tool_calls = [{"id": c["id"], "type": "function", "function": {"name": c["name"],
                                                                           "arguments": c["arguments"]}}
                          for c in calls.values()]
        else:
            reply = model.chat.completions.create(model="scripted", messages=messages, tools=CHAT_TOOLS,
                                                  extra_body={"api_key": "body-secret-5e2f"}).choices[0].message
            text = reply.content or ""
            tool_calls = [call.model_dump() for call in reply.tool_calls or []]
        said.append({"text": text, "calls": [(c["function"]["name"], c["function"]["arguments"]) for c in tool_calls]})
        if not tool_calls:
            return said
        messages.append({"role": "assistant", "content": None, "tool_calls": tool_calls})
        for call in tool_calls:
            messages.append({"role": "tool", "tool_call_id": call["id"],
                             "content": f"result of {call['function']['name']}"})
    return said


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_an_openai_tool_loop_replayed_gives_the_same_turns_and_no_secret_is_recorded(server_loop, tmp_path, stream):
    folder = tmp_path / "model"
    runner, port, _ = server_loop.run(llm_server.start())
    try:
        with proxy_to(server_loop, f"http://127.0.0.1:{port}", tmp_path / "log.jsonl", record=folder) as proxy:
            recorded = chat_loop(proxy.url + "/v1", stream=stream)
    finally:
        server_loop.run(runner.cleanup())  # the model server is gone before the replay
    assert [turn["calls"][0][0] for turn in recorded[:2]] == ["get_weather", "search_docs"]
    assert recorded[-1]["text"] and not recorded[-1]["calls"]
    text = (folder / CASSETTE_FILE).read_text()
    assert "sk-openai-secret" not in text and "body-secret" not in text
    assert re.search(r'\["authorization","REDACTED"\]', text, re.IGNORECASE)
    assert '\\"api_key\\":\\"REDACTED\\"' in text
    with replaying(server_loop, folder) as replay:
        assert chat_loop(replay.url + "/v1", stream=stream) == recorded
        assert replay.replay.unmatched == []
    if stream:
        assert all(e.response.events for e in read_folder(folder).exchanges)
