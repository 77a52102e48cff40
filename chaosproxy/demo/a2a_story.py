"""`chaosproxy demo --a2a`: an agent delegating to another agent over A2A, through the proxy, in a few seconds.

The bundled remote agent (demo/a2a_agent) behind one proxy with the bundled scenario (data/demo-a2a.yaml),
and a scripted delegating agent in plain HTTP (no SDK: the core install has none) that does what a careful
one does: reads the card (its URLs now point at the proxy), streams each task, polls a task whose stream
ended early, answers a question, gives up on a task that goes silent (and cancels it), tries a failed task
once more. Faults are shown as they fire; the run ends with a summary and an HTML report.
"""

from __future__ import annotations

import asyncio
import collections
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from chaosproxy.adapters.http import HttpProxy
from chaosproxy.demo import a2a_agent
from chaosproxy.demo.agents import Outcomes, say
from chaosproxy.demo.story import Fired, play
from chaosproxy.engine.core import Engine
from chaosproxy.telemetry.log_schema import Event, Key

ACT = "A2A delegation"
CITIES = ("Paris", "Tokyo", "Lima", "Paris", "Tokyo")
SILENCE_S = 1.0  # a task's stream silent this long: the agent stops waiting for it
POLLS = 5
TERMINAL = {"TASK_STATE_COMPLETED", "TASK_STATE_FAILED", "TASK_STATE_CANCELED", "TASK_STATE_REJECTED"}


def run_a2a_demo(log_path: Path | None = None) -> int:
    play("demo-a2a.yaml", _demo, log_path)
    print("scenarios/a2a/ has one scenario per A2A fault; scenarios/suites/a2a.yaml drills an agent over them")
    return 0


async def _demo(engine: Engine) -> tuple[dict[str, Outcomes], Fired]:
    runner, port = await a2a_agent.start()
    proxy = HttpProxy(engine, f"http://127.0.0.1:{port}")
    base = f"http://127.0.0.1:{await proxy.start('127.0.0.1', 0)}"
    print(f"chaosproxy {base} -> remote agent http://127.0.0.1:{port}  (scenario demo-a2a.yaml, seed {engine.seed})")
    fired: Fired = collections.Counter()

    def show_fault(event: dict[str, Any]) -> None:
        if event[Key.EVENT] == Event.FAULT:
            fired[event[Key.COMPONENT], event[Key.FAULT]] += 1
            print(f"      \u26a1 {event[Key.RULE]}: {event[Key.FAULT]} ({event[Key.COMPONENT]})", flush=True)

    unsubscribe = engine.log.subscribe(show_fault)
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as client:
            print(f"\n== {ACT}: an agent asks a remote agent for trip plans, over A2A v1.0 (JSON-RPC, streamed)")
            outcomes = await delegating_agent(client, base)
    finally:
        unsubscribe()
        await proxy.stop()
        await runner.cleanup()
    return {ACT: outcomes}, fired


async def delegating_agent(client: aiohttp.ClientSession, base: str) -> Outcomes:
    outcomes: Outcomes = collections.Counter()
    endpoint = await _read_card(client, base)
    for step, city in enumerate(CITIES, 1):
        if step == len(CITIES):
            endpoint = await _read_card(client, base)  # (it reads the card again before its last task)
        outcomes[await _task(client, endpoint, step, city)] += 1
    return outcomes


async def _read_card(client: aiohttp.ClientSession, base: str) -> str:
    async with client.get(base + "/.well-known/agent-card.json") as response:
        card = await response.json()
    skills = ", ".join(skill["id"] for skill in card.get("skills", []))
    endpoint = card["supportedInterfaces"][0]["url"]
    say(f"  card     {card['name']}: skills [{skills}]; calls go to {endpoint}")
    return str(endpoint)


async def _task(client: aiohttp.ClientSession, endpoint: str, step: int, city: str) -> str:
    task, note = await _stream(client, endpoint, {"message": _message(f"Plan two days in {city}")})
    outcome = "succeeded"
    if task.get("status", {}).get("state") == "TASK_STATE_INPUT_REQUIRED":
        question = task["status"].get("message", {}).get("parts", [{}])[0].get("text", "")
        say(f"  task {step}   {city}: asked {question!r}: answering")
        task, note = await _stream(client, endpoint, {"message": _message(f"Start in the centre of {city}.",
                                                                           task["id"])})
        outcome = "recovered"
    if note == "silent":
        await _call(client, endpoint, "CancelTask", {"id": task.get("id", "")})
        say(f"  task {step}   {city}: the stream went silent at {_state(task)} for {SILENCE_S:g} s: canceled, gave up")
        return "failed"
    if note == "cut" or (task.get("status", {}).get("state") == "TASK_STATE_COMPLETED" and not task.get("artifacts")):
        for _ in range(POLLS):
            task = await _call(client, endpoint, "GetTask", {"id": task["id"]})
            if _state(task) in TERMINAL:
                break
            await asyncio.sleep(0.05)
        say(f"  task {step}   {city}: the stream ended at {note == 'cut' and 'an early event' or 'no result'}: "
            f"polled GetTask")
        outcome = "recovered"
    if _state(task) == "TASK_STATE_FAILED":
        reason = task["status"].get("message", {}).get("parts", [{}])[0].get("text", "")
        say(f"  task {step}   {city}: failed ({reason!r}): one more try")
        task, _ = await _stream(client, endpoint, {"message": _message(f"Plan two days in {city}")})
        outcome = "recovered"
    plan = " ".join(part.get("text", "") for artifact in task.get("artifacts", []) for part in artifact["parts"])
    if city not in plan:
        say(f"  task {step}   {city}: no plan ({_state(task)})")
        return "failed"
    say(f"  task {step}   {city}: {plan[:90]}{'...' if len(plan) > 90 else ''}")
    return outcome


def _message(text: str, task_id: str | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {"messageId": f"demo-{abs(hash((text, task_id))):x}", "role": "ROLE_USER",
                               "parts": [{"text": text}]}
    if task_id is not None:
        message["taskId"] = task_id
    return message


def _state(task: dict[str, Any]) -> str:
    return str(task.get("status", {}).get("state", "?"))


async def _call(client: aiohttp.ClientSession, endpoint: str, method: str, params: dict[str, Any]) -> dict[str, Any]:
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
    async with client.post(endpoint, json=body, headers={"A2A-Version": "1.0"}) as response:
        reply = await response.json()
    return reply.get("result") or {}


async def _stream(client: aiohttp.ClientSession, endpoint: str, params: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """One streamed send: the task as its events built it, and how the stream ended (done, cut, silent)."""
    body = {"jsonrpc": "2.0", "id": 1, "method": "SendStreamingMessage", "params": params}
    task: dict[str, Any] = {}
    async with client.post(endpoint, json=body, headers={"A2A-Version": "1.0"}) as response:
        try:
            while line := await asyncio.wait_for(response.content.readline(), SILENCE_S):
                if line.startswith(b"data:"):
                    _apply(task, orjson.loads(line[5:]).get("result") or {})
        except TimeoutError:
            return task, "silent"
    return task, "done" if _state(task) in TERMINAL | {"TASK_STATE_INPUT_REQUIRED"} else "cut"


def _apply(task: dict[str, Any], event: dict[str, Any]) -> None:
    if "task" in event:
        task.clear()
        task.update(event["task"])
    elif "statusUpdate" in event:
        task["status"] = event["statusUpdate"]["status"]
    elif "artifactUpdate" in event:
        task.setdefault("artifacts", []).append(event["artifactUpdate"]["artifact"])
