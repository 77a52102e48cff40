"""`chaosproxy stdio` with messages held by faults, through the real SDK client: a held call holds no
other, notifications stay before the reply they precede, what is held is bounded in bytes when the
host stops reading, and a server that dies while a reply is held is seen dying at once."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError

from tests.helpers.stdio_support import (
    TEST_SERVER,
    WAIT,
    peak_rss_mib,
    proxied,
    relay_pid,
    scenario_file,
    stalling_host,
)
from tests.helpers.support import log_events

HOLD_S = 3.0
HELD = {  # each holds a call to `search` for HOLD_S, in one of the ways a fault can
    "hang-released": {"type": "hang", "release_after_ms": HOLD_S * 1000},
    "timeout": {"type": "timeout", "after_ms": HOLD_S * 1000},
    "late-request": {"type": "latency", "delay_ms": HOLD_S * 1000},
    "late-reply": {"type": "latency", "delay_ms": HOLD_S * 1000, "phase": "response"},
}


@pytest.mark.parametrize("fault", HELD.values(), ids=HELD.keys())
async def test_a_held_call_holds_no_other(tmp_path: Path, fault: dict[str, Any]):
    log = tmp_path / "log.jsonl"
    scenario = scenario_file(tmp_path, {"name": "held", "match": {"tool": "search"}, "fault": fault})
    outcome: dict[str, Any] = {}

    async def held_call(session: Client) -> None:
        started = time.monotonic()
        try:
            outcome["search"] = await session.call_tool("search", {"query": "held"})
        except MCPError as exc:
            outcome["search"] = exc
        outcome["search_s"] = time.monotonic() - started

    with anyio.fail_after(WAIT):
        async with Client(proxied(log, "--scenario", str(scenario))) as session:
            async with anyio.create_task_group() as group:
                group.start_soon(held_call, session)
                await anyio.sleep(0.3)  # the held call is on its way
                started = time.monotonic()
                added = await session.call_tool("add", {"a": 1, "b": 2})
                fast_s = time.monotonic() - started
    assert added.content[0].text == "3.0"
    assert fast_s < HOLD_S / 2, f"a call to another tool waited {fast_s:.1f} s behind the held one"
    assert outcome["search_s"] >= HOLD_S - 0.5
    if fault["type"] == "timeout":
        assert isinstance(outcome["search"], MCPError) and "timed out" in str(outcome["search"])
    else:
        assert "held result 1" in outcome["search"].content[0].text


async def test_notifications_stay_before_the_reply_they_precede(tmp_path: Path):
    """Progress notifications each held for a random time: all arrive, in order, before the result."""
    log = tmp_path / "log.jsonl"
    scenario = scenario_file(tmp_path, {
        "name": "late-progress", "match": {"method": "notifications/progress"}, "probability": 0.7,
        "fault": {"type": "latency", "delay_ms": 150, "jitter_ms": 140, "phase": "response"}})
    progress: list[float] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append(value)

    with anyio.fail_after(WAIT):
        async with Client(proxied(log, "--scenario", str(scenario), "--seed", "1")) as session:
            result = await session.call_tool("count", {"n": 12, "interval_ms": 10},
                                             progress_callback=on_progress)
            at_result = list(progress)
    assert result.content[0].text == "counted to 12"
    assert at_result == list(range(1, 13))
    assert len(log_events(log, "fault")) >= 3  # the notifications really were held


FLOOD = 200  # notifications of 1 MiB
HELD_BOUND_MIB = 120  # the relay's peak RSS: ~40 MiB at rest, ~65 with its 16 MiB of lines held (640 before)


async def test_a_flood_under_a_delay_is_held_in_bytes_not_messages(tmp_path: Path):
    """1 MiB notifications, every message from the server delayed, and a host that stops reading:
    the relay holds a few MiB and stops reading the server (which waits), then everything arrives."""
    log = tmp_path / "log.jsonl"
    scenario = scenario_file(tmp_path, {"name": "late", "fault": {"type": "latency", "delay_ms": 100,
                                                                   "phase": "response"}})
    resume = anyio.Event()
    notes: list[str] = []
    result: list[Any] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        notes.append((message or "")[:8])

    async def flood(session: Client) -> None:
        result.append(await session.call_tool("flood", {"n": FLOOD}, progress_callback=on_progress))

    host = stalling_host(proxied(log, "--scenario", str(scenario), server=TEST_SERVER),
                         stall_on="notifications/progress", resume=resume)
    with anyio.fail_after(WAIT):
        async with Client(host) as session:
            relay = relay_pid(str(log))
            async with anyio.create_task_group() as group:
                group.start_soon(flood, session)
                await anyio.sleep(4)  # the server writes ~100 MiB/s while it may: it is blocked long before
                peak = peak_rss_mib(relay)
                resume.set()
    print(f"relay peak RSS {peak:.0f} MiB with the host not reading")
    assert peak < HELD_BOUND_MIB, f"the relay held {peak:.0f} MiB for a host that stopped reading"
    assert result[0].content[0].text == f"flooded {FLOOD}"
    assert notes == [f"{i:08d}" for i in range(FLOOD)]  # nothing lost to the back-pressure


async def test_a_server_that_dies_while_its_reply_is_held_is_seen_dying_at_once(tmp_path: Path):
    """Issue 23 defect 8: the agent learned of the crash only after two 10 s grace periods."""
    log = tmp_path / "log.jsonl"
    scenario = scenario_file(tmp_path, {"name": "late", "match": {"tool": "crash_soon"},
                                        "fault": {"type": "latency", "delay_ms": 30_000, "phase": "response"}})
    with anyio.fail_after(WAIT):
        async with Client(proxied(log, "--scenario", str(scenario), server=TEST_SERVER)) as session:
            started = time.monotonic()
            with pytest.raises(MCPError, match="Connection closed"):
                await session.call_tool("crash_soon", {"after_ms": 500})
            crash_seen_s = time.monotonic() - started
    assert crash_seen_s < 8, f"the crash reached the agent {crash_seen_s:.0f} s late"
    [call] = [c for c in log_events(log, "call") if c["tool"] == "crash_soon"]
    assert (call["outcome"], call["faults"]) == ("unanswered", ["late"])
