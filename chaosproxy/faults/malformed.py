from __future__ import annotations

import json
from typing import Literal

import orjson

from chaosproxy.engine.actions import Garble, Rewrite
from chaosproxy.engine.message import Phase
from chaosproxy.faults._effects import with_result
from chaosproxy.faults.base import Component, Fault, FaultContext, Level, register
from chaosproxy.protocols.mcp import call_result


@register
class Malformed(Fault):
    """Break a reply: invalid JSON in the result text, or a broken frame on the wire."""

    type: Literal["malformed"] = "malformed"
    variant: Literal["invalid_json", "truncated", "multiline", "stray_line", "empty_line", "wrong_id"] = "truncated"
    stray_text: str = "INFO server: handled request"

    component = Component.TRANSITION
    level = Level.JSONRPC
    phase = Phase.RESPONSE

    def act(self, ctx: FaultContext) -> Garble | Rewrite | None:
        msg = ctx.message
        rpc = msg.rpc
        if rpc is None or "method" in rpc or "id" not in rpc:
            return None  # only replies are broken: requests and notifications pass
        frame = msg.body or orjson.dumps(rpc)
        match self.variant:
            case "invalid_json":
                result = call_result(msg)
                if result is None:
                    return None
                return with_result(msg, {**result, "content": [
                    {**item, "text": _break_json(item["text"])} if item.get("type") == "text" else item
                    for item in result.get("content", [])]})
            case "truncated":
                return Garble(frame[: max(1, len(frame) // 2)])
            case "multiline":
                return Garble(json.dumps(rpc, indent=2).encode())
            case "stray_line":
                return Garble(self.stray_text.encode() + b"\n" + frame)
            case "empty_line":
                return Garble(b"\n" + frame)
            case "wrong_id":
                wrong = rpc["id"] + 1000 if isinstance(rpc["id"], int) else f"{rpc['id']}-x"
                return Rewrite({**rpc, "id": wrong})


def _break_json(text: str) -> str:
    """Valid-looking JSON that does not parse: cut before its end, as a crashed serializer leaves it."""
    return text[: max(1, (len(text) * 2) // 3)] if text else "{"
