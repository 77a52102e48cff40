from __future__ import annotations

import random
from typing import Any, Literal

from pydantic import Field

from chaosproxy.engine.actions import Garble, Rewrite, Skip
from chaosproxy.engine.message import Message
from chaosproxy.engine.session_state import SessionState
from chaosproxy.faults import _text_edits
from chaosproxy.faults._content import ContentFault, body_text, charset_of
from chaosproxy.faults._effects import garbled_body, with_result
from chaosproxy.faults._schema import Guard
from chaosproxy.faults.base import FaultContext, register
from chaosproxy.protocols.mcp import call_result

HISTORY = 8  # earlier results kept per tool and session, for stale replays


@register
class WrongData(ContentFault):
    """Plausible but wrong results: values swapped between fields, a stale earlier result, empty lists."""

    type: Literal["wrong_data"] = "wrong_data"
    mode: Literal["swap", "stale", "empty"] = Field("swap", description=(
        "swap: values of one type traded between fields; stale: the tool's previous (different) result "
        "replayed; empty: lists emptied, or strings where there is no list"))
    count: int = Field(1, ge=1, description="swap: how many pairs of fields to swap")

    def perturb(self, value: Any, rng: random.Random, guard: Guard) -> Any:
        if self.mode == "swap":
            return _text_edits.swap(value, rng, count=self.count, paths=self.paths, probability=self.probability,
                                keep=guard.keep)
        return _text_edits.emptied(value, rng, paths=self.paths, probability=self.probability, keep=guard.keep)

    def observe(self, msg: Message, session: SessionState) -> None:
        """Remember every result of the tool (not only those the gates pass), for stale replays."""
        current = _result_of(msg)
        if self.mode != "stale" or isinstance(current, Skip) or current is None:
            return
        history = session.results.setdefault(_tool_key(msg), [])
        if current in history:
            history.remove(current)  # kept once, as the latest
        history.append(current)
        del history[:-HISTORY - 1]

    def act(self, ctx: FaultContext) -> Rewrite | Garble | Skip | None:
        msg = ctx.message
        current = _result_of(msg)
        if current is None or isinstance(current, Skip):
            return current
        if self.mode != "stale":
            return super().act(ctx)
        history = ctx.session.results.get(_tool_key(msg), [])
        earlier = next((old for old in reversed(history) if old != current), None)
        if earlier is None:
            return Skip("no earlier result of this tool differs from this one")
        if isinstance(earlier, dict):
            return with_result(msg, earlier)
        charset = charset_of(msg)  # a plain body, kept when it was text in this charset
        return garbled_body(current.decode(charset), earlier.decode(charset), charset)


def _result_of(msg: Message) -> Any:
    """The tool's result (an MCP result dict or a plain body), None for tool errors, Skip for binary."""
    current: Any
    if msg.rpc is not None:
        current = call_result(msg)
    else:
        text = body_text(msg)
        if not isinstance(text, str):
            return text
        current = msg.body
    if isinstance(current, dict) and current.get("isError"):
        return None  # a tool error has no data to get wrong
    return current


def _tool_key(msg: Message) -> str:
    """Results are kept per MCP tool, or per HTTP method and path for plain REST tools."""
    if msg.tool is not None:
        return msg.tool
    request = msg.request or msg
    return f"{request.http_method} {(request.path or '').split('?')[0]}"
