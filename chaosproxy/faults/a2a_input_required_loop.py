from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from chaosproxy.engine.actions import Action
from chaosproxy.faults._task_state import TaskReply, TaskStateFault, remember, remembered, rewritten, withheld
from chaosproxy.faults.base import FaultContext, register
from chaosproxy.protocols.tasks import TaskState

RELEASED = -1  # the agent got the task's result: the rule leaves the task alone from then on


@register
class A2aInputRequiredLoop(TaskStateFault):
    """The remote agent asks for input again after every answer, N times or for ever, before its result."""

    type: Literal["a2a_input_required_loop"] = "a2a_input_required_loop"
    rounds: int | None = Field(3, ge=1, le=1000, description=(
        "how many times the agent is asked for input before it gets the result; null: for ever"))
    question: str = Field("I need more details to continue: please clarify your request.", min_length=1,
                          max_length=4096, description="what the remote agent asks each time")

    # the proxy answers the task's follow-ups from the result it keeps: the remote agent finished the task
    holds_results: ClassVar[bool] = True

    def on_task(self, reply: TaskReply, ctx: FaultContext) -> Action | None:
        asked: int = remembered(ctx, reply.task_id, 0)
        if asked == RELEASED:
            return None
        if reply.kind in ("artifact", "message"):
            return withheld(reply, f"{reply.kind} of a task held in input-required")
        if reply.state is not TaskState.COMPLETED:
            return None  # asked once its work is done, in place of its result
        if reply.followup or asked == 0:  # an answer to the question (or the first result): ask again, or let go
            if self.rounds is not None and asked >= self.rounds:
                remember(ctx, reply.task_id, RELEASED)
                return None
            asked += 1
            remember(ctx, reply.task_id, asked)
        return rewritten(ctx.message, reply.forced(TaskState.INPUT_REQUIRED, self.question, False),
                         state=TaskState.INPUT_REQUIRED.value, round=asked)
