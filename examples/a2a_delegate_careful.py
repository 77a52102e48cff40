"""An example delegating agent that does not trust the remote agent: every call bounded in time and
retried with backoff, a stream that ends early followed by polling the task (bounded), questions
answered a few times, a failed task tried once more, a task that never ends canceled at a deadline.

    CHAOSPROXY_URL=http://127.0.0.1:8800 python examples/a2a_delegate_careful.py
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
from a2a.client import ClientConfig, ClientFactory
from a2a.types.a2a_pb2 import CancelTaskRequest, GetTaskRequest, Task, TaskState
from a2a_task import CLARIFY, QUESTION, agent_url, done, streamed

CALL_TIMEOUT_S = 3.0  # one call (a read of the stream too)
TASK_DEADLINE_S = 6.0  # one delegated task, polled until it ends
TRIES = 2  # delegated tasks: a failed, rejected or stuck one is tried once more
ATTEMPTS = 4  # per call
ANSWERS = 4  # questions answered before giving up
TERMINAL = {TaskState.TASK_STATE_COMPLETED, TaskState.TASK_STATE_FAILED, TaskState.TASK_STATE_CANCELED,
            TaskState.TASK_STATE_REJECTED}
WAITING = {TaskState.TASK_STATE_INPUT_REQUIRED, TaskState.TASK_STATE_AUTH_REQUIRED}


async def retried[T](call: Callable[[], Awaitable[T]]) -> T:
    """`call`, tried again with backoff when it fails on the way (an error, a timeout)."""
    for attempt in range(ATTEMPTS):
        try:
            return await asyncio.wait_for(call(), CALL_TIMEOUT_S)
        except Exception as error:  # noqa: BLE001  (any failure of the call is worth one more try)
            if attempt == ATTEMPTS - 1:
                raise
            print(f"retrying after {type(error).__name__}: {error!s:.120}", file=sys.stderr)
            await asyncio.sleep(0.2 * 2 ** attempt)
    raise AssertionError("unreachable")


def unsettled(task: Task) -> bool:
    """Still under way, or completed with its results missing (its stream lost them)."""
    state = task.status.state
    return state not in TERMINAL | WAITING or (state == TaskState.TASK_STATE_COMPLETED and not task.artifacts)


async def settle(client: Any, task: Task, deadline: float) -> Task:
    """Poll the task until it is settled, up to `deadline`; then cancel it (once: it may have ended)."""
    delay = 0.1
    while unsettled(task):
        if time.monotonic() > deadline:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(client.cancel_task(CancelTaskRequest(id=task.id)), CALL_TIMEOUT_S)
            raise TimeoutError(f"task {task.id} still {TaskState.Name(task.status.state)} at the deadline: canceled")
        await asyncio.sleep(delay)
        delay = min(delay * 2, 1.0)
        task = await retried(lambda task_id=task.id: client.get_task(GetTaskRequest(id=task_id)))
    return task


async def delegate(client: Any, deadline: float) -> Task:
    task = await retried(lambda: streamed(client, QUESTION, None))
    for _ in range(ANSWERS):
        task = await settle(client, task, deadline) if task.id else task
        if task.status.state != TaskState.TASK_STATE_INPUT_REQUIRED:
            return task
        task = await retried(lambda task_id=task.id: streamed(client, CLARIFY, task_id))
    return task


async def main() -> int:
    async with httpx.AsyncClient(timeout=CALL_TIMEOUT_S) as http:
        config = ClientConfig(httpx_client=http, streaming=True)
        client = await retried(lambda: ClientFactory(config).create_from_url(agent_url()))
        task, status = Task(), 1
        try:
            for _ in range(TRIES):
                try:
                    task = await delegate(client, time.monotonic() + TASK_DEADLINE_S)
                except TimeoutError as error:
                    print(f"{error}: one more try", file=sys.stderr)
                    continue
                if (status := done(task)) == 0 or task.status.state not in (TaskState.TASK_STATE_FAILED,
                                                                              TaskState.TASK_STATE_REJECTED):
                    break
                print(f"the remote agent said {TaskState.Name(task.status.state)}: one more try", file=sys.stderr)
        except Exception as error:  # noqa: BLE001  (gave up: said so, and exit 1)
            print(f"gave up: {type(error).__name__}: {error!s:.200}", file=sys.stderr)
        finally:
            await client.close()
    return status


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
