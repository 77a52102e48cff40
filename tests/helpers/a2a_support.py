"""Support for the A2A tests: a remote agent served by the real a2a-sdk (JSON-RPC and HTTP+JSON bindings,
v1.0 and v0.3 on the same endpoints), and the SDK's own client pointed at a proxy or straight at it."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
import uvicorn
from a2a.client import ClientConfig, ClientFactory
from a2a.helpers.proto_helpers import get_message_text, new_task_from_user_message, new_text_part
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes, create_rest_routes
from a2a.server.tasks import (
    BasePushNotificationSender,
    InMemoryPushNotificationConfigStore,
    InMemoryTaskStore,
    TaskUpdater,
)
from a2a.types.a2a_pb2 import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    Message,
    Part,
    Role,
    SendMessageRequest,
)
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tests.helpers.support import ServerLoop, free_port

JSONRPC, REST = "JSONRPC", "HTTP+JSON"
V03_CARD = "/v03/.well-known/agent-card.json"  # the same agent, its card offering v0.3 interfaces
ANSWER = "The capital of France is Paris, a city of about two million people on the Seine."


class Echo(AgentExecutor):
    """The remote agent: a task that works, gives one artifact answering the message, and completes."""

    async def execute(self, context: RequestContext, queue: EventQueue) -> None:
        message = context.message
        assert message is not None  # the SDK hands an executor the message it runs for
        task = context.current_task or new_task_from_user_message(message)
        await queue.enqueue_event(task)
        updater = TaskUpdater(queue, task.id, task.context_id)
        await updater.start_work()
        await updater.add_artifact([new_text_part(f"{ANSWER} (asked: {get_message_text(message)})")],
                                   name="answer")
        await updater.complete()

    async def cancel(self, context: RequestContext, queue: EventQueue) -> None:
        await TaskUpdater(queue, context.task_id or "", context.context_id or "").cancel()


def _card(base: str, version: str) -> AgentCard:
    return AgentCard(
        name="geography-agent", description="Answers questions about places.", version="1.0",
        supported_interfaces=[
            AgentInterface(url=f"{base}/a2a/jsonrpc", protocol_binding=JSONRPC, protocol_version=version),
            AgentInterface(url=f"{base}/a2a/rest", protocol_binding=REST, protocol_version=version)],
        capabilities=AgentCapabilities(streaming=True, push_notifications=True, extended_agent_card=True),
        default_input_modes=["text/plain"], default_output_modes=["text/plain"],
        skills=[AgentSkill(id="geography", name="Geography", description="Facts about countries and cities.",
                           tags=["geography"], examples=["What is the capital of France?"])])


@dataclass
class Webhook:
    """Where the remote agent's push notifications arrive (a real listener on loopback)."""

    url: str
    received: list[bytes] = field(default_factory=list)


@dataclass
class RemoteAgent:
    url: str
    webhook: Webhook


async def _serve(port: int, webhook_port: int,
                 base: str | None = None) -> tuple[dict[uvicorn.Server, asyncio.Task[None]], Webhook]:
    """The remote agent on `port`, its cards naming `base` (default: itself) as where to call it."""
    base = base or f"http://127.0.0.1:{port}"
    store = InMemoryPushNotificationConfigStore()
    sender = BasePushNotificationSender(httpx.AsyncClient(), store, push_url_validator=_any_url)
    handler = DefaultRequestHandler(Echo(), InMemoryTaskStore(), _card(base, "1.0"), push_config_store=store,
                                    push_sender=sender, push_url_validator=_any_url,
                                    extended_agent_card=_card(base, "1.0"))
    routes = [*create_agent_card_routes(_card(base, "1.0")),
              *create_agent_card_routes(_card(base, "0.3"), card_url=V03_CARD),
              *create_jsonrpc_routes(handler, "/a2a/jsonrpc", enable_v0_3_compat=True),
              *create_rest_routes(handler, enable_v0_3_compat=True, path_prefix="/a2a/rest")]
    agent = uvicorn.Server(uvicorn.Config(Starlette(routes=routes), host="127.0.0.1", port=port, log_level="warning"))
    webhook = Webhook(f"http://127.0.0.1:{webhook_port}/hook")

    async def receive(request: Request) -> Response:
        webhook.received.append(await request.body())
        return Response(status_code=200)

    hook = uvicorn.Server(uvicorn.Config(Starlette(routes=[Route("/hook", receive, methods=["POST"])]),
                                         host="127.0.0.1", port=webhook_port, log_level="warning"))
    serving = {server: asyncio.get_running_loop().create_task(server.serve()) for server in (agent, hook)}
    async with asyncio.timeout(10):
        while not (agent.started and hook.started):
            await asyncio.sleep(0.01)
    return serving, webhook


async def _any_url(url: str) -> bool:
    return True  # (the SDK refuses loopback webhooks by default: these tests live on loopback)


async def _stop(serving: dict[uvicorn.Server, asyncio.Task[None]]) -> None:
    for server in serving:
        server.should_exit = True
    await asyncio.wait(serving.values(), timeout=10)


@pytest.fixture(scope="session")
def remote_agent(server_loop: ServerLoop) -> Iterator[RemoteAgent]:
    port = free_port()
    serving, webhook = server_loop.run(_serve(port, free_port()))
    yield RemoteAgent(f"http://127.0.0.1:{port}", webhook)
    server_loop.run(_stop(serving))


@dataclass
class Wire:
    """What the client's HTTP traffic carried: each request and each response body, in order."""

    requests: list[tuple[str, str, bytes]] = field(default_factory=list)
    responses: list[tuple[int, str, bytes]] = field(default_factory=list)


@asynccontextmanager
async def a2a_client(url: str, binding: str, *, streaming: bool, version: str = "1.0",
                     timeout: float = 10.0, wire: Wire | None = None) -> AsyncIterator[Any]:
    """The SDK's client for the agent at `url` (its card fetched from there, as the SDK does)."""
    hooks: dict[str, list[Any]] = {}
    if wire is not None:
        async def on_request(request: httpx.Request) -> None:
            wire.requests.append((request.method, request.url.path, request.content))

        async def on_response(response: httpx.Response) -> None:
            await response.aread()
            wire.responses.append((response.status_code, response.url.path, response.content))
        hooks = {"request": [on_request], "response": [on_response]}
    async with httpx.AsyncClient(timeout=timeout, event_hooks=hooks) as http:
        config = ClientConfig(httpx_client=http, supported_protocol_bindings=[binding], streaming=streaming)
        client = await ClientFactory(config).create_from_url(
            url, relative_card_path=V03_CARD if version == "0.3" else None)
        try:
            yield client
        finally:
            await client.close()


def question(text: str = "What is the capital of France?", task_id: str | None = None) -> SendMessageRequest:
    message = Message(role=Role.ROLE_USER, message_id=f"m-{abs(hash((text, task_id)))}", parts=[Part(text=text)])
    if task_id is not None:
        message.task_id = task_id
    return SendMessageRequest(message=message)


async def events(client: Any, request: SendMessageRequest) -> list[Any]:
    """Every StreamResponse the client yields for one send (a whole reply is one)."""
    return [event async for event in client.send_message(request)]


def final_task(responses: list[Any]) -> Any:
    """The task as the responses tell it: the last task snapshot, updated by status and artifact events."""
    from a2a.types.a2a_pb2 import Task
    task = Task()
    for response in responses:
        if response.HasField("task"):
            task.CopyFrom(response.task)
        elif response.HasField("status_update"):
            task.status.CopyFrom(response.status_update.status)
        elif response.HasField("artifact_update"):
            task.artifacts.append(response.artifact_update.artifact)
    return task


VOLATILE = re.compile(rb'[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|'
                      rb'\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?Z|"seconds":\s*"?\d+"?|"nanos":\s*\d+')


def normalized(body: bytes) -> bytes:
    """A body with what differs from run to run (ids, timestamps) masked, the rest byte for byte."""
    return VOLATILE.sub(b"<v>", body)
