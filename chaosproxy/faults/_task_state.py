"""What the task-state faults share (stuck, failed, rejected, input-required loops), whatever protocol
carries the task: A2A's tasks today, MCP's Tasks through the same `TaskReply` reading.

A relay asks these faults about every piece of a reply that bears a task (the task itself, a status or
artifact update, a message of the task), with the task as the decision's key (`Engine.decide`'s `key`):
the task meets the same decision in every reply about it (the send's answer, each stream event, each
GetTask), and a rule's gates count tasks, not replies. Once a fault took a task, it keeps it.

Not a fault itself: it registers nothing.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from pydantic import Field

from chaosproxy.engine.actions import Action, EndStream, Rewrite, Withhold
from chaosproxy.engine.message import Message, Phase
from chaosproxy.faults.base import Component, Fault, FaultContext, Level
from chaosproxy.protocols import a2a, mcp_tasks
from chaosproxy.protocols.a2a import wire
from chaosproxy.protocols.tasks import INTERRUPTED, TERMINAL, TaskState

MAX_TASKS = 1024  # tasks a rule remembers per session, oldest forgotten first


@dataclass(slots=True)
class TaskReply:
    """One piece of a reply about a task, as a task-state fault sees it.

    `kind`: task, status (an update of its state), artifact (an update of its results) or message;
    `event`: its index in a stream (None in a whole reply); `stream`: which stream of the session it
    came in; `followup`: the request sent the task a message (an answer to its question).
    """

    task_id: str
    kind: str
    state: TaskState | None
    event: int | None
    stream: int | None
    followup: bool
    forced: Callable[[TaskState, str | None, bool], dict[str, Any]]  # (state, message, keep results) -> piece

    @property
    def ends_stream(self) -> bool:
        return self.state in TERMINAL or self.state in INTERRUPTED


def task_reply(msg: Message) -> TaskReply | None:
    """The task piece `msg` (a relay's synthetic response, or the answer to an MCP Tasks poll) stands
    for, or None when it bears no task."""
    call = msg.a2a
    result = (msg.rpc or {}).get("result")
    if call is None and msg.method == mcp_tasks.POLL:
        return _mcp_task(result)
    if call is None or call.kind is None or call.task_id is None or not isinstance(result, dict):
        return None
    piece = wire.Piece(call.kind, result, lambda new: None)
    spelling = wire.dialect(piece, call)

    def forced(state: TaskState, text: str | None, keep_results: bool) -> dict[str, Any]:
        return wire.with_state(piece, spelling, state, text, keep_results=keep_results)

    return TaskReply(call.task_id, call.kind, call.state, call.event, call.stream, call.followup, forced)


def _mcp_task(result: Any) -> TaskReply | None:
    """An MCP Tasks poll's answer (tasks/get, `io.modelcontextprotocol/tasks`): a whole task, in no stream."""
    reported = mcp_tasks.reported(result)
    if reported is None:
        return None
    task_id, state = reported

    def forced(new: TaskState, text: str | None, keep_results: bool) -> dict[str, Any]:
        return mcp_tasks.with_state(result, new, text, keep_results)

    return TaskReply(task_id, "task", state, None, None, False, forced)


class TaskStateFault(Fault):
    """Base of the faults that change what a task's replies say of its state."""

    component = Component.TRANSITION
    level = Level.A2A
    phase = Phase.RESPONSE
    methods = a2a.TASK_REPLIES | {mcp_tasks.POLL}
    # True: the relay keeps the real piece the fault replaced, and answers the task's follow-ups from it
    # (the remote agent is not asked again about a task it finished)
    holds_results: ClassVar[bool] = False

    def level_on(self, msg: Message) -> Level:
        """A2A on an A2A relay's task, MCP on the answer to an MCP Tasks poll."""
        return Level.A2A if msg.a2a is not None else Level.MCP

    def act(self, ctx: FaultContext) -> Action | None:
        reply = task_reply(ctx.message)
        return None if reply is None else self.on_task(reply, ctx)

    def on_task(self, reply: TaskReply, ctx: FaultContext) -> Action | None:
        raise NotImplementedError


class TerminalFault(TaskStateFault):
    """Base of task_failed and task_rejected: the task ends in `state`, the remote agent saying `message`."""

    state: ClassVar[TaskState]
    default_message: ClassVar[str]
    message: str | None = Field(None, min_length=1, max_length=4096, description=(
        "what the remote agent says (the task's status message); unset: a short message of the fault's"))

    def on_task(self, reply: TaskReply, ctx: FaultContext) -> Action | None:
        if reply.kind in ("artifact", "message"):
            return withheld(reply, f"{reply.kind} of a task that {self.state}")
        text = self.message or self.default_message
        return rewritten(ctx.message, reply.forced(self.state, text, False), state=self.state.value)


def rewritten(msg: Message, piece: dict[str, Any], **effect: Any) -> Rewrite:
    """The synthetic message `msg` carrying `piece` instead."""
    return Rewrite({**(msg.rpc or {}), "result": piece}, effect=effect)


def withheld(reply: TaskReply, what: str) -> Withhold | None:
    """A stream's event about the task left out (a whole reply keeps its other pieces: nothing to do)."""
    return Withhold(what) if reply.event is not None else None


def ended(reply: TaskReply, idle: bool) -> EndStream:
    return EndStream(reply.event or 0, idle=idle)


def remembered(ctx: FaultContext, task_id: str, default: Any) -> Any:
    """What this rule keeps about `task_id` in this session (`default` the first time), bounded."""
    tasks: OrderedDict[str, Any] = ctx.state.setdefault("tasks", OrderedDict())
    if task_id not in tasks:
        tasks[task_id] = default
        if len(tasks) > MAX_TASKS:
            tasks.popitem(last=False)
    tasks.move_to_end(task_id)
    return tasks[task_id]


def remember(ctx: FaultContext, task_id: str, value: Any) -> None:
    remembered(ctx, task_id, value)
    ctx.state["tasks"][task_id] = value
