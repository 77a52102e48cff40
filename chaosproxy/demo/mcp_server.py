"""A small MCP tool server (Python SDK) for the demo and the tests, over stdio, streamable HTTP or SSE.

  python -m chaosproxy.demo.mcp_server stdio
  python -m chaosproxy.demo.mcp_server http --port 9001 [--json-response] [--stateless]   (path /mcp)
  python -m chaosproxy.demo.mcp_server sse --port 9002                                   (GET /sse)

Tools: search (text result), weather (structured result with an output schema), add (numbers),
count (reports progress as it goes), and fail (always a tool error).
"""

from __future__ import annotations

import argparse
import asyncio

from mcp.server.mcpserver import Context, MCPServer
from pydantic import BaseModel

server = MCPServer("chaosproxy-demo-tools", version="1.0")

FORECASTS = {"paris": 14, "tokyo": 19, "lima": 22, "oslo": 3}


class Weather(BaseModel):
    city: str
    temp_c: int
    sky: str


@server.tool()
def search(query: str, limit: int = 3) -> str:
    """Search the web and return the top results as JSON text."""
    import json
    return json.dumps({"query": query, "results": [{"title": f"{query} result {i}", "rank": i}
                                                   for i in range(1, limit + 1)]})


@server.tool()
def weather(city: str) -> Weather:
    """Current weather for a city."""
    return Weather(city=city.lower(), temp_c=FORECASTS.get(city.lower(), 18), sky="clear")


@server.tool()
def add(a: float, b: float) -> float:
    """Add two numbers."""
    return a + b


@server.tool()
async def count(n: int, ctx: Context, interval_ms: int = 100) -> str:
    """Count to n, reporting progress after each step."""
    for i in range(1, n + 1):
        await asyncio.sleep(interval_ms / 1000)
        await ctx.report_progress(i, n, f"step {i}")
    return f"counted to {n}"


@server.tool()
def fail(reason: str = "boom") -> str:
    """Always fails (a tool error, isError: true)."""
    raise ValueError(reason)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("transport", choices=["stdio", "http", "sse"])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9001)
    parser.add_argument("--json-response", action="store_true", help="http: answer POSTs with JSON, not SSE")
    parser.add_argument("--stateless", action="store_true", help="http: no sessions")
    args = parser.parse_args()
    if args.transport == "stdio":
        asyncio.run(server.run_stdio_async())
    elif args.transport == "http":
        asyncio.run(server.run_streamable_http_async(host=args.host, port=args.port, json_response=args.json_response,
                                                     stateless_http=args.stateless))
    else:
        asyncio.run(server.run_sse_async(host=args.host, port=args.port))


if __name__ == "__main__":
    main()
