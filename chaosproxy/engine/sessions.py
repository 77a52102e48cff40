"""The agent sessions a proxy remembers, bounded: a sidecar runs for days in front of many agents.

A session's state (its tool routes and results, its per-session rule counters, its ordinal) goes
when the session ends (DELETE in the handshake era, the stdio server's exit), when it has been idle
for the TTL, and, least recently used first, when more than the cap are held. A session that comes
back after that starts fresh, and the log says so.

Seeded decisions are keyed by a session's draw name. An agent that names itself (AGENT_HEADER) gives
its sessions names of its own: NAME#1, NAME#2, ... in the order it opens them, whatever other agents
do meanwhile. Other sessions are named by their ordinal, the order sessions first appeared in, which
depends on how agents interleave. Runs that stay under the cap reproduce exactly.
"""

from __future__ import annotations

import re
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from itertools import islice
from typing import Any

from chaosproxy.engine.session_state import SessionState

SESSION_TTL_S = 1800.0
MAX_SESSIONS = 10_000
# The request header in which an agent names itself, for draws that do not depend on other agents.
AGENT_HEADER = "X-Chaosproxy-Agent"
# The request header that puts a call in a scope of its listener (chaosproxy.control.scopes), by default.
SCOPE_HEADER = "X-Chaosproxy-Scope"
_AGENT_NAME = re.compile(rb"[A-Za-z0-9._~:@/+=-]{1,128}")


def agent_name(value: bytes | str | None) -> str | None:
    """The agent's name in an AGENT_HEADER value, or None when there is none or it is not a short token
    (it reaches the log as a session key: nothing else may)."""
    if isinstance(value, str):
        value = value.encode("latin-1", "replace")
    return value.decode("ascii") if value is not None and _AGENT_NAME.fullmatch(value) else None


@dataclass(slots=True)
class Session:
    """One session's entry: its number in order of first appearance, the name its draws are keyed by,
    the agent that named itself when it opened the session, its state, when it was last seen."""

    key: str
    ordinal: int
    draws: str
    agent: str | None
    state: SessionState
    seen: float


class SessionTable:
    """Sessions by key, least recently used first; `on_change(key, change, reason)` hears of every drop
    ("dropped": ended, idle, evicted) and of every return of a dropped session ("restarted")."""

    def __init__(self, on_change: Callable[[str, str, str], None], *, ttl: float = SESSION_TTL_S,
                 limit: int = MAX_SESSIONS) -> None:
        self.ttl = ttl
        self.limit = limit
        self._on_change = on_change
        self._entries: OrderedDict[str, Session] = OrderedDict()
        self._gone: OrderedDict[str, str] = OrderedDict()  # dropped keys -> why, as many as there may be live
        self._next_ordinal = 1
        self._opened: OrderedDict[str, int] = OrderedDict()  # agent name -> sessions it opened, as many as live

    def __len__(self) -> int:
        return len(self._entries)

    def enter(self, key: str, fresh: Callable[[], SessionState] = SessionState,
              now: float | None = None, agent: str | None = None) -> Session:
        """The session for `key`, made with `fresh()` when it is new or was idle too long; marks it used now.
        `agent`: the name the agent gave itself, which names the draws of a session it opens."""
        now = time.monotonic() if now is None else now
        entry = self.touch(key, now)
        if entry is not None:
            return entry
        if key in self._entries:
            self._drop(key, "idle")
        self._expire(now)
        ordinal = self._next_ordinal
        self._next_ordinal += 1
        entry = self._entries[key] = Session(key, ordinal, self._draw_name(ordinal, agent), agent, fresh(), now)
        if (reason := self._gone.pop(key, None)) is not None:
            self._on_change(key, "restarted", reason)
        if len(self._entries) > self.limit:
            self._drop(next(iter(self._entries)), "evicted")
        return entry

    def touch(self, key: str, now: float | None = None) -> Session | None:
        """The session for `key` marked used now, or None when it is not held or was idle too long."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        now = time.monotonic() if now is None else now
        if now - entry.seen > self.ttl:
            return None
        entry.seen = now
        self._entries.move_to_end(key)
        return entry

    def _draw_name(self, ordinal: int, agent: str | None) -> str:
        """NAME#N for the Nth session agent NAME opened, else the ordinal (numbers and names never meet)."""
        if agent is None:
            return str(ordinal)
        opened = self._opened[agent] = self._opened.pop(agent, 0) + 1
        if len(self._opened) > self.limit:
            self._opened.popitem(last=False)
        return f"{agent}#{opened}"

    def end(self, key: str, reason: str = "ended") -> bool:
        """Forget a session whose agent said it is over; False when it was not held."""
        if key not in self._entries:
            return False
        self._drop(key, reason)
        return True

    def page(self, offset: int = 0, limit: int = 100, now: float | None = None) -> list[dict[str, Any]]:
        """Sessions, most recently used first, as the control API shows them."""
        now = time.monotonic() if now is None else now
        self._expire(now)
        return [{"session": entry.key, "ordinal": entry.ordinal, "agent": entry.agent, "draws": entry.draws,
                 "idle_s": round(now - entry.seen, 3), "tool_calls": entry.state.tool_calls}
                for entry in islice(reversed(self._entries.values()), offset, offset + limit)]

    def _expire(self, now: float) -> None:
        """Drop idle sessions: they are at the front, so this stops at the first one still in use."""
        while self._entries:
            key, entry = next(iter(self._entries.items()))
            if now - entry.seen <= self.ttl:
                return
            self._drop(key, "idle")

    def _drop(self, key: str, reason: str) -> None:
        del self._entries[key]
        self._gone[key] = reason
        self._gone.move_to_end(key)
        if len(self._gone) > self.limit:
            self._gone.popitem(last=False)
        self._on_change(key, "dropped", reason)
