"""The task of both example delegating agents, as a scripted policy (no LLM): ask the remote agent at
CHAOSPROXY_URL (an A2A agent, its card at /.well-known/agent-card.json) for a trip plan and check it.

The agents differ only in how they deal with the remote agent: one trusts it, one does not. Both use
the a2a-sdk client (`pip install "a2a-sdk[http-server]"`; the test extra has it).
"""

from __future__ import annotations

import os
import sys
from typing import Any

from a2a.types.a2a_pb2 import Message, Part, Role, SendMessageRequest, Task

QUESTION = "Plan two days in Paris"
ANSWER = "Paris"  # what the plan must mention
CLARIFY = "Paris, France: two days, this weekend."  # the careful agent's answer when asked for more input


def agent_url() -> str:
    return os.environ["CHAOSPROXY_URL"]


def request(text: str, task_id: str | None = None) -> SendMessageRequest:
    message = Message(role=Role.ROLE_USER, message_id=os.urandom(8).hex(), parts=[Part(text=text)])
    if task_id:
        message.task_id = task_id
    return SendMessageRequest(message=message)


async def streamed(client: Any, text: str, task_id: str | None = None) -> Task:
    """The task as the stream of one send tells it (it may end early: a careful caller checks)."""
    task = Task()
    async for event in client.send_message(request(text, task_id)):
        if event.HasField("task"):
            task.CopyFrom(event.task)
        elif event.HasField("status_update"):
            task.status.CopyFrom(event.status_update.status)
        elif event.HasField("artifact_update"):
            task.artifacts.append(event.artifact_update.artifact)
    return task


def plan_of(task: Task) -> str:
    return " ".join(part.text for artifact in task.artifacts for part in artifact.parts)


def done(task: Task) -> int:
    """The agent's exit status for the task as it ended: 0 when it holds a plan that answers the question."""
    plan = plan_of(task)
    if ANSWER in plan:
        print(f"plan: {plan}")
        return 0
    print(f"no usable plan (task state {task.status.state}): {plan!r:.200}", file=sys.stderr)
    return 1
