"""Action-space faults (the tool registry the agent chooses from), seen from the real Python SDK client."""

from __future__ import annotations

import asyncio
import copy
import io
import random
from typing import Any

import pytest
import yaml
from mcp.shared.exceptions import MCPError

from chaosproxy.engine.core import Engine
from chaosproxy.engine.message import Message, Phase
from chaosproxy.engine.scenario import ScenarioError, parse_scenario
from chaosproxy.faults.unknown_tool import misspell
from chaosproxy.telemetry.log import PerturbationLog
from tests.helpers.mcp_support import client, serve
from tests.helpers.support import rule

ERAS = ["auto", "legacy"]  # the 2026-07-28 era (Mcp-Name headers) and the handshake era
DEMO_TOOLS = ["search", "weather", "add", "count", "fail"]


def names(listed: Any) -> list[str]:
    return [tool.name for tool in listed.tools]


def text(result: Any) -> str:
    return result.content[0].text


def fault_events(proxy: Any, method: str) -> list[dict[str, Any]]:
    return [event for event in proxy.events("fault") if event["method"] == method]


# duplicate_tool

@pytest.mark.parametrize("mode", ERAS)
async def test_a_duplicate_is_listed_beside_the_real_tool_and_calls_go_upstream(make_proxy, mcp_http, mode):
    proxy = make_proxy(rule("twin", {"type": "duplicate_tool", "tool": "weather"}), to=mcp_http)
    async with client(proxy.url + "/mcp", mode) as session:
        listed = await session.list_tools()
        result = await session.call_tool("weather", {"city": "Lima"})
    assert names(listed) == ["search", "weather", "weather", "add", "count", "fail"]
    first, second = listed.tools[1:3]
    assert first.model_dump() == second.model_dump()
    assert result.structured_content == {"city": "lima", "temp_c": 22, "sky": "clear"}
    [fired] = proxy.events("fault")  # the listing; route real leaves the call alone
    assert (fired["fault"], fired["component"], fired["method"], fired["action"]) == (
        "duplicate_tool", "action", "tools/list", "rewrite")


@pytest.mark.parametrize("variant", ["no_description", "wrong_description", "wrong_parameters", "swapped"])
async def test_duplicate_variants_change_what_the_copy_says(make_proxy, mcp_http, variant):
    proxy = make_proxy(rule("twin", {"type": "duplicate_tool", "variant": variant, "position": "before"}),
                       to=mcp_http)
    async with client(proxy.url + "/mcp") as session:
        listed = await session.list_tools()
    copy_, real = listed.tools[:2]  # unset tool: the first listed (search), the copy before it
    assert copy_.name == real.name == "search"
    others = {tool.name: tool for tool in listed.tools[2:]}
    if variant == "no_description":
        assert copy_.description is None and copy_.input_schema == real.input_schema
        return
    [donor] = [t for t in others.values()
               if copy_.description == t.description or copy_.input_schema == t.input_schema]
    assert (copy_.description == donor.description) == (variant != "wrong_parameters")
    assert (copy_.input_schema == donor.input_schema) == (variant != "wrong_description")
    assert copy_.output_schema == real.output_schema  # one name, one result shape


@pytest.mark.parametrize("server,path,mode", [("mcp_http", "/mcp", "auto"), ("mcp_sse", "/sse", "legacy")])
async def test_a_duplicate_answered_by_a_stub_gives_a_result_that_passes_validation(
        request, make_proxy, server, path, mode):
    twin = {"type": "duplicate_tool", "tool": "weather", "route": "stub"}
    proxy = make_proxy(rule("twin", twin), to=request.getfixturevalue(server))
    async with client(proxy.url + path, mode) as session:
        await session.list_tools()
        result = await session.call_tool("weather", {"city": "Lima"})  # the SDK checks the outputSchema
    assert not result.is_error
    assert result.structured_content == {"city": "ok", "temp_c": 1, "sky": "ok"}
    [call] = fault_events(proxy, "tools/call")
    assert (call["rule"], call["tool"], call["action"]) == ("twin", "weather", "reply")


async def test_a_duplicate_answered_by_an_error(make_proxy, mcp_http):
    proxy = make_proxy(rule("twin", {"type": "duplicate_tool", "tool": "add", "route": "error"}), to=mcp_http)
    async with client(proxy.url + "/mcp") as session:
        await session.list_tools()
        result = await session.call_tool("add", {"a": 1, "b": 2})
    assert result.is_error and text(result) == "Error executing tool add"
    assert [e["method"] for e in proxy.events("fault")] == ["tools/list", "tools/call"]


# distractor_tool

@pytest.mark.parametrize("route", ["pass", "degraded", "error"])
async def test_a_distractor_sits_beside_the_real_tool_and_its_calls_are_routed(make_proxy, mcp_http, route):
    lure = {"type": "distractor_tool", "tool": "weather", "route": route}
    proxy = make_proxy(rule("lure", lure), to=mcp_http)
    async with client(proxy.url + "/mcp") as session:
        listed = await session.list_tools()
        result = await session.call_tool("weather_v2", {"city": "Lima"})
        real = await session.call_tool("weather", {"city": "Lima"})
    assert names(listed) == ["search", "weather", "weather_v2", "add", "count", "fail"]
    assert listed.tools[2].description == listed.tools[1].description
    expected = {"pass": (False, {"city": "lima", "temp_c": 22, "sky": "clear"}),
                "degraded": (False, {"city": "", "temp_c": 0, "sky": ""}),
                "error": (True, None)}[route]
    assert (result.is_error, result.structured_content) == expected
    assert real.structured_content == {"city": "lima", "temp_c": 22, "sky": "clear"}
    [call] = fault_events(proxy, "tools/call")  # only the call to the distractor
    assert call["tool"] == "weather_v2"


async def test_a_named_distractor_with_its_own_description(make_proxy, mcp_http):
    proxy = make_proxy(rule("lure", {"type": "distractor_tool", "name": "web_search",
                                     "description": "Search the web (faster)."}), to=mcp_http)
    async with client(proxy.url + "/mcp") as session:
        listed = await session.list_tools()
        result = await session.call_tool("web_search", {"query": "chaos"})
    assert names(listed)[:2] == ["search", "web_search"]
    assert listed.tools[1].description == "Search the web (faster)."
    assert text(result) == "" and result.structured_content == {"result": ""}


# rename_tool

@pytest.mark.parametrize("mode", ERAS)
async def test_a_renamed_tool_works_under_its_new_name_and_the_log_shows_both(make_proxy, mcp_http, mode):
    short = {"type": "rename_tool", "tool": "weather", "style": "abbreviate"}
    proxy = make_proxy(rule("short", short), to=mcp_http)
    async with client(proxy.url + "/mcp", mode) as session:
        listed = await session.list_tools()
        renamed = await session.call_tool("wthr", {"city": "Oslo"})
        old = await session.call_tool("weather", {"city": "Oslo"})  # the old name still reaches upstream
    assert names(listed) == ["search", "wthr", "add", "count", "fail"]
    assert renamed.structured_content == {"city": "oslo", "temp_c": 3, "sky": "clear"}
    assert old.structured_content == renamed.structured_content
    # The SDK lists tools again before validating a result of a tool it was not shown (weather).
    listings = fault_events(proxy, "tools/list")
    assert len(listings) == 2 and listings[0]["params"] == {"tool": "weather", "style": "abbreviate"}
    [call] = fault_events(proxy, "tools/call")
    assert (call["method"], call["tool"], call["action"]) == ("tools/call", "wthr", "rewrite")
    upstream_saw = [c["tool"] for c in proxy.events("call") if c.get("method") == "tools/call"]
    assert upstream_saw == ["weather", "weather"]


@pytest.mark.parametrize("fault,expected", [
    ({"style": "abbreviate"}, ["srch", "wthr", "add", "cnt", "fl"]),  # add is too short to shorten
    ({"style": "case"}, ["Search", "Weather", "Add", "Count", "Fail"]),
    ({"style": "prefix", "prefix": "demo__"}, [f"demo__{n}" for n in DEMO_TOOLS]),
    ({"tool": "add", "to": "sum"}, ["search", "weather", "sum", "count", "fail"]),
    ({"tool": "add", "to": "search"}, None),  # would shadow another tool: nothing is renamed
])
async def test_rename_styles(make_proxy, mcp_http, fault, expected):
    proxy = make_proxy(rule("names", {"type": "rename_tool", **fault}), to=mcp_http)
    async with client(proxy.url + "/mcp") as session:
        listed = await session.list_tools()
        if expected is not None:
            result = await session.call_tool(expected[2], {"a": 2, "b": 3})
            assert result.structured_content == {"result": 5.0}
    assert names(listed) == (expected or DEMO_TOOLS)
    assert len(proxy.events("fault")) == (0 if expected is None else 1 + (expected[2] != "add"))


# remove_tool

async def test_a_tool_is_pulled_after_the_nth_call(make_proxy, mcp_http):
    proxy = make_proxy(rule("rug", {"type": "remove_tool", "tool": "weather", "after_calls": 2}), to=mcp_http)
    async with client(proxy.url + "/mcp") as session:
        before = await session.list_tools()
        await session.call_tool("add", {"a": 1, "b": 1})
        still = await session.list_tools()
        await session.call_tool("weather", {"city": "Paris"})
        after = await session.list_tools()
        hidden = await session.call_tool("weather", {"city": "Paris"})  # hidden, not gone upstream
    assert "weather" in names(before) and "weather" in names(still)
    assert names(after) == ["search", "add", "count", "fail"]
    assert hidden.structured_content == {"city": "paris", "temp_c": 14, "sky": "clear"}
    fired = proxy.events("fault")  # the SDK lists again to validate the hidden tool's result: hidden again
    assert len(fired) == 2
    assert {(e["method"], e["rule"]) for e in fired} == {("tools/list", "rug")}
    assert fired[0]["params"] == {"tool": "weather", "after_calls": 2}


async def test_removed_from_the_start_by_glob(make_proxy, mcp_http):
    proxy = make_proxy(rule("gone", {"type": "remove_tool", "tool": "[sc]*"}), to=mcp_http)
    async with client(proxy.url + "/mcp") as session:
        assert names(await session.list_tools()) == ["weather", "add", "fail"]
    assert len(proxy.events("fault")) == 1


# tool_flood

async def test_a_flood_pads_the_list_with_the_same_plausible_tools_each_time(make_proxy, mcp_http):
    proxy = make_proxy(rule("flood", {"type": "tool_flood", "count": 60}), to=mcp_http)
    async with client(proxy.url + "/mcp") as session:
        first = await session.list_tools()
        again = await session.list_tools()
        added = [tool for tool in first.tools if tool.name not in DEMO_TOOLS]
        result = await session.call_tool(added[0].name, {"id": "42"})
    assert len(first.tools) == 65 and len(set(names(first))) == 65
    assert [n for n in names(first) if n in DEMO_TOOLS] == DEMO_TOOLS  # real tools keep their order
    assert again.model_dump() == first.model_dump()
    assert all(tool.description and tool.input_schema["type"] == "object" for tool in added)
    assert result.is_error and text(result) == f"Error executing tool {added[0].name}"
    assert [e["method"] for e in proxy.events("fault")] == ["tools/list", "tools/list", "tools/call"]


async def test_flood_tools_can_answer_with_a_stub_and_differ_by_seed(make_proxy, mcp_http):
    flood = rule("flood", {"type": "tool_flood", "count": 5, "route": "stub"})
    listings = []
    for seed in (1, 2):
        proxy = make_proxy(flood, to=mcp_http, seed=seed)
        async with client(proxy.url + "/mcp") as session:
            listing = names(await session.list_tools())
            made_up = next(n for n in listing if n not in DEMO_TOOLS)
            assert text(await session.call_tool(made_up, {})) == "OK"
        listings.append(listing)
    assert listings[0] != listings[1]


# unknown_tool

@pytest.mark.parametrize("mode", ERAS)
async def test_a_typo_in_the_called_name_gets_the_upstreams_unknown_tool_error(make_proxy, mcp_http, mode):
    proxy = make_proxy(rule("slip", {"type": "unknown_tool"}, match={"tool": "weather"}), to=mcp_http)
    async with client(proxy.url + "/mcp", mode) as session:
        slipped = await session.call_tool("weather", {"city": "Lima"})
        fine = await session.call_tool("add", {"a": 1, "b": 1})
    assert slipped.is_error and text(slipped).startswith("Unknown tool: ")
    wrong = text(slipped).removeprefix("Unknown tool: ")
    assert wrong != "weather" and one_slip_apart(wrong, "weather")
    assert not fine.is_error
    [fired] = proxy.events("fault")
    assert (fired["fault"], fired["phase"], fired["tool"], fired["action"]) == (
        "unknown_tool", "request", "weather", "rewrite")
    assert [c["tool"] for c in proxy.events("call") if c.get("method") == "tools/call"] == [wrong, "add"]


def one_slip_apart(a: str, b: str) -> bool:
    """One substitution, insertion, omission or transposition of neighbours."""
    if len(a) == len(b):
        diff = [i for i in range(len(a)) if a[i] != b[i]]
        return len(diff) == 1 or (len(diff) == 2 and diff[1] == diff[0] + 1
                                  and a[diff[0]] == b[diff[1]] and a[diff[1]] == b[diff[0]])
    short, long = sorted((a, b), key=len)
    return len(long) == len(short) + 1 and any(long[:i] + long[i + 1:] == short for i in range(len(long)))


@pytest.mark.parametrize("typo", ["substitute", "insert", "omit", "transpose"])
def test_each_kind_of_typo_is_one_slip(typo):
    for seed in range(50):
        wrong = misspell("get_weather", random.Random(seed), typo)
        assert wrong is not None and one_slip_apart(wrong, "get_weather"), wrong
        assert len(wrong) - len("get_weather") == {"insert": 1, "omit": -1}.get(typo, 0)


# Straight against the engine: pagination, and the input left untouched

def engine_for(fault: dict[str, Any]) -> Engine:
    log = PerturbationLog(io.BytesIO(), run_id="t", seed=3)
    return Engine(parse_scenario(yaml.safe_dump(rule("r", fault))), seed=3, log=log)


def tools_list(cursor: str | None, tools: list[str], next_cursor: str | None) -> Message:
    params = {"cursor": cursor} if cursor else {}
    request = Message("http", Phase.REQUEST, session="s")
    request.replace({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": params})
    result: dict[str, Any] = {"tools": [{"name": n, "description": f"{n} things",
                                         "inputSchema": {"type": "object"}} for n in tools]}
    if next_cursor:
        result["nextCursor"] = next_cursor
    response = Message("http", Phase.RESPONSE, session="s", request=request)
    response.replace({"jsonrpc": "2.0", "id": 1, "result": result})
    return response


EVERY_FAULT = [
    {"type": "duplicate_tool", "variant": "swapped", "route": "stub"},
    {"type": "distractor_tool"},
    {"type": "rename_tool", "style": "case"},
    {"type": "remove_tool", "tool": "alpha"},
    {"type": "tool_flood", "count": 3},
]


@pytest.mark.parametrize("fault", EVERY_FAULT, ids=lambda f: f["type"])
def test_pages_keep_their_cursor_and_the_input_is_never_mutated(fault):
    engine = engine_for(fault)
    first, later = tools_list(None, ["alpha", "beta"], "page-2"), tools_list("page-2", ["gamma"], None)
    original = first.rpc
    snapshot = copy.deepcopy(original)
    assert engine.decide(first)
    assert original == snapshot
    assert first.rpc["result"]["nextCursor"] == "page-2"
    before = copy.deepcopy(later.rpc)
    engine.decide(later)
    added = {t["name"] for t in later.rpc["result"]["tools"]} - {"gamma", "Gamma"}
    assert not added  # nothing is added on later pages
    if fault["type"] != "rename_tool":
        assert later.rpc == before


def test_unknown_tool_leaves_the_request_dict_alone():
    engine = engine_for({"type": "unknown_tool"})
    request = Message("http", Phase.REQUEST, session="s")
    request.replace({"jsonrpc": "2.0", "id": 5, "method": "tools/call",
                     "params": {"name": "search", "arguments": {}}})
    original = request.rpc
    snapshot = copy.deepcopy(original)
    [fired] = engine.decide(request)
    assert original == snapshot and request.tool != "search"
    assert not engine.decide(Message("http", Phase.REQUEST, session="s", body=b'{"jsonrpc":"2.0","id":6,'
                                                                            b'"method":"tools/list"}'))


# Parameters

@pytest.mark.parametrize("fault,reason", [
    ("{type: duplicate_tool, variant: mirrored}", "'identical', 'no_description'"),
    ("{type: duplicate_tool, route: upstream}", "'real', 'stub' or 'error'"),
    ("{type: distractor_tool, tool: 'get_*', name: lookalike}", "is a glob"),
    ("{type: distractor_tool, tool: search, name: search}", "own name"),
    ("{type: distractor_tool, route: stub}", "'pass', 'degraded' or 'error'"),
    ("{type: rename_tool}", "either style"),
    ("{type: rename_tool, style: case, to: x, tool: y}", "either style"),
    ("{type: rename_tool, style: prefix}", "needs prefix"),
    ("{type: rename_tool, style: case, prefix: x_}", "only applies with style: prefix"),
    ("{type: rename_tool, to: lookup}", "is a glob"),
    ("{type: rename_tool, tool: add, to: add}", "own name"),
    ("{type: rename_tool, style: shout}", "'abbreviate', 'case' or 'prefix'"),
    ("{type: remove_tool}", "tool: Field required"),
    ("{type: remove_tool, tool: x, after_calls: -1}", "greater than or equal to 0"),
    ("{type: tool_flood, count: 0}", "greater than or equal to 1"),
    ("{type: tool_flood, count: 100000}", "less than or equal to 1000"),
    ("{type: tool_flood}", "count: Field required"),
    ("{type: unknown_tool, typo: sneeze}", "'any', 'substitute', 'insert', 'omit' or 'transpose'"),
])
def test_bad_parameters_are_rejected_with_line_and_reason(fault, reason):
    text_ = f"rules:\n  - name: a\n    fault: {fault}\n"
    with pytest.raises(ScenarioError) as caught:
        parse_scenario(text_, "s.yaml")
    problems = caught.value.problems
    assert any(p.startswith("s.yaml:3: ") and reason in p for p in problems), problems


@pytest.mark.slow
@pytest.mark.parametrize("server_flags", [(), ("--json-response",)], ids=["sse-reply", "json-reply"])
async def test_rug_pull_announces_itself_with_list_changed(make_proxy, server_flags):
    """remove_tool with notify: the reply to the triggering call carries notifications/tools/list_changed."""
    changed: list[str] = []

    async def on_message(message) -> None:
        if getattr(message, "method", None) == "notifications/tools/list_changed":
            changed.append(message.method)

    with serve("http", *server_flags) as url:
        proxy = make_proxy({"rules": [{"name": "rug-pull", "fault": {
            "type": "remove_tool", "tool": "weather", "after_calls": 2, "notify": True}}]}, to=url)
        async with client(proxy.url + "/mcp", "legacy", message_handler=on_message) as session:
            assert "weather" in {t.name for t in (await session.list_tools()).tools}
            await session.call_tool("add", {"a": 1, "b": 2})
            assert not changed
            await session.call_tool("add", {"a": 1, "b": 2})
            for _ in range(50):
                if changed:
                    break
                await asyncio.sleep(0.02)
            assert changed == ["notifications/tools/list_changed"]
            assert "weather" not in {t.name for t in (await session.list_tools()).tools}
    actions = [f["action"] for f in proxy.events("fault")]
    assert actions.count("notify") == 1


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_input_schema_drift_renames_a_parameter_and_refuses_the_old_shape(make_proxy, mcp_http, mode):
    proxy = make_proxy({"rules": [{"name": "drift", "match": {"method": "tools/list"}, "fault": {
        "type": "input_schema_drift", "tool": "weather", "parameter": "city", "reject_old": True}}]}, to=mcp_http)
    async with client(proxy.url + "/mcp", mode) as session:
        weather = next(t for t in (await session.list_tools()).tools if t.name == "weather")
        assert set(weather.input_schema["properties"]) == {"city_v2"}
        assert weather.input_schema["required"] == ["city_v2"]
        result = await session.call_tool("weather", {"city_v2": "Oslo"})  # renamed back upstream
        assert result.structured_content["city"] == "oslo"
        with pytest.raises(MCPError) as refused:
            await session.call_tool("weather", {"city": "Oslo"})
    assert refused.value.error.code == -32602 and "'city'" in refused.value.error.message
    assert [f["action"] for f in proxy.events("fault")] == ["rewrite", "rewrite", "reply"]


@pytest.mark.parametrize("fault,check", [
    ({"mode": "retype", "parameter": "a"}, lambda schema: schema["properties"]["a"]["type"] == "string"),
    ({"mode": "require", "parameter": "interval_ms", "tool": "count"},
     lambda schema: "interval_ms" in schema["required"]),
])
async def test_input_schema_drift_retypes_or_requires(make_proxy, mcp_http, fault, check):
    tool = fault.get("tool", "add")
    proxy = make_proxy({"rules": [{"name": "drift", "fault": {"type": "input_schema_drift", "tool": tool, **fault}}]},
                       to=mcp_http)
    async with client(proxy.url + "/mcp") as session:
        listed = next(t for t in (await session.list_tools()).tools if t.name == tool)
    assert check(listed.input_schema)


def test_input_schema_drift_refuses_reject_old_without_rename():
    with pytest.raises(ScenarioError, match="reject_old applies to mode rename"):
        parse_scenario("rules:\n  - name: d\n    fault: {type: input_schema_drift, mode: retype, reject_old: true}\n")
