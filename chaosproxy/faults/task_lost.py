from __future__ import annotations

from typing import Literal

from chaosproxy.engine.actions import Reply
from chaosproxy.engine.message import Phase
from chaosproxy.faults.base import Component, Fault, FaultContext, Level, register
from chaosproxy.protocols import mcp_tasks
from chaosproxy.protocols.mcp import error_reply


@register
class TaskLost(Fault):
    """The server no longer knows the task it handed out: each poll of it gets "task not found"."""

    type: Literal["task_lost"] = "task_lost"

    component = Component.TRANSITION
    level = Level.JSONRPC
    phase = Phase.REQUEST
    methods = frozenset({mcp_tasks.POLL})

    def act(self, ctx: FaultContext) -> Reply | None:
        rpc = ctx.message.rpc or {}
        if mcp_tasks.polled_task(rpc) is None or "id" not in rpc:
            return None
        code, message = mcp_tasks.NOT_FOUND
        return Reply(error_reply(ctx.message, code, message))
