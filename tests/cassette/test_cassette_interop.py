"""Drift and interop: `cassette diff` against live servers (a renamed tool is named, exit 1; an unchanged
server exits 0), and a VCR.py cassette recorded by pytest-recording replayed through chaosproxy by the
pytest plugin's fixture, faults included."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

from mcp import Client, StdioServerParameters

from tests.helpers.cassette_support import proxy_to
from tests.helpers.mcp_support import SERVER, client, dump, serve

pytest_plugins = ["pytester"]
DRIFT_SERVER = [sys.executable, "-m", "tests.helpers.drift_server"]
ROOT = Path(__file__).resolve().parents[2]


async def tools_session(url: str) -> dict:
    async with asyncio.timeout(30), client(url, "legacy", read_timeout_seconds=10) as session:
        return {"tools": dump(await session.list_tools()),
                "search": dump(await session.call_tool("search", {"query": "drift"})),
                "add": dump(await session.call_tool("add", {"a": 1, "b": 2}))}


def cassette_diff(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "chaosproxy", "cassette", "diff", *args], capture_output=True,
                          text=True, timeout=120, cwd=ROOT)


def test_cassette_diff_names_a_renamed_tool_and_exits_non_zero(server_loop, tmp_path):
    folder = tmp_path / "tools"
    with serve("http", command=DRIFT_SERVER) as base:
        with proxy_to(server_loop, base, tmp_path / "log.jsonl", record=folder) as proxy:
            recorded = asyncio.run(tools_session(proxy.url + "/mcp"))
        unchanged = cassette_diff(str(folder), "--upstream", base)
    assert recorded["search"]["content"][0]["text"] == "3 results for drift"
    assert unchanged.returncode == 0, unchanged.stdout + unchanged.stderr
    assert "0 changes" in unchanged.stdout
    with serve("http", "--rename", "search=find", command=DRIFT_SERVER) as renamed:
        drifted = cassette_diff(str(folder), "--upstream", renamed)
        as_json = cassette_diff(str(folder), "--upstream", renamed, "--json", "--skip-calls")
    assert drifted.returncode == 1, drifted.stdout + drifted.stderr
    assert "tool_renamed: search -> find" in drifted.stdout, drifted.stdout
    changes = json.loads(as_json.stdout)["changes"]
    assert as_json.returncode == 1 and [c["kind"] for c in changes] == ["tool_renamed"]
    assert json.loads(as_json.stdout)["skipped"] == 3  # the two tools/call, and the GET stream that never ends


def test_cassette_diff_says_an_unreachable_upstream_apart(server_loop, tmp_path):
    folder = tmp_path / "tools"
    with serve("http", command=DRIFT_SERVER) as base:
        with proxy_to(server_loop, base, tmp_path / "log.jsonl", record=folder) as proxy:
            asyncio.run(tools_session(proxy.url + "/mcp"))
    gone = cassette_diff(str(folder), "--upstream", base, "--timeout", "5")
    assert gone.returncode == 3, gone.stdout + gone.stderr
    bad = cassette_diff(str(tmp_path / "nothing"), "--upstream", base)
    assert bad.returncode == 2 and "cannot read the cassette" in bad.stderr


def test_cassette_diff_of_a_stdio_cassette_runs_the_server_afresh(tmp_path):
    folder = tmp_path / "stdio"
    command = [sys.executable, "-m", "chaosproxy", "stdio", "--log", str(tmp_path / "log.jsonl"), "--record",
               str(folder), "--", *SERVER, "stdio"]

    async def run() -> None:
        params = StdioServerParameters(command=command[0], args=command[1:], cwd=str(ROOT))
        async with asyncio.timeout(30), Client(params, mode="legacy", read_timeout_seconds=10) as session:
            await session.list_tools()
            await session.call_tool("add", {"a": 1, "b": 2})

    asyncio.run(run())
    same = cassette_diff(str(folder), "--command", " ".join([*SERVER, "stdio"]))
    assert same.returncode == 0, same.stdout + same.stderr
    assert "requests sent again" in same.stdout


RECORDING = """
import json, urllib.request
import pytest

UPSTREAM = {upstream!r}


def post(base, query):
    request = urllib.request.Request(base + "/api/search", data=json.dumps({{"query": query}}).encode(),
                                     headers={{"Content-Type": "application/json"}})
    with urllib.request.urlopen(request, timeout=10) as answer:
        return answer.read()


@pytest.mark.vcr
def test_search():
    assert json.loads(post(UPSTREAM, "vcr"))["query"] == "vcr"
"""

REPLAYED = """
import json, urllib.error
import pytest
from test_rec import post


@pytest.mark.chaosproxy_cassette("cassettes/test_rec/test_search.yaml")
def test_offline(chaosproxy_replay, chaosproxy_factory):
    assert json.loads(post(chaosproxy_replay.url, "vcr"))["results"][0]["title"] == "vcr \\u2014 result 1"
    proxy = chaosproxy_factory(chaosproxy_replay.url, {{"rules": [
        {{"name": "down", "match": {{"path": "/api/*"}}, "fault": {{"type": "http_error", "status": 503}}}}]}})
    with pytest.raises(urllib.error.HTTPError) as refused:
        post(proxy.url, "vcr")
    assert refused.value.code == 503
    with pytest.raises(urllib.error.HTTPError) as missing:
        post(chaosproxy_replay.url, "not recorded")
    assert missing.value.code == 404
    assert len(chaosproxy_replay.unmatched) == 1
"""


def test_a_vcr_cassette_recorded_by_pytest_recording_replays_through_chaosproxy(pytester, upstream):
    pytester.makepyfile(test_rec=RECORDING.format(upstream=upstream))
    recording = pytester.runpytest_subprocess("--record-mode=once", "test_rec.py")
    recording.assert_outcomes(passed=1)
    cassette = pytester.path / "cassettes" / "test_rec" / "test_search.yaml"
    assert "interactions" in cassette.read_text()
    pytester.makepyfile(test_replayed=REPLAYED.format())
    replayed = pytester.runpytest_subprocess("-p", "no:recording", "test_replayed.py")
    replayed.assert_outcomes(passed=1)
