from __future__ import annotations

from typing import ClassVar, Literal

from chaosproxy.faults._task_state import TerminalFault
from chaosproxy.faults.base import register
from chaosproxy.protocols.tasks import TaskState


@register
class TaskFailed(TerminalFault):
    """A task ends failed, with the remote agent's message; the work it did is withheld."""

    type: Literal["task_failed"] = "task_failed"
    state: ClassVar[TaskState] = TaskState.FAILED
    default_message: ClassVar[str] = "The agent failed to complete the task: an internal error occurred."
