"""MCP's Tasks extension (`io.modelcontextprotocol/tasks`, SEP-2663) as the task-state faults read and
write it: the task a `tasks/get` asks about, the state its answer reports (in `chaosproxy.protocols.tasks`'
vocabulary, shared with A2A), that answer made to report another state, and the error for a task the
server does not know. Plain dicts in, new dicts out."""

from __future__ import annotations

from typing import Any

from chaosproxy.protocols.tasks import TERMINAL, TaskState, parse_state

POLL = "tasks/get"
# Error Handling, "Protocol Errors": an invalid or nonexistent taskId MUST get -32602 on tasks/get
NOT_FOUND = (-32602, "Failed to retrieve task: Task not found")
_SPELLING = {TaskState.INPUT_REQUIRED: "input_required", TaskState.CANCELED: "cancelled"}
_OUTCOMES = ("result", "error", "inputRequests")  # what a status brings along (Task Status, "Derived shapes")


def polled_task(rpc: dict[str, Any] | None) -> str | None:
    """The task id a tasks/get request asks about."""
    params = (rpc or {}).get("params")
    task_id = params.get("taskId") if isinstance(params, dict) else None
    return task_id if isinstance(task_id, str) else None


def reported(result: Any) -> tuple[str, TaskState] | None:
    """(task id, state) a tasks/get result reports, or None when it reports no task."""
    if not isinstance(result, dict) or not isinstance(result.get("taskId"), str):
        return None
    state = parse_state(result.get("status"))
    return None if state is None else (result["taskId"], state)


def spelling(state: TaskState) -> str:
    """How the Tasks extension writes `state` (`input_required`, `cancelled`, ...)."""
    return _SPELLING.get(state, state.value)


def with_state(result: dict[str, Any], state: TaskState, message: str | None = None,
               keep_results: bool = False) -> dict[str, Any]:
    """`result` (a tasks/get result) reporting `state` instead, with `message` as its statusMessage when
    given; what the old status brought along (result, error, inputRequests) goes, unless `keep_results`
    and the new state is terminal too. A result that already says `state` (and no new message) is
    returned as it is."""
    if message is None and parse_state(result.get("status")) is state:
        return result
    kept = {key: value for key, value in result.items()
            if key not in _OUTCOMES or (keep_results and state in TERMINAL)}
    if message is not None:
        kept["statusMessage"] = message
    elif state not in TERMINAL:
        kept.pop("statusMessage", None)  # (the old state's words)
    return {**kept, "status": spelling(state)}
