"""Reading and rebuilding MCP payloads, for faults that act on tools/list and tools/call messages.

Everything here works on plain JSON-RPC dicts and returns new dicts: the original is never mutated
(the log digests it, and a later rule may look at it).
"""

from __future__ import annotations

from typing import Any

from chaosproxy.engine.message import Message, Phase


def listed_tools(msg: Message) -> list[dict[str, Any]] | None:
    """The tools of a tools/list response, or None when `msg` is not one."""
    if msg.phase is not Phase.RESPONSE or msg.method != "tools/list":
        return None
    result = (msg.rpc or {}).get("result")
    tools = result.get("tools") if isinstance(result, dict) else None
    return tools if isinstance(tools, list) else None


def is_first_page(msg: Message) -> bool:
    """True unless the request asked for a later page (a cursor): tools are added on page one only."""
    request = msg.request.rpc if msg.request is not None else None
    params = (request or {}).get("params") or {}
    return not (isinstance(params, dict) and params.get("cursor"))


def call_result(msg: Message) -> dict[str, Any] | None:
    """The result of a tools/call response (content, structuredContent, isError), or None."""
    if msg.phase is not Phase.RESPONSE or msg.method != "tools/call":
        return None
    result = (msg.rpc or {}).get("result")
    return result if isinstance(result, dict) else None


def error_reply(msg: Message, code: int, message: str, data: Any = None) -> dict[str, Any]:
    """A JSON-RPC error answering the request `msg` (or the request a response `msg` answers)."""
    rpc = msg.rpc if msg.phase is Phase.REQUEST or msg.request is None else msg.request.rpc
    error: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return {"jsonrpc": "2.0", "id": (rpc or {}).get("id"), "error": error}


PROTOCOL_VERSION_META = "io.modelcontextprotocol/protocolVersion"


def result_reply(msg: Message, result: dict[str, Any]) -> dict[str, Any]:
    """A JSON-RPC result answering the request `msg`, in the request's protocol era.

    Stateless-era (2026-07-28) requests carry their protocol version in `_meta`, and their clients
    require `resultType` on results; handshake-era clients know no such field.
    """
    rpc = msg.rpc or {}
    params = rpc.get("params")
    meta = params.get("_meta") if isinstance(params, dict) else None
    if isinstance(meta, dict) and str(meta.get(PROTOCOL_VERSION_META, "")) >= "2026":
        result = {"resultType": "complete", **result}
    return {"jsonrpc": "2.0", "id": rpc.get("id"), "result": result}


def tool_error_result(text: str) -> dict[str, Any]:
    """A tools/call result that reports a tool-level failure (isError: true), as servers send them."""
    return {"content": [{"type": "text", "text": text}], "isError": True}
