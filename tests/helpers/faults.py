"""A socket-free fault harness: act one fault on one message and see the action it returns.

In the spirit of mitmproxy's `taddons`: a fault is parsed the way a scenario parses it (so its YAML
validation runs), observes the message and acts on it with a seeded stream, as the engine does once a
rule's match and gates let a message through. No proxy, no socket: what a test checks is the action
itself. Tests that check what the agent then receives go through a real proxy instead.

    from tests.helpers.faults import act, mcp_reply
    action = act({"type": "truncate_text", "chars": 5}, mcp_reply({"content": [...]}))
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any

from chaosproxy.engine.actions import Action, Skip
from chaosproxy.engine.message import Message, Phase
from chaosproxy.engine.scenario import parse_scenario
from chaosproxy.engine.session_state import SessionState
from chaosproxy.faults import Fault, FaultContext


def fault_of(spec: dict[str, Any]) -> Fault:
    """The fault a scenario makes of `spec` (its `fault:` mapping), validated as a scenario is."""
    return parse_scenario(json.dumps({"rules": [{"name": "r", "fault": spec}]})).rules[0].fault


@dataclass
class Acted:
    """What one act did: the action (None when the fault declined) and the parts it said it left alone."""

    action: Action | Skip | None
    skipped: list[str] = field(default_factory=list)


def acted(fault: dict[str, Any] | Fault, msg: Message, session: SessionState | None = None, *,
          seed: int = 1, state: dict[str, Any] | None = None, now: float = 0.0) -> Acted:
    """Observe `msg`, then act on it, as the engine does with a message the rule's gates let through.

    Pass the same `session` (and `state`, the rule's scratch space) to act on a sequence of messages."""
    fault = fault if isinstance(fault, Fault) else fault_of(fault)
    session = session if session is not None else SessionState()
    fault.observe(msg, session)
    ctx = FaultContext(msg, random.Random(seed), state if state is not None else {}, now, session, "r")
    return Acted(fault.act(ctx), ctx.skipped)


def act(fault: dict[str, Any] | Fault, msg: Message, session: SessionState | None = None, *,
        seed: int = 1, state: dict[str, Any] | None = None) -> Action | Skip | None:
    """The action of `acted`, alone."""
    return acted(fault, msg, session, seed=seed, state=state).action


def rpc_request(method: str, params: dict[str, Any] | None = None, *, id: int = 1,
                transport: str = "http") -> Message:
    """An agent's JSON-RPC request, as an adapter hands it to the engine."""
    call: dict[str, Any] = {"jsonrpc": "2.0", "id": id, "method": method}
    if params is not None:
        call["params"] = params
    return Message(transport, Phase.REQUEST, http_method="POST", path="/mcp",
                   headers={"Content-Type": "application/json"}, body=json.dumps(call).encode())


def tool_call(tool: str, arguments: dict[str, Any] | None = None, *, id: int = 1,
              transport: str = "http") -> Message:
    """An MCP tools/call request."""
    return rpc_request("tools/call", {"name": tool, "arguments": arguments or {}}, id=id, transport=transport)


def rpc_reply(request: Message, result: dict[str, Any] | None = None, *,
              error: dict[str, Any] | None = None) -> Message:
    """The JSON-RPC reply to `request`: its `result`, or its `error`."""
    reply: dict[str, Any] = {"jsonrpc": "2.0", "id": request.rpc_id}
    reply.update({"error": error} if error is not None else {"result": result or {}})
    return Message(request.transport, Phase.RESPONSE, request=request, status=200,
                   headers={"Content-Type": "application/json"}, body=json.dumps(reply).encode())


def mcp_reply(result: dict[str, Any], tool: str = "render") -> Message:
    """A tools/call result of `tool`."""
    return rpc_reply(tool_call(tool), result)


def tools_list_reply(tools: list[dict[str, Any]]) -> Message:
    """A tools/list result listing `tools`."""
    return rpc_reply(rpc_request("tools/list"), {"tools": tools})


def rest_reply(body: bytes, content_type: str | None = "application/json", path: str = "/api/items",
               **headers: str) -> Message:
    """A plain HTTP tool's 200 reply to a GET of `path`."""
    request = Message("http", Phase.REQUEST, http_method="GET", path=path + "?page=1")
    if content_type is not None:
        headers["Content-Type"] = content_type
    return Message("http", Phase.RESPONSE, request=request, status=200, headers=headers, body=body)
