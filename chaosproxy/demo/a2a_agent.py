"""A small remote agent for the demo, the drills and the benchmark: A2A v1.0 over JSON-RPC (aiohttp,
loopback), enough for the a2a-sdk client and the demo's delegating agent.

  GET  /.well-known/agent-card.json   its card: one skill (plan-trip), streaming, its URL from the Host header
  POST /a2a   SendMessage             a task, completed, with one artifact (a trip plan for the city asked)
              SendStreamingMessage    the same task as SSE events: submitted, working, the artifact, completed
              GetTask, CancelTask     the task as it stands (a finished task cannot be canceled: -32002)

    python -m chaosproxy.demo.a2a_agent --port 9031
"""

from __future__ import annotations

import argparse
import asyncio
import uuid
from collections import OrderedDict
from datetime import UTC, datetime
from typing import Any

import orjson
from aiohttp import web

from chaosproxy.demo.serving import serve

MAX_TASKS = 10_000
WORK_S = 0.02  # how long a task works before its artifact (a stream shows each step)
CITIES = {"paris": "the Louvre, a walk along the Seine, dinner in the Marais",
          "tokyo": "Senso-ji at dawn, the Tsukiji outer market, an evening in Shinjuku",
          "lima": "the historic centre, Barranco's murals, ceviche in Miraflores"}


def card(base: str) -> dict[str, Any]:
    return {
        "name": "travel-agent", "description": "Plans short trips to a city.", "version": "1.0",
        "supportedInterfaces": [{"url": f"{base}/a2a", "protocolBinding": "JSONRPC", "protocolVersion": "1.0"}],
        "capabilities": {"streaming": True}, "defaultInputModes": ["text/plain"], "defaultOutputModes": ["text/plain"],
        "skills": [{"id": "plan-trip", "name": "Plan a trip", "description": "A day-by-day plan for a city.",
                    "tags": ["travel"], "examples": ["Plan two days in Paris"]}],
    }


def plan(question: str) -> str:
    city = next((name for name in CITIES if name in question.lower()), "paris")
    return f"Two days in {city.title()}: {CITIES[city]}."


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _status(state: str) -> dict[str, Any]:
    return {"state": f"TASK_STATE_{state}", "timestamp": _now()}


class Agent:
    """The tasks it was given (bounded, oldest forgotten first)."""

    def __init__(self, work_s: float = WORK_S) -> None:
        self.tasks: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self.work_s = work_s

    def new_task(self, message: dict[str, Any]) -> dict[str, Any]:
        task_id, context = str(uuid.uuid4()), message.get("contextId") or str(uuid.uuid4())
        task = {"id": task_id, "contextId": context, "status": {"state": "TASK_STATE_SUBMITTED"},
                "history": [{**message, "taskId": task_id, "contextId": context}]}
        self.tasks[task_id] = task
        if len(self.tasks) > MAX_TASKS:
            self.tasks.popitem(last=False)
        return task

    async def work(self, task: dict[str, Any], question: str) -> list[tuple[str, dict[str, Any]]]:
        """The task's events after it was submitted (each applied to the task as it happens)."""
        ids = {"taskId": task["id"], "contextId": task["contextId"]}
        task["status"] = _status("WORKING")
        events = [("statusUpdate", {**ids, "status": task["status"]})]
        await asyncio.sleep(self.work_s)
        artifact = {"artifactId": str(uuid.uuid4()), "name": "plan", "parts": [{"text": plan(question)}]}
        task["artifacts"] = [artifact]
        events.append(("artifactUpdate", {**ids, "artifact": artifact}))
        task["status"] = _status("COMPLETED")
        events.append(("statusUpdate", {**ids, "status": task["status"]}))
        return events


AGENT = web.AppKey("agent", Agent)


def _text(message: dict[str, Any]) -> str:
    return " ".join(part["text"] for part in message.get("parts", []) if isinstance(part, dict) and "text" in part)


async def handle(request: web.Request) -> web.StreamResponse:
    agent = request.app[AGENT]
    try:
        rpc = orjson.loads(await request.read())
        method, params, rpc_id = rpc["method"], rpc.get("params") or {}, rpc.get("id")
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return web.json_response({"jsonrpc": "2.0", "id": None, "error": {"code": -32700, "message": "Parse error"}})

    def reply(result: Any = None, error: tuple[int, str] | None = None) -> web.Response:
        body = {"jsonrpc": "2.0", "id": rpc_id} | (
            {"error": {"code": error[0], "message": error[1]}} if error else {"result": result})
        return web.Response(body=orjson.dumps(body), content_type="application/json")

    if method in ("SendMessage", "SendStreamingMessage"):
        message = params.get("message") or {}
        if message.get("taskId") in agent.tasks:
            return reply(error=(-32602, "Invalid params: the task is in a terminal state and takes no more messages"))
        task = agent.new_task(message)
        if method == "SendMessage":
            await agent.work(task, _text(message))
            return reply({"task": task})
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        for name, event in [("task", dict(task)), *await agent.work(task, _text(message))]:
            body = orjson.dumps({"jsonrpc": "2.0", "id": rpc_id, "result": {name: event}})
            await response.write(b"data: " + body + b"\r\n\r\n")
        await response.write_eof()
        return response
    known = agent.tasks.get(params.get("id", ""))
    if method in ("GetTask", "CancelTask") and known is None:
        return reply(error=(-32001, "Task not found"))
    if method == "GetTask":
        return reply(known)
    if method == "CancelTask":
        return reply(error=(-32002, "Task cannot be canceled: it is in a terminal state"))
    return reply(error=(-32601, f"Method not found: {method}"))


async def agent_card(request: web.Request) -> web.Response:
    return web.json_response(card(f"{request.scheme}://{request.host}"))


def app(work_s: float = WORK_S) -> web.Application:
    application = web.Application()
    application[AGENT] = Agent(work_s)
    application.router.add_get("/.well-known/agent-card.json", agent_card)
    application.router.add_post("/a2a", handle)
    return application


async def start(port: int = 0) -> tuple[web.AppRunner, int]:
    return await serve(app(), port=port)


def main() -> None:
    parser = argparse.ArgumentParser(description="A small A2A remote agent (v1.0, JSON-RPC) on loopback.")
    parser.add_argument("--port", type=int, default=9031)
    parser.add_argument("--work-ms", type=float, default=WORK_S * 1000, help="how long a task works (default 20)")
    args = parser.parse_args()
    web.run_app(app(args.work_ms / 1000), host="127.0.0.1", port=args.port, access_log=None, print=lambda *_: None)


if __name__ == "__main__":
    main()
