"""An MCP tool server (Python SDK) whose tools declare strict output schemas, as real servers do.

pydantic models with extra="forbid" (additionalProperties: false), Literal enums, required fields
and formatted strings (uuid, date, uri): a result the client accepts from this server is valid
data, so a fault that breaks it shows up as the client's validation error.

  python -m tests.helpers.strict_server http --port 9011 [--page-size N]   (tools/list in pages of N)
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import uuid
from typing import Literal

from mcp.server.mcpserver import MCPServer
from mcp.types import ListToolsResult
from pydantic import AnyUrl, BaseModel, ConfigDict, Field


class PagedServer(MCPServer):
    """An MCPServer that lists its tools `page_size` at a time (the SDK's own lists them all at once)."""

    page_size = 0

    async def _handle_list_tools(self, ctx, params) -> ListToolsResult:
        tools = await self.list_tools()
        if not self.page_size:
            return ListToolsResult(tools=tools)
        start = int(params.cursor) if params is not None and params.cursor else 0
        end = start + self.page_size
        return ListToolsResult(tools=tools[start:end], next_cursor=str(end) if end < len(tools) else None)


server = PagedServer("strict-tools", version="1.0")


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Ticket(Strict):
    id: uuid.UUID
    status: Literal["open", "closed", "pending"]
    priority: Literal["low", "normal", "high"]
    title: str
    summary: str = Field(description="free text written by the reporter")
    created: datetime.date
    link: AnyUrl
    code: str = Field(pattern=r"^[A-Z]{3}-\d{3}$")
    watchers: int = Field(ge=0)


class Tickets(Strict):
    query: str
    total: int
    items: list[Ticket]


def _ticket(n: int) -> Ticket:
    return Ticket(id=uuid.UUID(int=n + 1), status=("open", "closed", "pending")[n % 3],
                  priority=("low", "normal", "high")[n % 3], title=f"Printer on floor {n} jams",
                  summary=f"Since Monday the printer on floor {n} jams on every second page. Please send someone.",
                  created=datetime.date(2025, 3, 1 + n), link=AnyUrl(f"https://tickets.example/t/{n}"),
                  code=f"OPS-{100 + n}", watchers=n + 2)


@server.tool()
def ticket(n: int = 1) -> Ticket:
    """One support ticket."""
    return _ticket(n)


@server.tool()
def tickets(query: str, limit: int = 3) -> Tickets:
    """Search support tickets."""
    return Tickets(query=query, total=limit, items=[_ticket(n) for n in range(limit)])


@server.tool()
def broken_ticket(n: int = 1) -> Ticket:
    """Always fails (a tool error) although it declares an output schema."""
    raise ValueError(f"ticket {n} is locked")


@server.tool()
def summary(topic: str) -> str:
    """A plain text summary (the SDK wraps it as {"result": text})."""
    return f"The {topic} backlog has 12 open tickets; most are about printers and VPN access."


@server.tool()
def search_tickets(query: str) -> str:
    """Search tickets by keyword (a name a made-up tool could take: see tool_flood)."""
    return f"3 tickets match {query!r}."


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("transport", choices=["http"])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--page-size", type=int, default=0, help="list tools this many per page")
    args = parser.parse_args()
    server.page_size = args.page_size
    asyncio.run(server.run_streamable_http_async(host="127.0.0.1", port=args.port))


if __name__ == "__main__":
    main()
