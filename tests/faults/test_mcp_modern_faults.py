"""The faults on what MCP 2026-07-28 and its extensions add, seen from the real Python SDK client (2.3)
against an SDK server that uses each feature (tests/helpers/modern_server.py), on streamable HTTP and on stdio:
the client meets the documented failure, what the fault does not touch keeps working, and the fault's
log line is on the call it hit."""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp.client._input_required import InputRequiredRoundsExceededError
from mcp.client.caching import CacheConfig, InMemoryResponseCacheStore
from mcp.client.subscriptions import SubscriptionLost
from mcp.shared.exceptions import MCPError

from tests.helpers.modern_server import QUESTION, REPORT
from tests.helpers.modern_support import POLL_LIMIT, Asker, TasksClient, modern, serve_http, stdio_params
from tests.helpers.stdio_support import scenario_file
from tests.helpers.support import log_events

TRANSPORTS = ["http", "stdio"]
QUIET_S = 1.0  # how long a subscription must stay silent to show a notification never came
LOG_WAIT_S = 10.0  # how long a stdio relay may take to finish its log once the client has left
LOG_QUIET_S = 0.5  # (longer than the relay's batch of call lines, 0.25 s)
names = itertools.count()


@dataclass
class Run:
    """What a proxied session left: its perturbation log (read once the session is over)."""

    events: Callable[..., list[dict[str, Any]]]

    def faults(self, fault: str) -> list[dict[str, Any]]:
        return [event for event in self.events("fault") if event["fault"] == fault]

    def calls(self, method: str) -> list[dict[str, Any]]:
        return [event for event in self.events("call") if event.get("method") == method]


@pytest.fixture(scope="module")
def modern_http() -> Iterator[str]:
    with serve_http() as url:
        yield url


@pytest.fixture(scope="module")
def cached_http() -> Iterator[str]:
    """The server with a minute's private cache hints on its lists (for cacheScope)."""
    with serve_http(*CACHED) as url:
        yield url


CACHED = ("--cache-ttl-ms", "60000", "--cache-scope", "private")


@pytest.fixture
def through(make_proxy: Any, modern_http: str, cached_http: str, tmp_path: Path) -> Any:
    """`through(transport, *rules, cached=False, **client options)`: an SDK client (2026-07-28 era) through
    a proxy with these rules in front of the modern server; yields (client, Run)."""

    @contextlib.asynccontextmanager
    async def open_(transport: str, *rules: dict[str, Any], cached: bool = False,
                    **options: Any) -> AsyncIterator[tuple[Any, Run]]:
        if transport == "http":
            proxy = make_proxy({"rules": list(rules)}, to=cached_http if cached else modern_http)
            async with modern(proxy.url + "/mcp", **options) as client:
                yield client, Run(proxy.events)
        else:
            log = tmp_path / f"stdio-{next(names)}.jsonl"
            params = stdio_params(log, scenario_file(tmp_path, *rules), *(CACHED if cached else ()))
            async with modern(params, **options) as client:
                yield client, Run(lambda kind=None: ended_log(log, kind))

    return open_


def ended_log(log: Path, kind: str | None) -> list[dict[str, Any]]:
    """The lines of a stdio relay's log once it is done writing: the relay flushes its last batch of call
    lines as it exits, which may be just after the client saw it go (no growth for LOG_QUIET_S)."""
    deadline = time.monotonic() + LOG_WAIT_S
    size, since = -1, time.monotonic()
    while time.monotonic() - since < LOG_QUIET_S:
        assert time.monotonic() < deadline, "the stdio relay's log kept growing"
        if (now := log.stat().st_size) != size:
            size, since = now, time.monotonic()
        time.sleep(0.05)
    return log_events(log, kind)


def fired_on_call(run: Run, rule: str, method: str) -> None:
    """The rule's fault is attached to a call of `method` in the call log."""
    assert any(rule in call["faults"] for call in run.calls(method)), run.calls(method)


# --- input_required_loop -------------------------------------------------------------------------

@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_question_asked_for_ever_makes_the_client_give_up(through, transport):
    asker = Asker()
    loop = {"name": "ask-again", "fault": {"type": "input_required_loop"}}
    async with through(transport, loop, elicitation_callback=asker, input_required_max_rounds=3) as (client, run):
        with pytest.raises(InputRequiredRoundsExceededError):
            await client.call_tool("deploy", {"target": "staging"})
        weather = await client.call_tool("weather", {"city": "Oslo"})  # the session is fine
    assert asker.asked == [QUESTION.format(target="staging")] * 3
    assert weather.content[0].text == "Oslo: 21 C, clear"
    lines = run.faults("input_required_loop")
    assert [(line["method"], line["tool"], line["effect"]["asked_again"]) for line in lines] == [
        ("tools/call", "deploy", 1), ("tools/call", "deploy", 2), ("tools/call", "deploy", 3)]
    assert lines[0]["effect"]["questions"] == {"confirm": "elicitation/create"}
    fired_on_call(run, "ask-again", "tools/call")


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_question_asked_twice_more_is_answered_and_the_call_completes(through, transport):
    asker = Asker()
    loop = {"name": "ask-twice", "fault": {"type": "input_required_loop", "rounds": 2}}
    async with through(transport, loop, elicitation_callback=asker) as (client, run):
        result = await client.call_tool("deploy", {"target": "staging"})
    assert result.content[0].text == "deployed to staging"
    assert len(asker.asked) == 3
    assert [line["effect"]["asked_again"] for line in run.faults("input_required_loop")] == [1, 2]


# --- input_required_stale ------------------------------------------------------------------------

@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_an_answer_whose_request_state_is_called_expired_fails_the_call(through, transport):
    asker = Asker()
    stale = {"name": "expired", "fault": {"type": "input_required_stale"}}
    async with through(transport, stale, elicitation_callback=asker) as (client, run):
        with pytest.raises(MCPError) as failed:
            await client.call_tool("deploy", {"target": "staging"})
        weather = await client.call_tool("weather", {"city": "Lima"})
    assert (failed.value.error.code, failed.value.error.message) == (-32602, "Invalid or expired requestState")
    assert len(asker.asked) == 1  # it was asked, answered, and the answer refused
    assert weather.content[0].text == "Lima: 21 C, clear"
    [line] = run.faults("input_required_stale")
    assert (line["method"], line["tool"], line["action"], line["effect"]["error"]["code"]) == (
        "tools/call", "deploy", "reply", -32602)
    fired_on_call(run, "expired", "tools/call")


# --- content faults on the questions --------------------------------------------------------------

@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_typos_reach_the_question_and_the_answer_still_completes_the_call(through, transport):
    asker = Asker()
    typos = {"name": "typo-question", "first": 1, "fault": {"type": "typos", "rate": 0.3}}
    async with through(transport, typos, elicitation_callback=asker) as (client, run):
        result = await client.call_tool("deploy", {"target": "staging"})
    asked = QUESTION.format(target="staging")
    [question] = asker.asked
    assert question != asked and len(question) in range(len(asked) - 10, len(asked) + 10)
    assert result.content[0].text == "deployed to staging"  # schema and requestState kept: the answer fits
    [line] = run.faults("typos")
    assert list(line["effect"]["changed"]) == ["result.inputRequests.confirm.params.message"]


# --- stale_cache ----------------------------------------------------------------------------------

@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_long_ttl_keeps_a_retired_tool_listed_until_the_agent_refreshes(through, transport):
    tool = f"gauge_{next(names)}"
    stale = {"name": "long-ttl", "match": {"method": "tools/list"}, "fault": {"type": "stale_cache"}}
    async with through(transport, stale) as (client, run):
        await client.call_tool("spawn", {"name": tool})
        before = await client.list_tools()
        await client.call_tool("retire", {"name": tool})
        cached = await client.list_tools()  # served from the client's cache: the server is not asked
        gone = await client.call_tool(tool, {"text": "x"})
        refreshed = await client.list_tools(cache_mode="refresh")  # the recovery: ask again
    assert (before.ttl_ms, cached.ttl_ms) == (3_600_000, 3_600_000)
    assert tool in [t.name for t in cached.tools] and tool not in [t.name for t in refreshed.tools]
    assert gone.is_error and "Unknown tool" in gone.content[0].text
    # each listing the server made (the SDK client also lists after its first call) said a long ttl
    listings = run.calls("tools/list")
    assert [line["effect"]["ttlMs"] for line in run.faults("stale_cache")] == [[0, 3_600_000]] * len(listings)
    fired_on_call(run, "long-ttl", "tools/list")


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_without_the_fault_the_client_sees_the_tool_go(through, transport):
    tool = f"gauge_{next(names)}"
    async with through(transport) as (client, run):
        await client.call_tool("spawn", {"name": tool})
        await client.list_tools()
        await client.call_tool("retire", {"name": tool})
        after = await client.list_tools()
    assert tool not in [t.name for t in after.tools] and after.ttl_ms == 0
    assert not run.events("fault")


# --- cache_scope_flip -----------------------------------------------------------------------------

@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("flipped", [True, False])
async def test_a_private_listing_called_public_is_served_to_another_user(through, transport, flipped):
    store = InMemoryResponseCacheStore()
    rules = [{"name": "scope-flip", "match": {"method": "tools/list"}, "fault": {"type": "cache_scope_flip"}}] \
        if flipped else []

    def cache(user: str) -> CacheConfig:
        return CacheConfig(store=store, partition=user, share_public=True, target_id="modern-tools")

    async with through(transport, *rules, cached=True, cache=cache("alice")) as (alice, alice_run):
        listed = await alice.list_tools()
    async with through(transport, *rules, cached=True, cache=cache("bob")) as (bob, bob_run):
        seen = await bob.list_tools()
    assert listed.cache_scope == ("public" if flipped else "private")
    assert [t.name for t in seen.tools] == [t.name for t in listed.tools]
    # bob's listing came from alice's cache entry when it was called public: the server never saw him ask
    assert len(bob_run.calls("tools/list")) == (0 if flipped else 1)
    if flipped:  # (each listing alice's session made: the SDK client also lists after its first call)
        assert {(line["method"], line["component"], str(line["effect"])) for line in alice_run.faults(
            "cache_scope_flip")} == {("tools/list", "reward", str({"cacheScope": ["private", "public"]}))}


# --- header_mismatch ------------------------------------------------------------------------------

@pytest.mark.parametrize("fault,message", [
    ({"type": "header_mismatch"}, "Mcp-Name header does not match"),
    ({"type": "header_mismatch", "side": "body"}, "Mcp-Name header does not match"),
    ({"type": "header_mismatch", "header": "method"}, "Mcp-Method header does not match"),
])
async def test_a_mirrored_header_that_disagrees_gets_the_servers_32020(through, fault, message):
    rule = {"name": "mismatch", "match": {"method": "tools/call"}, "fault": fault}
    async with through("http", rule) as (client, run):
        with pytest.raises(MCPError) as failed:
            await client.call_tool("weather", {"city": "Oslo"})
        listed = await client.list_tools()  # other requests pass
    assert failed.value.error.code == -32020 and message.lower() in failed.value.error.message.lower()
    assert "weather" in [t.name for t in listed.tools]
    # the client re-listed its tools and sent the call once more, as the SDK does on -32020: both hit
    lines = run.faults("header_mismatch")
    assert [(line["method"], line["action"]) for line in lines] == [("tools/call", "rewrite")] * 2
    assert lines[0]["effect"]["changed"] == fault.get("side", "header")
    assert run.calls("tools/list")
    fired_on_call(run, "mismatch", "tools/call")


async def test_after_one_mismatch_the_clients_relist_and_resend_recovers(through):
    rule = {"name": "mismatch-once", "first": 1, "match": {"method": "tools/call"},
            "fault": {"type": "header_mismatch"}}
    async with through("http", rule) as (client, run):
        result = await client.call_tool("weather", {"city": "Oslo"})
    assert result.content[0].text == "Oslo: 21 C, clear"
    assert len(run.faults("header_mismatch")) == 1


async def test_on_stdio_there_is_no_header_to_disagree_and_nothing_fires(through):
    rule = {"name": "mismatch", "fault": {"type": "header_mismatch"}}
    async with through("stdio", rule) as (client, run):
        result = await client.call_tool("weather", {"city": "Oslo"})
    assert result.content[0].text == "Oslo: 21 C, clear" and not run.events("fault")


# --- subscription_drop ----------------------------------------------------------------------------

async def events_within(subscription: Any, seconds: float) -> list[Any]:
    """The events a subscription yields within `seconds` (ending early when it ends)."""
    seen: list[Any] = []
    with anyio.move_on_after(seconds):
        async for event in subscription:
            seen.append(type(event).__name__)
    return seen


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_dropped_list_changed_never_reaches_the_agent(through, transport):
    tool = f"gauge_{next(names)}"
    drop = {"name": "lose-changes", "fault": {"type": "subscription_drop",
                                              "notifications": ["notifications/tools/list_changed"]}}
    async with through(transport, drop) as (client, run):
        async with client.listen(tools_list_changed=True, resource_subscriptions=["note://greeting"]) as sub:
            await client.call_tool("spawn", {"name": tool})
            await client.call_tool("touch", {"uri": "note://greeting"})
            seen = await events_within(sub, QUIET_S)
    assert seen == ["ResourceUpdated"]  # the tool's arrival was never told; the resource update was
    [line] = run.faults("subscription_drop")
    assert (line["method"], line["action"]) == ("notifications/tools/list_changed", "drop")


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("end", ["lost", "closed"])
async def test_a_subscription_ended_at_a_change(through, transport, end):
    tool = f"gauge_{next(names)}"
    cut = {"name": "end-listen", "fault": {"type": "subscription_drop", "end": end}}
    async with through(transport, cut) as (client, run):
        async with client.listen(tools_list_changed=True) as sub:
            await client.call_tool("spawn", {"name": tool})
            if end == "lost":
                with pytest.raises(SubscriptionLost):
                    await events_within(sub, 5)
            else:
                assert await events_within(sub, 5) == []  # the loop simply ends
        weather = await client.call_tool("weather", {"city": "Rome"})
    assert weather.content[0].text == "Rome: 21 C, clear"
    [line] = run.faults("subscription_drop")
    assert (line["method"], line["effect"]["ended"]) == ("notifications/tools/list_changed", end)


# --- era_downgrade --------------------------------------------------------------------------------

@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_server_that_knows_no_discover_makes_the_client_fall_back(through, transport):
    old = {"name": "old-server", "fault": {"type": "era_downgrade"}}
    async with through(transport, old) as (client, run):
        era = client.protocol_version
        result = await client.call_tool("weather", {"city": "Kyiv"})
    assert era == "2025-11-25"
    assert result.content[0].text == "Kyiv: 21 C, clear"
    [line] = run.faults("era_downgrade")
    assert (line["method"], line["effect"]["error"]["code"]) == ("server/discover", -32601)
    fired_on_call(run, "old-server", "server/discover")


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_client_pinned_to_2026_fails_when_the_version_is_refused(through, transport):
    refuse = {"name": "no-2026", "fault": {"type": "era_downgrade", "answer": "unsupported_version"}}
    async with through(transport, refuse, mode="2026-07-28") as (client, run):
        with pytest.raises(MCPError) as failed:
            await client.call_tool("weather", {"city": "Kyiv"})
    assert failed.value.error.code == -32022
    assert failed.value.error.data == {"supported": ["2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"],
                                       "requested": "2026-07-28"}
    fired_on_call(run, "no-2026", "tools/call")


# --- the Tasks extension --------------------------------------------------------------------------

@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_lost_task_fails_its_poll_with_not_found(through, transport):
    tasks = TasksClient()
    lost = {"name": "forgotten", "after": 1, "fault": {"type": "task_lost"}}
    async with through(transport, lost, extensions=[tasks]) as (client, run):
        with pytest.raises(MCPError) as failed:
            await client.call_tool("report", {"polls": 3})
        weather = await client.call_tool("weather", {"city": "Bern"})
    assert (failed.value.error.code, failed.value.error.message) == (-32602, "Failed to retrieve task: Task not found")
    assert tasks.polls == ["working"]  # the first poll passed (after: 1), the second was lost
    assert weather.content[0].text == "Bern: 21 C, clear"
    [line] = run.faults("task_lost")
    assert line["method"] == "tasks/get"
    fired_on_call(run, "forgotten", "tasks/get")


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_task_completes_through_an_idle_proxy(through, transport):
    tasks = TasksClient()
    async with through(transport, extensions=[tasks]) as (client, run):
        result = await client.call_tool("report", {"polls": 2})
    assert result.content[0].text == REPORT and tasks.polls == ["working", "working", "completed"]
    assert len(run.calls("tasks/get")) == 3 and not run.events("fault")


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_stuck_task_keeps_working_until_the_client_gives_up(through, transport):
    tasks = TasksClient()
    stuck = {"name": "never-done", "fault": {"type": "task_stuck"}}
    async with through(transport, stuck, extensions=[tasks]) as (client, run):
        with pytest.raises(TimeoutError):
            await client.call_tool("report", {"polls": 1})
        weather = await client.call_tool("weather", {"city": "Bern"})
    assert tasks.polls == ["working"] * POLL_LIMIT
    assert weather.content[0].text == "Bern: 21 C, clear"
    lines = run.faults("task_stuck")  # from the poll that would have said completed on: each one held
    assert len(lines) == POLL_LIMIT - 1 and {line["method"] for line in lines} == {"tasks/get"}
    assert lines[0]["effect"] == {"state": "working"}
    fired_on_call(run, "never-done", "tasks/get")
