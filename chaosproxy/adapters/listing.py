"""Listing an MCP upstream's tools on the proxy's own behalf, over streamable HTTP.

Faults on a tool's result keep it valid for the tool's outputSchema (invariant 9), which the proxy
learns when upstream lists the tools. An agent that never lists them through the proxy (it listed on
another connection, reconnected with a cached list, or lists lazily after a call, as the Python SDK
client does to validate a result it already has) would otherwise get results perturbed blind, which
its client rejects. So before such a tools/call goes on, the proxy asks upstream itself: the same
endpoint, session, protocol version, credentials and `_meta` as the agent's request, every page.
What cannot be had (an error, a timeout, a legacy HTTP+SSE session, whose replies come on the agent's
own stream) is given up on: the faults then perturb text only and log a skip for the rest.
"""

from __future__ import annotations

import itertools
from typing import Any

import aiohttp
import orjson

from chaosproxy.protocols import streams
from chaosproxy.telemetry.log import ops

LISTING_TIMEOUT_S = 5.0  # a listing held up longer is given up on (the agent's call waits on it)
MAX_PAGES = 32
# The agent's headers that do not go on a listing: its body's framing and type, the method it mirrors.
NOT_COPIED = frozenset({"host", "content-length", "transfer-encoding", "content-type", "accept", "accept-encoding",
                        "expect", "connection", "keep-alive", "te", "upgrade", "mcp-method", "mcp-name"})
_ids = itertools.count(1)


async def list_tools(url: str, headers: list[tuple[bytes, bytes]], call: dict[str, Any],
                     max_bytes: int) -> list[Any] | None:
    """Every tool upstream lists at `url`, asked as the agent asked `call` (its tools/call request,
    sent with `headers`); None when the list cannot be had whole within LISTING_TIMEOUT_S."""
    params = called if isinstance(called := call.get("params"), dict) else {}
    meta = params.get("_meta")
    base: dict[str, Any] = {"_meta": {k: v for k, v in meta.items() if k != "progressToken"}} \
        if isinstance(meta, dict) else {}
    sent = {name.decode("latin-1"): value.decode("latin-1") for name, value in headers
            if name.lower().decode("latin-1") not in NOT_COPIED and not name.lower().startswith(b"mcp-param-")}
    sent |= {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
    if any(name.lower() == b"mcp-method" for name, _ in headers):  # the stateless era mirrors it
        sent["Mcp-Method"] = "tools/list"
    tools: list[Any] = []
    cursor: Any = None
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=LISTING_TIMEOUT_S),
                                         auto_decompress=False) as client:
            for _ in range(MAX_PAGES):
                page = await _page(client, url, sent, {**base, **({"cursor": cursor} if cursor else {})},
                                   max_bytes)
                if page is None:
                    return None
                tools += page.get("tools") or []
                cursor = page.get("nextCursor")
                if not cursor:
                    return tools
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:  # (the URL may hold a signed query: not shown)
        ops.info("listing upstream's tools for the output schemas faults keep to failed: %s", type(exc).__name__)
    return None


async def _page(client: aiohttp.ClientSession, url: str, headers: dict[str, str], params: dict[str, Any],
                max_bytes: int) -> dict[str, Any] | None:
    """One tools/list result, from a JSON reply or the event stream a streamable HTTP server may send."""
    rpc_id = f"chaosproxy-tools-{next(_ids)}"
    body = orjson.dumps({"jsonrpc": "2.0", "id": rpc_id, "method": "tools/list", "params": params})
    async with client.post(url, data=body, headers=headers) as reply:
        kind = reply.headers.get("Content-Type", "")
        if reply.status != 200 or not ("json" in kind or "text/event-stream" in kind):
            return None  # 202: a legacy server answers on the agent's stream
        if "json" in kind:
            whole = bytearray()
            async for piece in reply.content.iter_any():
                whole += piece
                if len(whole) > max_bytes:
                    return None
            return _result(bytes(whole), rpc_id)
        async for frame in streams.sse_frames(reply.content.iter_any(), max_bytes):
            data = None if isinstance(frame, streams.Unframed) else streams.sse_data(frame)
            if data is not None and (result := _result(data, rpc_id)) is not None:
                return result
    return None


def _result(payload: bytes, rpc_id: str) -> dict[str, Any] | None:
    """The result of the response to `rpc_id` in `payload`, when it is one."""
    try:
        message = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return None
    result = message.get("result") if isinstance(message, dict) and message.get("id") == rpc_id else None
    return result if isinstance(result, dict) and isinstance(result.get("tools", []), list) else None
