"""The W3C trace context an agent (or a drill, in $TRACEPARENT) gives: `traceparent` parsed into the
`Parent` of the proxy's span, and `tracestate` kept only when it is a valid header value."""

from __future__ import annotations

import re
from typing import Any, NamedTuple

TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?")
ZERO_TRACE, ZERO_SPAN = "0" * 32, "0" * 16
# W3C Trace Context: `tracestate` is up to 32 list-members `key=value` (a key of lower-case letters, digits
# and _-*/@; a value of printable ASCII but `,` and `=`, not ending in a space), with spaces or tabs around
# each. One longer than 512 characters or breaking the grammar anywhere is dropped whole (a part kept would
# be a list nobody sent), as a malformed traceparent is: what goes upstream is a valid header value.
TRACESTATE_MEMBER = re.compile(r"[a-z0-9][a-z0-9_\-*/@]{0,255}=[\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}"
                               r"[\x21-\x2b\x2d-\x3c\x3e-\x7e]")
MAX_TRACESTATE = 512
MAX_TRACESTATE_MEMBERS = 32


class Parent(NamedTuple):
    """A W3C trace context the agent (or a drill) gave: the parent of the proxy's span."""

    trace_id: str
    span_id: str
    sampled: bool
    trace_state: str


def parse_traceparent(traceparent: Any, tracestate: Any) -> Parent | None:
    """The context a W3C `traceparent` names, or None when there is none (or it is malformed)."""
    if not isinstance(traceparent, str):
        return None
    match = TRACEPARENT.fullmatch(traceparent.strip())
    if match is None:
        return None
    version, trace_id, span_id, flags, rest = match.groups()
    if version == "ff" or (version == "00" and rest) or trace_id == ZERO_TRACE or span_id == ZERO_SPAN:
        return None
    return Parent(trace_id, span_id, int(flags, 16) & 1 == 1, valid_tracestate(tracestate))


def valid_tracestate(tracestate: Any) -> str:
    """A `tracestate` (the agent's, or $TRACESTATE) as it may go upstream in a header line: its members,
    comma-separated, or "" when it breaks the W3C grammar or limits (TRACESTATE_MEMBER)."""
    if type(tracestate) is not str or not tracestate or len(tracestate) > MAX_TRACESTATE:
        return ""
    members = [member for item in tracestate.split(",") if (member := item.strip(" \t"))]
    if len(members) > MAX_TRACESTATE_MEMBERS or not all(map(TRACESTATE_MEMBER.fullmatch, members)):
        return ""
    return ",".join(members)
