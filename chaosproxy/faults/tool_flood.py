from __future__ import annotations

import itertools
import random
from typing import Any, Literal

from pydantic import Field

from chaosproxy.engine.actions import Rewrite
from chaosproxy.engine.message import Phase
from chaosproxy.faults._effects import with_tools
from chaosproxy.faults._tool_routes import answer, crash_result, name_of, stable_rng, stub_result
from chaosproxy.faults.base import LISTINGS, Component, Fault, FaultContext, Level, register
from chaosproxy.protocols import mcp

# Small word tables, so made-up tools read like the ones real servers list (and no two runs of a
# seed differ). A verb decides the description and the arguments; a noun what the tool works on.
NOUNS = ["invoice", "customer", "ticket", "order", "report", "event", "repository", "file", "message",
         "contact", "shipment", "payment", "subscription", "user", "project", "note", "deployment",
         "alert", "document", "comment", "branch", "calendar", "task", "lead", "product", "refund"]
VERBS: dict[str, tuple[str, list[str]]] = {
    "get": ("Get a {noun} by its id.", ["id"]),
    "list": ("List {nouns}, newest first.", ["limit", "cursor"]),
    "search": ("Search {nouns} by keyword and return the best matches.", ["query", "limit"]),
    "create": ("Create a new {noun}.", ["title", "body"]),
    "update": ("Update the fields of an existing {noun}.", ["id", "fields"]),
    "delete": ("Delete a {noun} permanently.", ["id"]),
    "archive": ("Archive a {noun} so it no longer shows up in lists.", ["id"]),
    "export": ("Export {nouns} as CSV or JSON.", ["format", "since"]),
    "count": ("Count the {nouns} matching a filter.", ["filter"]),
    "sync": ("Sync {nouns} with the upstream system.", ["full"]),
}
ARGUMENTS: dict[str, dict[str, Any]] = {
    "id": {"type": "string", "description": "The {noun} id."},
    "limit": {"type": "integer", "minimum": 1, "maximum": 100, "default": 20,
              "description": "How many {nouns} to return."},
    "cursor": {"type": "string", "description": "Pagination cursor from a previous call."},
    "query": {"type": "string", "description": "Keywords to search for."},
    "title": {"type": "string", "description": "A short title for the {noun}."},
    "body": {"type": "string", "description": "The {noun}'s content."},
    "fields": {"type": "object", "description": "Fields to change, by name."},
    "format": {"type": "string", "enum": ["csv", "json"], "default": "json", "description": "Output format."},
    "since": {"type": "string", "format": "date", "description": "Only {nouns} changed since this date."},
    "filter": {"type": "string", "description": "A filter expression, e.g. status:open."},
    "full": {"type": "boolean", "default": False, "description": "Sync everything, not only changes."},
}
OPTIONAL = {"limit", "cursor", "format", "since", "filter", "full", "body"}


def made_up_tool(rng: random.Random, taken: set[str]) -> dict[str, Any]:
    """A plausible tool (name, description, input schema) whose name is not in `taken` (then added)."""
    for attempt in itertools.count():
        verb, noun = rng.choice(list(VERBS)), rng.choice(NOUNS)
        name = f"{verb}_{_plural(noun) if verb in ('list', 'search', 'export', 'count', 'sync') else noun}"
        if attempt >= 50:  # the tables have run out of fresh pairs
            name = f"{name}_{attempt}"
        if name not in taken:
            break
    taken.add(name)
    words = {"noun": noun.replace("_", " "), "nouns": _plural(noun)}
    template, arguments = VERBS[verb]
    properties = {arg: {**ARGUMENTS[arg], "description": ARGUMENTS[arg]["description"].format(**words)}
                  for arg in arguments}
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if required := [arg for arg in arguments if arg not in OPTIONAL]:
        schema["required"] = required
    return {"name": name, "description": template.format(**words), "inputSchema": schema}


def _plural(noun: str) -> str:
    if noun.endswith("y"):
        return noun[:-1] + "ies"
    return noun + "es" if noun.endswith(("s", "ch")) else noun + "s"


@register
class ToolFlood(Fault):
    """Pad the tool list with `count` plausible made-up tools, whose calls fail or get a stub result."""

    type: Literal["tool_flood"] = "tool_flood"
    count: int = Field(ge=1, le=1000, description=(
        "how many tools to add (on the first page of tools/list; never under a name upstream lists on any "
        "page the proxy has seen, and a later page listing a real tool by a made-up name takes the name back)"))
    route: Literal["error", "stub"] = Field("error", description="calls to added tools: tool error or stub")

    component = Component.ACTION
    level = Level.MCP
    phase = Phase.RESPONSE
    methods = LISTINGS
    routes_calls = True

    def act(self, ctx: FaultContext) -> Rewrite | None:
        tools = mcp.listed_tools(ctx.message)
        if tools is None:
            return None
        names = {name for tool in tools if (name := name_of(tool)) is not None}
        if not mcp.is_first_page(ctx.message):
            # A later page may list a real tool under a name made up on page one (before the proxy
            # could know it): calls to that name go to the server again.
            for name in names:
                ctx.session.routes.drop(name, ctx.rule)
            return None
        rng = stable_rng(ctx)
        taken = names | ctx.session.view.listed  # every name upstream ever listed, on any page
        padded = list(tools)
        for _ in range(self.count):
            tool = made_up_tool(rng, taken)
            padded.insert(rng.randint(0, len(padded)), tool)
            answer(ctx, self.type, tool["name"], crash_result(tool["name"]) if self.route == "error"
                   else stub_result(tool))
        return with_tools(ctx.message, padded)
