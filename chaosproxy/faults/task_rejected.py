from __future__ import annotations

from typing import ClassVar, Literal

from chaosproxy.faults._task_state import TerminalFault
from chaosproxy.faults.base import register
from chaosproxy.protocols.tasks import TaskState


@register
class TaskRejected(TerminalFault):
    """The remote agent rejects a task it is sent, with its message; the work it did is withheld."""

    type: Literal["task_rejected"] = "task_rejected"
    state: ClassVar[TaskState] = TaskState.REJECTED
    default_message: ClassVar[str] = "The agent declined this task."
