"""What a protocol's relay remembers per agent session (the model API's calls and answers, A2A's tasks),
each kind of it bounded."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    from chaosproxy.engine.core import Engine


class Bounded[K, V](OrderedDict[K, V]):
    """One kind of what a relay remembers of a session (call ids, tasks): past LIMIT entries, the least
    recently remembered is forgotten."""

    LIMIT: ClassVar[int] = 4096

    def remember(self, key: K, value: V) -> None:
        self[key] = value
        self.move_to_end(key)
        if len(self) > self.LIMIT:
            self.popitem(last=False)


class SessionMemory[T]:
    """A `make()` per session, for at most `limit` sessions (the least recently used forgotten first),
    and forgotten with the engine's own sessions when those are (a reset makes the engine a new table)."""

    def __init__(self, engine: Engine, make: Callable[[], T], limit: int) -> None:
        self.engine = engine
        self.make = make
        self.limit = limit
        self._kept: OrderedDict[str, T] = OrderedDict()
        self._state_of: object = engine.sessions  # the engine's session table this memory goes with

    def __call__(self, session: str) -> T:
        if self._state_of is not self.engine.sessions:  # the engine forgot its sessions: so do we
            self._kept.clear()
            self._state_of = self.engine.sessions
        kept = self._kept.get(session)
        if kept is None:
            kept = self._kept[session] = self.make()
            if len(self._kept) > self.limit:
                self._kept.popitem(last=False)
        self._kept.move_to_end(session)
        return kept
