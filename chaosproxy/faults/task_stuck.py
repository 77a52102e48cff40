from __future__ import annotations

from typing import Literal

from pydantic import Field

from chaosproxy.engine.actions import Action
from chaosproxy.faults._task_state import TaskReply, TaskStateFault, ended, rewritten, withheld
from chaosproxy.faults.base import FaultContext, register
from chaosproxy.protocols.tasks import TaskState


@register
class TaskStuck(TaskStateFault):
    """A task never reaches a terminal state: every reply keeps saying it is working (or submitted)."""

    type: Literal["task_stuck"] = "task_stuck"
    state: Literal["working", "submitted"] = Field("working", description="the state the task stays in")

    def on_task(self, reply: TaskReply, ctx: FaultContext) -> Action | None:
        if reply.kind in ("artifact", "message"):
            return withheld(reply, f"{reply.kind} of a stuck task")
        if reply.event is not None and reply.ends_stream:
            return ended(reply, idle=True)  # its stream stays open and silent: the task never ends
        state = TaskState(self.state)
        return rewritten(ctx.message, reply.forced(state, None, False), state=self.state)
