"""The 2026-07-28 features from the SDK client's side: tests/helpers/modern_server.py served over streamable
HTTP or stdio (directly or behind `chaosproxy stdio`), an elicitation callback that answers and counts
the questions it was asked, and the Tasks extension's client half, built on the SDK's ClientExtension
(the SDK ships neither half): a `report` task is polled with `tasks/get` until it ends."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import anyio
from mcp import Client, StdioServerParameters
from mcp.client.extension import ClaimContext, ClientExtension, ResultClaim
from mcp.shared.exceptions import MCPError
from mcp_types import CallToolResult, ElicitResult, GetTaskRequest, GetTaskRequestParams, Result
from pydantic import BaseModel, ConfigDict

from tests.helpers.mcp_support import serve
from tests.helpers.stdio_support import PROXY

SERVER = [sys.executable, "-m", "tests.helpers.modern_server"]
TASKS = "io.modelcontextprotocol/tasks"
POLL_LIMIT = 50  # polls of one task before the client gives up (a stuck task)


@contextlib.contextmanager
def serve_http(*flags: str) -> Iterator[str]:
    """tests/helpers/modern_server.py over streamable HTTP; yields its base URL (the endpoint is /mcp)."""
    with serve("http", *flags, command=SERVER) as url:
        yield url


def stdio_params(log: Path | None = None, scenario: Path | None = None, *flags: str) -> StdioServerParameters:
    """The server over stdio: directly, or behind `chaosproxy stdio` with `scenario` when given a log."""
    server = [*SERVER, "stdio", *flags]
    if log is None:
        return StdioServerParameters(command=server[0], args=server[1:])
    proxy = [*PROXY[1:], "--log", str(log), *(["--scenario", str(scenario)] if scenario else []), "--", *server]
    return StdioServerParameters(command=sys.executable, args=proxy)


@dataclass
class Asker:
    """An elicitation callback: answers each question with the environment's name, keeps what it was asked."""

    name: str = "staging"
    asked: list[str] = field(default_factory=list)

    async def __call__(self, context: Any, params: Any) -> ElicitResult:
        self.asked.append(params.message)
        return ElicitResult(action="accept", content={"name": self.name})


class GetTask(GetTaskRequest):
    """`tasks/get` as the Tasks extension sends it: the task id mirrored into Mcp-Name (SEP-2663)."""

    name_param = "taskId"


class TaskPoll(BaseModel):
    """A `tasks/get` result, as the Tasks extension writes it."""

    model_config = ConfigDict(extra="allow")
    taskId: str  # noqa: N815 (the wire's name)
    status: str
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None


class TaskCreated(Result):
    """A `tools/call` answered with a task (resultType "task")."""

    model_config = ConfigDict(extra="allow")
    result_type: Literal["task"] = "task"
    taskId: str  # noqa: N815


@dataclass
class TasksClient(ClientExtension):
    """The Tasks extension's client half: a task is polled with `tasks/get` until it ends (POLL_LIMIT polls)."""

    identifier = TASKS
    polls: list[str] = field(default_factory=list)  # the statuses seen, poll by poll

    def claims(self) -> list[ResultClaim[Any]]:
        return [ResultClaim(result_type="task", model=TaskCreated, resolve=self.resolve)]

    async def resolve(self, created: TaskCreated, ctx: ClaimContext) -> CallToolResult:
        for _ in range(POLL_LIMIT):
            poll = await ctx.session.send_request(GetTask(params=GetTaskRequestParams(task_id=created.taskId)),
                                                  TaskPoll)
            self.polls.append(poll.status)
            if poll.status == "completed" and poll.result is not None:
                return CallToolResult.model_validate(poll.result)
            if poll.status in ("failed", "cancelled"):
                raise MCPError(code=-32603, message=f"task {poll.status}")
            await anyio.sleep(0.01)
        raise TimeoutError(f"task {created.taskId} still {self.polls[-1]} after {POLL_LIMIT} polls")


def modern(target: str | StdioServerParameters, **kwargs: Any) -> Client:
    """An SDK client that negotiates the 2026-07-28 era when the server speaks it (mode auto, unless told)."""
    return Client(target, **{"mode": "auto", **kwargs})
