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
    error object, without calling upstream) is set. A drifted input schema also renames arguments
    back (`arguments`) and refuses calls that still use the old shape (`refused`).
    """

    rule: str
    fault: str
    real: str | None = None
    reply: dict[str, Any] | None = None
    arguments: dict[str, str] = field(default_factory=dict)  # argument names shown -> real ones
    refused: frozenset[str] = frozenset()  # argument names the shown schema no longer has: -32602


@dataclass(slots=True)
class SessionState:
    """Tool routes the agent was shown, the count of its tool calls, recent results per tool."""

    routes: dict[str, ToolRoute] = field(default_factory=dict)
    tool_calls: int = 0
    results: dict[str, list[Any]] = field(default_factory=dict)
