"""An MCP server (Python SDK 2.3) that uses what the 2026-07-28 revision and its extensions add, for the
faults on them: multi-round-trip input (`deploy` asks for a confirmation), cache hints on its lists,
tools that change underneath (`spawn` adds one, `retire` removes one, each saying so on
`subscriptions/listen`; each test its own), resource updates (`touch`), and the Tasks extension
(`io.modelcontextprotocol/tasks`, SEP-2663), which the SDK does not ship but lets a server add through
its extension API: `report` answers a client that declared the extension with a task, which
`tasks/get` reports as working for `polls` polls, then completed.

  python -m tests.helpers.modern_server http --port 9021 [--cache-ttl-ms N] [--cache-scope private|public]
  python -m tests.helpers.modern_server stdio
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import itertools
from typing import Any

from mcp.server.caching import CacheHint
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.extension import Extension, MethodBinding
from mcp.server.mcpserver import Context, MCPServer
from mcp.shared.exceptions import MCPError
from mcp_types import (
    INVALID_PARAMS,
    CallToolRequestParams,
    ElicitRequest,
    ElicitRequestFormParams,
    InputRequiredResult,
    RequestParams,
)

TASKS = "io.modelcontextprotocol/tasks"
REPORT = "report: 3 incidents"
QUESTION = "Deploy to {target}? Type the environment's name to confirm."


class TaskParams(RequestParams):
    task_id: str


class Tasks(Extension):
    """The Tasks extension for `report`: a task per call, working for `polls` polls, then completed."""

    identifier = TASKS

    def __init__(self) -> None:
        self.tasks: dict[str, dict[str, Any]] = {}
        self.ids = itertools.count(1)

    def methods(self) -> list[MethodBinding]:
        return [MethodBinding("tasks/get", TaskParams, self.get)]

    async def intercept_tool_call(self, params: CallToolRequestParams, ctx: ServerRequestContext[Any, Any],
                                  call_next: CallNext) -> HandlerResult:
        declared = ctx.session.client_capabilities
        if params.name != "report" or TASKS not in ((declared and declared.extensions) or {}):
            return await call_next(ctx)
        task_id = f"task-{next(self.ids)}"
        now = _now()
        polls = int((params.arguments or {}).get("polls", 2))
        self.tasks[task_id] = {"taskId": task_id, "status": "working", "statusMessage": "compiling the report",
                               "createdAt": now, "lastUpdatedAt": now, "ttlMs": 60_000, "pollIntervalMs": 10,
                               "left": polls}
        return {"resultType": "task", **_shown(self.tasks[task_id])}

    async def get(self, ctx: ServerRequestContext[Any, Any], params: TaskParams) -> HandlerResult:
        task = self.tasks.get(params.task_id)
        if task is None:
            raise MCPError(code=INVALID_PARAMS, message="Failed to retrieve task: Task not found")
        if task["status"] == "working":
            task["left"] -= 1
            if task["left"] < 0:
                result = {"content": [{"type": "text", "text": REPORT}], "structuredContent": {"result": REPORT},
                          "isError": False}
                task.update(status="completed", statusMessage="done", lastUpdatedAt=_now(), result=result)
        return {"resultType": "complete", **_shown(task)}


def _shown(task: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in task.items() if key != "left"}


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def build(cache_ttl_ms: int = 0, cache_scope: str = "private") -> MCPServer:
    hint = CacheHint(ttl_ms=cache_ttl_ms, scope=cache_scope)  # type: ignore[arg-type]
    server = MCPServer("modern-tools", version="1.0", extensions=[Tasks()],
                       cache_hints={"tools/list": hint, "resources/list": hint})

    @server.tool()
    def deploy(target: str, ctx: Context) -> str | InputRequiredResult:
        """Deploy to an environment, once the user confirms it by name (asks through input_required)."""
        answer = (ctx.input_responses or {}).get("confirm")
        content = getattr(answer, "content", None) or {}
        if content.get("name") == target and ctx.request_state == f"asked:{target}":
            return f"deployed to {target}"
        form = ElicitRequestFormParams(message=QUESTION.format(target=target), requested_schema={
            "type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]})
        return InputRequiredResult(input_requests={"confirm": ElicitRequest(params=form)},
                                   request_state=f"asked:{target}")

    @server.tool()
    def weather(city: str) -> str:
        """The weather in a city."""
        return f"{city}: 21 C, clear"

    @server.tool()
    def forecast(city: str) -> str:
        """Tomorrow's weather in a city (retired by `retire`)."""
        return f"{city} tomorrow: 19 C, rain"

    @server.tool()
    async def spawn(name: str, ctx: Context) -> str:
        """Add a tool `name` (it echoes its text), and say so to subscribers (tools/list_changed)."""
        server.add_tool(lambda text="": f"{name}: {text}", name=name, description=f"echo, as {name}")
        await ctx.notify_tools_changed()
        return f"spawned {name}"

    @server.tool()
    async def retire(name: str, ctx: Context) -> str:
        """Remove a tool, and say so to subscribers (tools/list_changed)."""
        server.remove_tool(name)
        await ctx.notify_tools_changed()
        return f"retired {name}"

    @server.tool()
    async def touch(uri: str, ctx: Context) -> str:
        """Say a resource changed (notifications/resources/updated to its subscribers)."""
        await ctx.notify_resource_updated(uri)
        return f"touched {uri}"

    @server.tool()
    def report(polls: int = 2) -> str:
        """A report; a client that declared the Tasks extension gets a task instead, done after `polls` polls."""
        return REPORT

    @server.resource("note://greeting")
    def greeting() -> str:
        """A note that `touch` says changed."""
        return "hello"

    return server


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("transport", choices=["stdio", "http"])
    parser.add_argument("--port", type=int, default=9021)
    parser.add_argument("--cache-ttl-ms", type=int, default=0)
    parser.add_argument("--cache-scope", choices=["private", "public"], default="private")
    args = parser.parse_args()
    server = build(args.cache_ttl_ms, args.cache_scope)
    if args.transport == "stdio":
        asyncio.run(server.run_stdio_async())
    else:
        asyncio.run(server.run_streamable_http_async(host="127.0.0.1", port=args.port))


if __name__ == "__main__":
    main()
