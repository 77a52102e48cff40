"""The lifecycle of a long-running task, as A2A (v1.0 and v0.3) and MCP's Tasks name its states.

Faults and match keys speak one vocabulary (A2A v0.3's spelling: `working`, `input-required`); each
protocol's own spelling is read and written here, so a rule written once acts on every surface.
"""

from __future__ import annotations

from enum import StrEnum


class TaskState(StrEnum):
    """A task's state, whatever protocol carries it."""

    SUBMITTED = "submitted"
    WORKING = "working"
    INPUT_REQUIRED = "input-required"
    AUTH_REQUIRED = "auth-required"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELED = "canceled"
    REJECTED = "rejected"


TERMINAL = frozenset({TaskState.COMPLETED, TaskState.FAILED, TaskState.CANCELED, TaskState.REJECTED})
INTERRUPTED = frozenset({TaskState.INPUT_REQUIRED, TaskState.AUTH_REQUIRED})  # the remote side waits for the caller

_A2A_1_0_PREFIX = "TASK_STATE_"
_MCP = {"input_required": TaskState.INPUT_REQUIRED, "cancelled": TaskState.CANCELED}


def parse_state(name: object) -> TaskState | None:
    """The state a protocol's spelling names (`TASK_STATE_INPUT_REQUIRED`, `input-required`,
    `input_required`, `cancelled`), or None for anything else (an unknown or unspecified state)."""
    if not isinstance(name, str):
        return None
    if name.startswith(_A2A_1_0_PREFIX):
        name = name[len(_A2A_1_0_PREFIX):].lower().replace("_", "-")
    mcp = _MCP.get(name)
    if mcp is not None:
        return mcp
    try:
        return TaskState(name)
    except ValueError:
        return None


def a2a_spelling(state: TaskState, version: str) -> str:
    """How A2A `version` ("1.0" or "0.3") writes `state` in JSON."""
    if version == "0.3":
        return state.value
    return _A2A_1_0_PREFIX + state.value.upper().replace("-", "_")
