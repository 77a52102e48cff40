"""An MCP server (Python SDK, stdio) that misbehaves as the stdio relay's tests need: it floods, it
crashes, and with --stubborn it outlives both SIGTERM and the end of its stdin.

  python -m tests.helpers.stdio_server [--stubborn]

Tools: flood (n progress notifications of 1 MiB each, then the answer), crash_soon (answers, then the
process exits with status 3), and pid (the server's own pid, to find it behind a launcher).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import threading
import time

from mcp.server.mcpserver import Context, MCPServer

server = MCPServer("chaosproxy-stdio-test-tools", version="1.0")
NOTE_BYTES = 1 << 20
CRASH_STATUS = 3
LINGER_S = 600  # --stubborn: how long it stays after its stdin ends, as a server with a stray thread does


@server.tool()
async def flood(n: int, ctx: Context) -> str:
    """Send n progress notifications of NOTE_BYTES each, as fast as the pipe takes them, then answer."""
    for i in range(n):
        await ctx.report_progress(i + 1, n, f"{i:08d} " + "x" * (NOTE_BYTES - 9))
    return f"flooded {n}"


@server.tool()
def crash_soon(after_ms: int = 500) -> str:
    """Answer at once, then exit with CRASH_STATUS after_ms later, whatever is in flight."""
    threading.Timer(after_ms / 1000, os._exit, (CRASH_STATUS,)).start()
    return "going down"


@server.tool()
def pid() -> int:
    """The pid of the process serving (a launcher in front of it has another)."""
    return os.getpid()


def main() -> None:
    if "--stubborn" in sys.argv:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    asyncio.run(server.run_stdio_async())
    if "--stubborn" in sys.argv:
        time.sleep(LINGER_S)


if __name__ == "__main__":
    main()
