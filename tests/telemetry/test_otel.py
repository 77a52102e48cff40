"""Faults in the agent's traces: spans exported over OTLP/HTTP to a real receiver on 127.0.0.1.

The agent is the real MCP SDK client with a trace context of its own; the tool server is the bundled
one, exporting its own spans too, so a test sees the whole chain: agent -> proxy span -> server span.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from mcp import Client, StdioServerParameters
from mcp.shared.exceptions import MCPError
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from tests.helpers.otlp import Receiver, Span
from tests.helpers.support import ServerLoop

ROOT = Path(__file__).resolve().parents[2]
AGENT_TRACE = "0af7651916cd43dd8448eb211c80319c"
AGENT_SPAN = "b7ad6b7169203331"
DELAY_S = 0.3
SCENARIO = {"rules": [
    {"name": "slow-search", "match": {"tool": "search"}, "fault": {"type": "latency", "delay_ms": DELAY_S * 1000}},
    {"name": "weather-down", "match": {"tool": "weather"}, "fault": {"type": "http_error", "status": 503}},
]}


@pytest.fixture
def receiver(server_loop: ServerLoop) -> Iterator[Receiver]:
    receiver = Receiver()
    server_loop.run(receiver.start())
    yield receiver
    server_loop.run(receiver.stop())


def otel_environment(receiver: Receiver) -> dict[str, str]:
    """What a user sets: the endpoint (and a short batch delay, so spans arrive while the test waits)."""
    keep = {name: value for name, value in os.environ.items() if not name.startswith(("OTEL_", "TRACEPARENT"))}
    return {**keep, "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "100",
            "PYTHONPATH": str(ROOT)}


@contextlib.contextmanager
def agent_trace() -> Iterator[None]:
    """The agent's own span as the current context: the SDK client puts it in each request's `_meta`."""
    context = SpanContext(int(AGENT_TRACE, 16), int(AGENT_SPAN, 16), is_remote=True, trace_flags=TraceFlags(1))
    with trace.use_span(NonRecordingSpan(context), end_on_exit=False):
        yield


def scenario_file(tmp_path: Path) -> Path:
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(SCENARIO))
    return path


async def make_calls(target: Any) -> None:
    """A fine call, a slowed one and a failed one, inside the agent's trace."""
    with agent_trace():
        async with Client(target, mode="legacy") as session:
            await session.call_tool("add", {"a": 1, "b": 2})
            result = await session.call_tool("search", {"query": "chaos"})
            assert "chaos result 1" in result.content[0].text
            with pytest.raises(MCPError):  # legacy SSE clients never hear of a failed POST: they time out
                await session.call_tool("weather", {"city": "Oslo"}, read_timeout_seconds=5)


def check_call_spans(receiver: Receiver, network: str) -> dict[str, Span]:
    """The proxy's spans for the three calls: names, attributes, parents, faults; the server's under them."""
    receiver.wait_for(lambda spans: len([s for s in spans if s.service == "chaosproxy" and s.name.startswith(
        ("tools/call", "chaosproxy.fault"))]) >= 5 and sum(s.name.startswith("tools/call") and s.service == "demo-tools"
                                                          for s in spans) >= 2)
    [add] = receiver.named("tools/call add")
    [search] = receiver.named("tools/call search")
    [weather] = receiver.named("tools/call weather")
    for span, tool in ((add, "add"), (search, "search"), (weather, "weather")):
        assert (span.kind, span.trace_id, span.parent_id) == ("CLIENT", AGENT_TRACE, AGENT_SPAN)
        attributes = span.attributes
        assert attributes["mcp.method.name"] == "tools/call"
        assert attributes["gen_ai.tool.name"] == tool
        assert attributes["gen_ai.operation.name"] == "execute_tool"
        assert isinstance(attributes["jsonrpc.request.id"], str)
        assert attributes["network.transport"] == network
        assert attributes["mcp.protocol.version"]
        assert span.resource["chaosproxy.run_id"] and isinstance(span.resource["chaosproxy.seed"], int)
        assert span.resource["service.name"] == "chaosproxy"
    assert "chaosproxy.fault.type" not in add.attributes and add.status == "UNSET", (add.attributes, add.status_message)

    assert search.attributes["chaosproxy.fault.type"] == "latency"
    assert search.attributes["chaosproxy.fault.rule"] == "slow-search"
    assert search.attributes["chaosproxy.fault.component"] == "transition"
    assert search.attributes["chaosproxy.fault.level"] == "transport"
    assert (search.attributes["chaosproxy.seed"], search.attributes["chaosproxy.run_id"]) == (
        search.resource["chaosproxy.seed"], search.resource["chaosproxy.run_id"])
    assert search.status == "UNSET" and search.seconds >= DELAY_S
    [(event, fields)] = search.events
    assert (event, fields["rule"], fields["fault"], fields["tool"]) == ("chaosproxy.fault", "slow-search",
                                                                       "latency", "search")
    [slow] = [s for s in receiver.named("chaosproxy.fault latency") if s.parent_id == search.span_id]
    assert slow.trace_id == AGENT_TRACE and slow.seconds == pytest.approx(DELAY_S, abs=0.01)

    assert weather.attributes["chaosproxy.fault.type"] == "http_error"
    assert weather.status == "ERROR" and weather.attributes["error.type"]
    [down] = [s for s in receiver.named("chaosproxy.fault http_error") if s.parent_id == weather.span_id]
    assert down.status == "ERROR"

    # The tool server's own span for each call it got nests under the proxy's (context from `_meta`);
    # the failed call never reached it.
    served = {s.name: s for s in receiver.spans if s.service == "demo-tools" and s.name.startswith("tools/call")}
    assert served["tools/call add"].parent_id == add.span_id
    assert served["tools/call search"].parent_id == search.span_id
    assert "tools/call weather" not in served
    return {"add": add, "search": search, "weather": weather}


async def test_stdio_calls_carry_spans_with_their_faults(tmp_path: Path, receiver: Receiver):
    command = [sys.executable, "-m", "tests.helpers.otlp", "server", "stdio"]
    args = ["-m", "chaosproxy", "stdio", "--scenario", str(scenario_file(tmp_path)),
            "--log", str(tmp_path / "log.jsonl"), "--", *command]
    params = StdioServerParameters(command=sys.executable, args=args, env=otel_environment(receiver), cwd=str(ROOT))
    await make_calls(params)
    spans = check_call_spans(receiver, "pipe")
    assert spans["weather"].attributes["error.type"] == "503"  # the HTTP status the fault injected
    assert "server.address" not in spans["add"].attributes


def test_no_endpoint_means_no_opentelemetry_import():
    """With no OTEL endpoint a run never imports OpenTelemetry: the proxy pays nothing for it."""
    code = ("import sys\n"
            "from chaosproxy.control.runtime import open_engine\n"
            "from chaosproxy.adapters import http, stdio\n"
            "with open_engine(None, seed=1, log_path='/dev/null') as engine:\n"
            "    assert not engine.tracing.on\n"
            "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))\n")
    environment = {name: value for name, value in os.environ.items() if not name.startswith("OTEL_")}
    done = subprocess.run([sys.executable, "-c", code], env=environment, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


TRACED_AGENT = """
import asyncio, json, os, shlex, sys
from mcp import Client, StdioServerParameters
print(json.dumps({key: os.environ.get(key) for key in ("TRACEPARENT", "BAGGAGE")}))
async def main():
    command, *args = shlex.split(os.environ["CHAOSPROXY_STDIO_COMMAND"])
    async with Client(StdioServerParameters(command=command, args=args, env=dict(os.environ))) as client:
        await client.call_tool("add", {"a": 1, "b": 2})
asyncio.run(main())
"""


def test_each_drill_run_is_a_trace_its_agent_and_proxy_join(tmp_path: Path, receiver: Receiver):
    """A root span per run; the agent gets TRACEPARENT and BAGGAGE; the proxy's spans land in the run's
    trace even when the agent itself is not instrumented; results and the report name the trace."""
    from chaosproxy.report.build import build_report

    agent = tmp_path / "agent.py"
    agent.write_text(TRACED_AGENT)
    slow = tmp_path / "slow.yaml"
    slow.write_text("rules: [{name: slow, match: {tool: add}, fault: {type: latency, delay_ms: 10}}]\n")
    out = tmp_path / "drill"
    done = subprocess.run([sys.executable, "-m", "chaosproxy", "drill", "--agent", f"{sys.executable} {agent}",
                           "--stdio", f"{sys.executable} -m chaosproxy.demo.mcp_server stdio", "--scenario", str(slow),
                           "--seed", "5", "--timeout", "60", "--out", str(out)],
                          env=otel_environment(receiver), capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    results = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert len(results) == 2 and all(r["status"] == "passed" for r in results)
    spans = receiver.wait_for(lambda spans: sum(s.name == "tools/call add" for s in spans) >= 2
                              and sum(s.name.startswith("chaosproxy.drill") for s in spans) >= 2)
    for result in results:
        [root] = [s for s in spans if s.name == f"chaosproxy.drill {result['run']}"]
        assert (root.parent_id, root.trace_id, root.kind) == ("", result["trace_id"], "INTERNAL")
        assert root.attributes["chaosproxy.run.status"] == "passed"
        assert root.attributes["chaosproxy.seed"] == result["seed"]
        seen = json.loads((out / result["run"] / "agent.stdout").read_text().splitlines()[0])
        assert seen["TRACEPARENT"].startswith(f"00-{root.trace_id}-{root.span_id}-")
        assert seen["BAGGAGE"] == (f"chaosproxy.run={result['run']},chaosproxy.engine.scenario={result['label']},"
                                   f"chaosproxy.seed={result['seed']}")
        [call] = [s for s in spans if s.name == "tools/call add" and s.trace_id == root.trace_id]
        assert call.parent_id == root.span_id and call.service == "chaosproxy"
    faulted = [s for s in spans if s.name == "chaosproxy.fault latency"]
    assert [s.trace_id for s in faulted] == [results[1]["trace_id"]]
    titles = [timeline.title for timeline in build_report(out).timelines]
    assert any(f"trace {results[1]['trace_id']}" in title for title in titles)


def test_a_replayed_run_gets_its_root_span(tmp_path: Path, receiver: Receiver):
    """`chaosproxy drill --replay`: the replay is a trace of its own, rooted like the drill's runs."""
    agent = tmp_path / "agent.py"
    agent.write_text(TRACED_AGENT)
    out = tmp_path / "drill"
    command = [sys.executable, "-m", "chaosproxy", "drill", "--agent", f"{sys.executable} {agent}",
               "--stdio", f"{sys.executable} -m chaosproxy.demo.mcp_server stdio", "--seed", "5", "--timeout", "60"]
    plain = {name: value for name, value in os.environ.items() if not name.startswith(("OTEL_", "TRACE"))}
    done = subprocess.run([*command, "--out", str(out)], env=plain, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    [original] = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert original["trace_id"] is None  # no endpoint then: no trace
    done = subprocess.run([sys.executable, "-m", "chaosproxy", "drill", "--replay", str(out / original["run"])],
                          env=otel_environment(receiver), capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    spans = receiver.wait_for(lambda spans: any(s.name.startswith("chaosproxy.drill") for s in spans)
                              and any(s.name == "tools/call add" for s in spans))
    [root] = [s for s in spans if s.name == f"chaosproxy.drill {original['run']}"]
    assert (root.parent_id, root.kind, root.attributes["chaosproxy.run.status"]) == ("", "INTERNAL", "passed")
    assert root.resource["chaosproxy.run_id"] == out.name and root.attributes["chaosproxy.seed"] == original["seed"]
    [call] = [s for s in spans if s.name == "tools/call add"]
    assert (call.trace_id, call.parent_id) == (root.trace_id, root.span_id)
    seen = json.loads((out / original["run"] / "replay-1" / "agent.stdout").read_text().splitlines()[0])
    assert seen["TRACEPARENT"].startswith(f"00-{root.trace_id}-{root.span_id}-")



def configured(code: str, **environ: str) -> str:
    """Run `code` in a fresh interpreter with only these OTEL_* variables; its stdout."""
    environment = {name: value for name, value in os.environ.items() if not name.startswith(("OTEL_", "TRACE"))}
    done = subprocess.run([sys.executable, "-c", code], env={**environment, **environ}, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip() + done.stderr


def test_the_standard_variables_are_honoured():
    code = ("from chaosproxy.telemetry.tracing import from_environment\n"
            "t = from_environment(False, run_id='r', seed=3)\n"
            "a = t.settings.resource\n"
            "print(a['service.name'], a.get('deployment.environment'), a['chaosproxy.seed'], t.sampler.description)\n")
    out = configured(code, OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:9", OTEL_SERVICE_NAME="agent-tools",
                     OTEL_RESOURCE_ATTRIBUTES="deployment.environment=staging", OTEL_TRACES_SAMPLER="traceidratio",
                     OTEL_TRACES_SAMPLER_ARG="0.5")
    assert out.splitlines()[0] == "agent-tools staging 3 traceidratio(0.5)"
    off = ("from chaosproxy.telemetry.tracing import from_environment\n"
           "print(from_environment(False, run_id='r', seed=3).on)\n")
    assert configured(off, OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:9", OTEL_SDK_DISABLED="true") == "False"
    assert configured(off, OTEL_EXPORTER_OTLP_TRACES_ENDPOINT="http://127.0.0.1:9/v1/traces").startswith("True")
    assert configured(off) == "False"
