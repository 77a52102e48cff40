"""What the proxy remembers about one agent session across messages.

Faults that change the tool registry an agent sees (renames, duplicates, distractors) leave notes
here, so that calls to what the agent was shown still go somewhere sensible.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class ToolRoute:
    """How to answer calls to a tool name the agent was shown by a fault.

    Exactly one of `real` (forward under this upstream name) or `reply` (answer with this result or
    error object, without calling upstream) is set.
    """

    rule: str
    fault: str
    real: str | None = None
    reply: dict[str, Any] | None = None


@dataclass(slots=True)
class SessionState:
    """Tool routes the agent was shown, the count of its tool calls, recent results per tool."""

    routes: dict[str, ToolRoute] = field(default_factory=dict)
    tool_calls: int = 0
    results: dict[str, list[Any]] = field(default_factory=dict)
