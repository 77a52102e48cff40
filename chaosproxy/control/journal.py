"""The journal: the calls and faults the proxy recorded, kept in memory for tests to assert on.

It is the perturbation log's call and fault lines (every proxy's and scope's of the run, each marked
with them), numbered as they come, the last `size` of them kept: a test asks `GET /journal?scope=t1&
tool=search` and gets what the agent did and what befell it, in order, without reading a file. A test
that polls passes the `seq` of the last line it has as `since`, and gets only newer ones.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from chaosproxy.telemetry.log_schema import Event, Key

JOURNAL_SIZE = 10_000  # lines kept (the oldest go first); each is a dict of a few hundred bytes
MAX_ANSWER = 10_000  # lines in one answer
EVENTS = (Event.CALL, Event.FAULT)
# the query parameters that keep the lines whose field of the same name equals them, beside event, rule,
# since and limit; `fault` is a fault line's fault type (a call line names the rules whose faults hit it:
# `rule` finds those too)
FILTERS = (Key.SCOPE, Key.PROXY, Key.TOOL, Key.FAULT, Key.METHOD, Key.SESSION, Key.PATH)


class JournalQueryError(ValueError):
    """A query the journal cannot answer (a number that is not one, an unknown event)."""


class Journal:
    """A log listener keeping the last `size` call and fault lines."""

    def __init__(self, size: int = JOURNAL_SIZE) -> None:
        self.lines: deque[dict[str, Any]] = deque(maxlen=size)
        self._seq = itertools.count(1)

    def record(self, fields: dict[str, Any]) -> None:
        """The listener: copies the line (the log reuses its dict) with its number."""
        if fields.get(Key.EVENT) in EVENTS:
            self.lines.append({"seq": next(self._seq), **fields})

    def query(self, params: Mapping[str, str]) -> dict[str, Any]:
        """The lines that match the query's filters, oldest first: {"lines": [...], "last": SEQ}, where
        `last` is the newest line's number (kept or not), for the next `since`."""
        keep = _filters(params)
        since = _number(params, "since", 0)
        limit = min(_number(params, "limit", MAX_ANSWER), MAX_ANSWER)
        newest = self.lines[-1]["seq"] if self.lines else 0
        found = [line for line in self.lines if line["seq"] > since and all(check(line) for check in keep)]
        return {"lines": found[-limit:] if limit else [], "last": newest}

    def clear(self) -> None:
        self.lines.clear()


def _filters(params: Mapping[str, str]) -> list[Callable[[dict[str, Any]], bool]]:
    checks: list[Callable[[dict[str, Any]], bool]] = []
    event = params.get(Key.EVENT)
    if event is not None:
        if event not in EVENTS:
            raise JournalQueryError(f"event is one of {', '.join(EVENTS)}, got {event[:40]!r}")
        checks.append(lambda line: line.get(Key.EVENT) == event)
    checks += [_equals(key, value) for key in FILTERS if (value := params.get(key)) is not None]
    if (rule := params.get(Key.RULE)) is not None:  # a fault line of that rule, or a call the rule's fault hit
        checks.append(lambda line: line.get(Key.RULE) == rule or rule in (line.get(Key.FAULTS) or ()))
    return checks


def _equals(key: str, value: str) -> Callable[[dict[str, Any]], bool]:
    return lambda line: line.get(key) == value


def _number(params: Mapping[str, str], name: str, default: int) -> int:
    value = params.get(name)
    if value is None:
        return default
    if not value.isdigit():
        raise JournalQueryError(f"{name} is a whole number, got {value[:40]!r}")
    return int(value)
