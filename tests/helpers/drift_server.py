"""An MCP server (Python SDK, streamable HTTP) whose tools can be renamed from the command line, for drift tests.

  python -m tests.helpers.drift_server --port 9101 [--rename search=find]
"""

from __future__ import annotations

import argparse
import asyncio

from mcp.server.mcpserver import MCPServer


def search(query: str, limit: int = 3) -> str:
    """Search the documentation."""
    return f"{limit} results for {query}"


def add(a: float, b: float) -> float:
    """Add two numbers."""
    return a + b


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("http", nargs="?", help="(the transport, as chaosproxy.demo.mcp_server takes it)")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--rename", action="append", default=[], metavar="OLD=NEW")
    args = parser.parse_args()
    renamed = dict(pair.split("=", 1) for pair in args.rename)
    server = MCPServer("drift-tools", version="1.0")
    for tool in (search, add):
        server.tool(name=renamed.get(tool.__name__, tool.__name__))(tool)
    asyncio.run(server.run_streamable_http_async(host="127.0.0.1", port=args.port))


if __name__ == "__main__":
    main()
