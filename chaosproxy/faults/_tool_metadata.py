"""What the reward faults on tools/list share: pick listed tools by glob and rewrite each one.

Not a fault itself: it registers nothing. Descriptions are what an agent judges tools by, so these
faults change them (and may add a distractor beside a tool) while the tools keep working.
"""

from __future__ import annotations

import random
from typing import Any

from pydantic import Field

from chaosproxy.engine.actions import Rewrite
from chaosproxy.engine.message import Phase
from chaosproxy.faults._effects import with_tools
from chaosproxy.faults._tool_routes import name_of, picked, stable_rng
from chaosproxy.faults.base import LISTINGS, Fault, FaultContext, Level
from chaosproxy.protocols import mcp


class ToolListFault(Fault):
    """Base of the faults that rewrite the listed tools whose names match `tool`, one at a time.

    Tools are rewritten on whichever page of tools/list carries them; the result keeps nextCursor.
    """

    tool: str = Field("*", min_length=1, description="glob on the names of the listed tools to change")

    level = Level.MCP
    phase = Phase.RESPONSE
    methods = LISTINGS

    def act(self, ctx: FaultContext) -> Rewrite | None:
        tools = mcp.listed_tools(ctx.message)
        chosen = picked(tools, self.tool, first_page=True) if tools else set()
        if not tools or not chosen:
            return None
        names = {name for tool in tools if (name := name_of(tool)) is not None}
        listed: list[Any] = []
        changed = False
        for i, tool in enumerate(tools):
            shown = self.rewrite(tool, names, ctx) if i in chosen else [tool]
            changed = changed or len(shown) != 1 or shown[0] is not tool
            listed += shown
        return with_tools(ctx.message, listed) if changed else None

    def rewrite(self, tool: dict[str, Any], names: set[str], ctx: FaultContext) -> list[dict[str, Any]]:
        """The tools to list in place of `tool`: `[tool]` itself when unchanged.

        `names` holds every name on this page; a fault that adds a tool adds its name there.
        """
        raise NotImplementedError


def seeded(ctx: FaultContext, *key: object) -> random.Random:
    """A random stream for one rewrite (one tool, one text), the same each time the session lists tools.

    Keyed by what is rewritten rather than drawn in list order, so one tool's rewrite does not depend
    on which other tools the server lists before it.
    """
    base = stable_rng(ctx).getrandbits(64)
    return random.Random(":".join(str(part) for part in (base, *key)))


def description(tool: dict[str, Any]) -> str:
    text = tool.get("description")
    return text if isinstance(text, str) else ""


def appended(original: str, text: str, separator: str = " ") -> str:
    return f"{original.rstrip()}{separator}{text}" if original.strip() else text
