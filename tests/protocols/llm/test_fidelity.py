"""A fault measures what it names: observation and reward faults reach the agent as valid data, a
fault that fires always changes what the agent receives, and one that would change nothing does not fire.

Observed with the real Python SDK client against an SDK server whose tools declare strict output
schemas (tests/helpers/strict_server.py: enums, formats, patterns, additionalProperties: false).
"""

from __future__ import annotations

import copy
import io
import json
from typing import Any

import orjson
import pytest
import yaml
from jsonschema import Draft202012Validator

from chaosproxy.engine.core import Engine
from chaosproxy.engine.message import Message, Phase
from chaosproxy.engine.scenario import parse_scenario
from chaosproxy.faults import REGISTRY, Component
from chaosproxy.telemetry.log import PerturbationLog
from tests.helpers.mcp_support import client

# Every observation and reward fault, with the parameters it needs. A fault added to the registry
# without an entry here fails test_every_observation_and_reward_fault_is_covered.
ON_RESULTS: dict[str, list[dict[str, Any]]] = {
    "typos": [{"rate": 0.3}],
    "noise": [{"rate": 0.3}, {"kind": "zero_width", "rate": 0.2}, {"kind": "whitespace", "rate": 0.3}],
    "oversize": [{"bytes": 6000}, {"factor": 3}],
    "truncate_text": [{"fraction": 0.5}, {"chars": 10, "marker": "…"}],
    "inject_text": [{}, {"position": "insert"}, {"position": "prepend", "template": "noise"}],
    "wrong_data": [{"mode": "swap"}, {"mode": "swap", "count": 3}, {"mode": "empty"}, {"mode": "stale"}],
    "flip_is_error": [{}],
    "error_in_success": [{}],
}
ON_LISTINGS: dict[str, list[dict[str, Any]]] = {
    "misleading_description": [{"claim": "latency", "distractor": "suffix"}],
    "paraphrase_description": [{}],
    "poison_description": [{}],
    "cache_scope_flip": [{}],  # (the listing's cacheScope: the tools themselves are as listed)
}
CALLS = [("ticket", {"n": 1}), ("tickets", {"query": "printer", "limit": 3}), ("summary", {"topic": "it"}),
         ("broken_ticket", {}), ("ticket", {"n": 2}), ("tickets", {"query": "vpn", "limit": 2})]
ROUNDS = 4  # each call is made this often per proxy: every match draws from its own seeded stream


def test_every_observation_and_reward_fault_is_covered():
    covered = set(ON_RESULTS) | set(ON_LISTINGS)
    wanted = {name for name, cls in REGISTRY.items() if cls.component in (Component.OBSERVATION, Component.REWARD)
              and cls.level.value != "llm"}  # the model-API faults act on prompts, not on tool results
    assert wanted == covered


def strict_check(schema: dict[str, Any], value: Any) -> list[str]:
    """What a validating client would reject, formats included (the SDK skips formats; agents do not)."""
    validator = Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)
    return [error.message for error in validator.iter_errors(value)]


def visible(result: Any) -> dict[str, Any]:
    return {"content": [item.model_dump(mode="json", exclude_none=True) for item in result.content],
            "structured": result.structured_content, "is_error": result.is_error}


async def clean_results(url: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    async with client(url + "/mcp") as session:
        schemas = {tool.name: tool.output_schema for tool in (await session.list_tools()).tools}
        return schemas, [visible(await session.call_tool(name, args)) for name, args in CALLS]


@pytest.mark.parametrize("fault", [{"type": name, **params} for name, variants in ON_RESULTS.items()
                                   for params in variants], ids=lambda fault: json.dumps(fault, sort_keys=True))
@pytest.mark.parametrize("seed", [3, 11])
async def test_a_result_fault_reaches_the_agent_as_valid_different_data(make_proxy, mcp_strict, fault, seed):
    schemas, clean = await clean_results(mcp_strict)
    proxy = make_proxy({"rules": [{"name": "f", "match": {"tool": "*"}, "fault": fault}]}, seed=seed, to=mcp_strict)
    fired_on = 0
    async with client(proxy.url + "/mcp") as session:
        await session.list_tools()
        for _ in range(ROUNDS):
            for (name, args), expected in zip(CALLS, clean, strict=True):
                before = len(proxy.events("fault"))
                got = visible(await session.call_tool(name, args))  # never a client-side validation error
                fired = len(proxy.events("fault")) > before
                fired_on += fired
                assert (got != expected) == fired, (name, got, expected)
                if not got["is_error"] and schemas[name] is not None:
                    assert strict_check(schemas[name], got["structured"]) == [], (name, got)
                if fault["type"] in ON_RESULTS and fault["type"] not in ("flip_is_error", "error_in_success") \
                        and name != "summary" and not got["is_error"]:
                    mirrors = [json.loads(item["text"]) for item in got["content"] if item["text"].startswith("{")]
                    assert mirrors == [got["structured"]], name  # the text still restates structuredContent
    assert fired_on > 0
    for line in proxy.events("fault"):
        assert line["perturbed_digest"] != line["original_digest"]


@pytest.mark.parametrize("fault", [{"type": name, **params} for name, variants in ON_LISTINGS.items()
                                   for params in variants], ids=lambda fault: fault["type"])
async def test_a_listing_fault_reaches_the_agent_and_every_tool_still_answers(make_proxy, mcp_strict, fault):
    schemas, clean = await clean_results(mcp_strict)
    proxy = make_proxy({"rules": [{"name": "f", "match": {"method": "tools/list"}, "fault": fault}]}, to=mcp_strict)
    async with client(proxy.url + "/mcp") as session:
        listed = {tool.name: tool for tool in (await session.list_tools()).tools}
        results = [visible(await session.call_tool(name, args)) for name, args in CALLS]
    assert {name: tool.description for name, tool in listed.items() if name in schemas} != {
        name: None for name in schemas}
    assert results == clean
    [line] = proxy.events("fault")
    assert line["perturbed_digest"] != line["original_digest"]


@pytest.mark.parametrize("fault,purpose", [
    ({"type": "typos", "rate": 0.5, "respect_schema": False}, "Invalid structured content"),
    ({"type": "wrong_data", "count": 4, "respect_schema": False}, "Invalid structured content"),
    ({"type": "oversize", "bytes": 4000, "respect_schema": False}, "Invalid structured content"),
    ({"type": "schema_drift", "mode": "rename"}, "Invalid structured content"),
    ({"type": "error_in_success", "structured": "error"}, "Invalid structured content"),
])
async def test_breaking_the_schema_stays_available_on_purpose(make_proxy, mcp_strict, fault, purpose):
    proxy = make_proxy({"rules": [{"name": "f", "match": {"tool": "ticket"}, "fault": fault}]}, to=mcp_strict)
    async with client(proxy.url + "/mcp") as session:
        with pytest.raises(RuntimeError, match=purpose):
            for n in range(1, 6):
                await session.call_tool("ticket", {"n": n})


async def test_a_failing_tool_passed_off_as_a_success_gets_valid_structured_content(make_proxy, mcp_strict):
    proxy = make_proxy({"rules": [{"name": "f", "match": {"tool": "broken_ticket"},
                                   "fault": {"type": "flip_is_error", "direction": "to_success"}}]}, to=mcp_strict)
    async with client(proxy.url + "/mcp") as session:
        schema = {t.name: t.output_schema for t in (await session.list_tools()).tools}["broken_ticket"]
        lied_first = await session.call_tool("broken_ticket", {"n": 4})  # a made-up instance, if one fits
        real = await session.call_tool("ticket", {"n": 4})
        lied = await session.call_tool("broken_ticket", {"n": 4})  # a real result of its twin
    assert lied.is_error is False and lied.content[0].text == "Error executing tool broken_ticket"
    assert lied.structured_content == real.structured_content
    assert strict_check(schema, lied.structured_content) == []
    assert lied_first.is_error is True  # no instance made up fits the schema's pattern: not lied about
    assert [line["event"] for line in proxy.events() if line.get("tool") == "broken_ticket"
            and line["event"] in ("fault", "skip")] == ["skip", "fault"]


# --- Every fault that fires changes what the agent receives (engine level, many seeds) -----------

STRICT_SCHEMA = {
    "type": "object", "additionalProperties": False, "required": ["id", "status", "title", "note"],
    "properties": {"id": {"type": "string", "format": "uuid"}, "status": {"enum": ["open", "closed"]},
                   "title": {"type": "string"}, "note": {"type": "string"},
                   "tags": {"type": "array", "items": {"type": "string"}}, "seen": {"type": "integer"}}}
TOOLS = [{"name": "ticket", "description": "Get a ticket. Returns its status.", "outputSchema": STRICT_SCHEMA,
          "inputSchema": {"type": "object", "properties": {"n": {"type": "integer"}, "q": {"type": "string"}}}},
         {"name": "search", "description": "Search the web.", "inputSchema": {"type": "object", "properties": {
             "query": {"type": "string", "description": "What to look for."}}}}]
RESULT = {"id": "00000000-0000-0000-0000-000000000001", "status": "open", "title": "Printer jams on floor two",
          "note": "It jams every second page since Monday.", "tags": ["printer", "floor two"], "seen": 3}
PARAMS: dict[str, dict[str, Any]] = {
    "latency": {"delay_ms": 1}, "remove_tool": {"tool": "search"}, "tool_flood": {"count": 2},
    "oversize": {"bytes": 2000}, "truncate_text": {"fraction": 0.5}, "misleading_description": {"claim": "cost"},
    "schema_drift": {"mode": "retype"}, "noise": {"rate": 0.2}, "typos": {"rate": 0.2}, "truncate": {"fraction": 0.5},
    "rename_tool": {"style": "abbreviate"}, "agent_card_drift": {"rename": 1},
}


class _Kept(io.BytesIO):
    """A log sink that keeps its bytes readable after the log closes it."""

    def close(self) -> None:
        pass


def _engine(fault: dict[str, Any], seed: int) -> tuple[Engine, io.BytesIO]:
    out = _Kept()
    rules = [{"name": "f", "fault": fault}]
    return Engine(parse_scenario(yaml.safe_dump({"rules": rules})), seed=seed,
                  log=PerturbationLog(out, run_id="t", seed=seed)), out


def _exchange(engine: Engine, request: dict[str, Any], result: Any, n: int) -> None:
    asked = Message("http", Phase.REQUEST, session="s", http_method="POST", path="/mcp",
                    headers={"Content-Type": "application/json"}, body=orjson.dumps(request))
    engine.decide(asked)
    answer = result if isinstance(result, bytes) else orjson.dumps({"jsonrpc": "2.0", "id": n, "result": result})
    reply = Message("http", Phase.RESPONSE, session="s", request=asked, status=200,
                    headers={"Content-Type": "application/json"}, body=answer)
    engine.decide(reply)


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_every_fault_that_fires_changes_the_payload_and_the_digests_prove_it(name):
    fault = {"type": name, **PARAMS.get(name, {})}
    text = json.dumps(RESULT, indent=2)
    changed = 0
    for seed in range(40):
        engine, out = _engine(fault, seed)
        _exchange(engine, {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, {"tools": copy.deepcopy(TOOLS)}, 1)
        for n in range(2, 5):
            _exchange(engine, {"jsonrpc": "2.0", "id": n, "method": "tools/call", "params": {
                "name": "ticket", "arguments": {"n": n}}}, {"content": [{"type": "text", "text": text}],
                                                             "structuredContent": {**RESULT, "seen": n}}, n)
        _exchange(engine, {"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": {"name": "search"}},
                  {"content": [{"type": "text", "text": "Lighthouses of Brittany: 12 results."}]}, 9)
        engine.log.close()
        for line in map(json.loads, out.getvalue().splitlines()):
            if line.get("event") == "fault" and "perturbed_digest" in line:
                changed += 1
                assert line["perturbed_digest"] != line.get("original_digest"), (seed, line)
    payload_faults = {"typos", "noise", "oversize", "truncate_text", "inject_text", "wrong_data", "flip_is_error",
                      "error_in_success", "schema_drift", "misleading_description", "paraphrase_description",
                      "poison_description", "rename_tool", "duplicate_tool", "distractor_tool", "tool_flood",
                      "remove_tool", "input_schema_drift"}
    if name in payload_faults:
        assert changed > 0, f"{name} never fired on the sample exchanges"


def test_a_retype_that_would_change_nothing_does_not_fire():
    """schema_drift retype never draws a key's own type, and leaves untouched text byte for byte."""
    for seed in range(30):
        engine, out = _engine({"type": "schema_drift", "mode": "retype", "keys": ["title"]}, seed)
        text = '{"title":  "kept as sent", "other": 1}'
        _exchange(engine, {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "t"}},
                  {"content": [{"type": "text", "text": text}, {"type": "text", "text": '{"x": 1}'}]}, 2)
        engine.log.close()
        [line] = [json.loads(raw) for raw in out.getvalue().splitlines() if b'"fault"' in raw]
        assert line["perturbed_digest"] != line["original_digest"]


def test_a_rewrite_equal_to_the_original_is_not_fired():
    """Typos at rate 0 change nothing: no fault line, and the message is passed on untouched."""
    engine, out = _engine({"type": "typos", "rate": 0}, 1)
    _exchange(engine, {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "t"}},
              {"content": [{"type": "text", "text": "hello"}]}, 2)
    engine.log.close()
    assert b'"fault"' not in out.getvalue()


async def test_gates_count_only_the_messages_a_fault_can_change(make_proxy, mcp_http):
    """`after: 1` with no method: the initialize and tools/list replies do not use it up."""
    proxy = make_proxy({"rules": [{"name": "t", "after": 1, "first": 1, "fault": {"type": "typos", "rate": 1}}]},
                       to=mcp_http)
    async with client(proxy.url + "/mcp") as session:
        await session.list_tools()
        first, second, third = [visible(await session.call_tool("search", {"query": "chaos", "limit": 2}))
                                for _ in range(3)]
    assert first == third != second
    [line] = proxy.events("fault")
    assert (line["method"], line["match_index"]) == ("tools/call", 2)
