"""An example agent that retries: each tool call gets up to ATTEMPTS tries, with exponential backoff.

Each try opens a fresh MCP connection with a read timeout, so a reset connection, a lost session or
a hung call costs one try and not the task. Tool errors (`isError`) are retried too. Every wait is
bounded: at most ATTEMPTS x (READ_TIMEOUT_S + the backoff) per call.

    CHAOSPROXY_URL=http://127.0.0.1:8800/mcp python examples/agent_retry.py   (or CHAOSPROXY_STDIO_COMMAND)
"""

from __future__ import annotations

import asyncio
import random
import sys
from typing import Any

from mcp import Client
from weather_task import read, run_task, server

ATTEMPTS = 5
BACKOFF_S = 0.05  # before the second try; doubled each time, with jitter
READ_TIMEOUT_S = 5.0


async def call(name: str, arguments: dict[str, Any]) -> Any:
    for attempt in range(1, ATTEMPTS):
        try:
            return await attempt_call(name, arguments)
        except Exception as exc:  # any failure of the call is worth another try: that is the policy
            print(f"{name}: try {attempt} of {ATTEMPTS} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        await asyncio.sleep(BACKOFF_S * 2 ** (attempt - 1) * random.uniform(0.5, 1.5))
    return await attempt_call(name, arguments)  # the last try's error ends the task


async def attempt_call(name: str, arguments: dict[str, Any]) -> Any:
    async with Client(server(), read_timeout_seconds=READ_TIMEOUT_S) as client:
        return read(await client.call_tool(name, arguments))


if __name__ == "__main__":
    raise SystemExit(asyncio.run(run_task(call)))
