"""The task of both example agents, as a scripted policy (no LLM): which tools, in what order, what is done.

Find the weather in Paris and Tokyo with the bundled MCP server's tools (search, weather, add) and
add the two temperatures. The agents differ only in how they make one tool call. They reach the server
over streamable HTTP at CHAOSPROXY_URL, or spawn the `chaosproxy stdio ... -- SERVER` command line in
CHAOSPROXY_STDIO_COMMAND (as a drill with --stdio gives them).
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Awaitable, Callable
from typing import Any

from mcp import StdioServerParameters
from mcp.types import CallToolResult

CITIES = ("paris", "tokyo")
EXPECTED_SUM = 33  # the bundled server's forecasts: paris 14, tokyo 19

Call = Callable[[str, dict[str, Any]], Awaitable[Any]]


def server() -> str | StdioServerParameters:
    """The MCP server to connect to: the stdio command line when one is given, else the URL."""
    if command := os.environ.get("CHAOSPROXY_STDIO_COMMAND"):
        program, *args = shlex.split(command)
        return StdioServerParameters(command=program, args=args)
    return os.environ["CHAOSPROXY_URL"]


class ToolFailed(Exception):
    """A tool answered, but not with a usable result."""


def read(result: CallToolResult) -> Any:
    """A call's structured result (the bare value for tools that return one), or ToolFailed."""
    if result.is_error:
        text = " ".join(getattr(block, "text", "") for block in result.content)
        raise ToolFailed(f"tool error: {text[:200]}")
    data = result.structured_content
    if not isinstance(data, dict):
        raise ToolFailed(f"no structured result: {result.content!r:.200}")
    return data.get("result", data)


async def run_task(call: Call) -> int:
    """Do the task with `call`; 0 when the answer is right, 1 otherwise (as the agent's exit status)."""
    await call("search", {"query": "weather in " + " and ".join(CITIES), "limit": 2})
    temperatures = []
    for city in CITIES:
        forecast = await call("weather", {"city": city})
        if not isinstance(forecast, dict) or not isinstance(forecast.get("temp_c"), int):
            raise ToolFailed(f"weather for {city}: unexpected result {forecast!r:.200}")
        temperatures.append(forecast["temp_c"])
    total = await call("add", {"a": temperatures[0], "b": temperatures[1]})
    print(f"{' + '.join(f'{c} {t} C' for c, t in zip(CITIES, temperatures, strict=True))} = {total}")
    if total != EXPECTED_SUM:
        print(f"wrong answer: expected {EXPECTED_SUM}", file=sys.stderr)
        return 1
    return 0
