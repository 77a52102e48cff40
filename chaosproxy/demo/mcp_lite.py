"""A dependency-free MCP tool server over streamable HTTP (JSON replies) for `chaosproxy demo`.

The core install has no MCP SDK, and the demo must run on it; the tests use the SDK server
(demo/mcp_server.py) instead. POST /mcp takes initialize, notifications (202), tools/list and
tools/call; tools: search (text), weather (text), add (numbers, refuses unknown arguments).
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from aiohttp import web

from chaosproxy.demo.serving import serve

FORECASTS = {"paris": 14, "tokyo": 19, "lima": 22, "oslo": 3}
TOOLS = [
    {"name": "search", "description": "Search the web and return the top results.",
     "inputSchema": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}},
    {"name": "weather", "description": "Current weather for a city.",
     "inputSchema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}},
    {"name": "add", "description": "Add two numbers.",
     "inputSchema": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
                     "required": ["a", "b"]}},
]


def _call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    match name, arguments:
        case "search", {"query": str(query)}:
            text = json.dumps({"query": query, "results": [f"{query}: guide {i}" for i in range(1, 3)]})
        case "weather", {"city": str(city)}:
            text = f"{city}: {FORECASTS.get(city.lower(), 18)} C, light rain this evening"
        case "add", {"a": int() | float() as a, "b": int() | float() as b} if len(arguments) == 2:
            text = str(a + b)
        case _:
            return {"content": [{"type": "text", "text": f"Invalid arguments for tool {name}"}], "isError": True}
    return {"content": [{"type": "text", "text": text}]}


async def handle(request: web.Request) -> web.Response:
    rpc = await request.json()
    if "id" not in rpc:
        return web.Response(status=202)
    method, params = rpc.get("method"), rpc.get("params") or {}
    headers: dict[str, str] = {}
    if method == "initialize":
        headers["Mcp-Session-Id"] = uuid.uuid4().hex
        result: dict[str, Any] = {"protocolVersion": params.get("protocolVersion", "2025-06-18"),
                                  "capabilities": {"tools": {}}, "serverInfo": {"name": "demo-tools", "version": "1"}}
    elif method == "tools/list":
        result = {"tools": TOOLS}
    elif method == "tools/call" and params.get("name") in {tool["name"] for tool in TOOLS}:
        result = _call(params["name"], params.get("arguments") or {})
    else:
        error = {"code": -32602 if method == "tools/call" else -32601, "message": f"Unknown {method}"}
        return web.json_response({"jsonrpc": "2.0", "id": rpc["id"], "error": error})
    return web.json_response({"jsonrpc": "2.0", "id": rpc["id"], "result": result}, headers=headers)


async def start(host: str = "127.0.0.1", port: int = 0) -> tuple[web.AppRunner, int]:
    """Start the server; returns its runner (call `cleanup()` to stop) and the bound port."""
    app = web.Application()
    app.router.add_post("/mcp", handle)
    return await serve(app, host, port)
