"""An example agent that trusts its tools: one MCP session, the SDK's defaults (no timeout), no retry.

Any error ends the task: the exit status is 1 (with the traceback on stderr), 0 when the task is done.

    CHAOSPROXY_URL=http://127.0.0.1:8800/mcp python examples/agent_naive.py
    CHAOSPROXY_STDIO_COMMAND="chaosproxy stdio -- python -m chaosproxy.demo.mcp_server stdio" \
        python examples/agent_naive.py
"""

from __future__ import annotations

import asyncio
from typing import Any

from mcp import Client
from weather_task import read, run_task, server


async def main() -> int:
    async with Client(server()) as client:
        async def call(name: str, arguments: dict[str, Any]) -> Any:
            return read(await client.call_tool(name, arguments))
        return await run_task(call)


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
