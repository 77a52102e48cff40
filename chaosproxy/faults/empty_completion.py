from __future__ import annotations

from typing import Literal

from pydantic import Field

from chaosproxy.engine.actions import BlankCompletion
from chaosproxy.engine.message import Phase
from chaosproxy.faults._llm import LlmFault
from chaosproxy.faults.base import Component, FaultContext, register
from chaosproxy.protocols.llm import ANTHROPIC, OPENAI_CHAT, OPENAI_RESPONSES
from chaosproxy.protocols.llm.view import COMPLETION

# api -> mode -> how the reply then ends: its finish or stop reason (a Responses reply: its status)
STOP = {OPENAI_CHAT: {"empty": "stop", "length": "length"}, ANTHROPIC: {"empty": "end_turn", "length": "max_tokens"},
        OPENAI_RESPONSES: {"empty": "completed", "length": "incomplete"}}


@register
class EmptyCompletion(LlmFault):
    """Make the model's reply empty, or cut off at the token limit (finish_reason length / max_tokens)."""

    type: Literal["empty_completion"] = "empty_completion"
    mode: Literal["empty", "length"] = Field("empty", description=(
        "empty: no text, no tool calls, no reasoning; length: the text cut short, no tool calls or reasoning, "
        "and the provider's token-limit stop reason. A reply with no output is left as it is"))

    component = Component.TRANSITION
    phase = Phase.RESPONSE
    target = "completion"
    methods = frozenset({COMPLETION})

    def act(self, ctx: FaultContext) -> BlankCompletion | None:
        api = ctx.message.api
        if api is None or ctx.message.method != COMPLETION:
            return None
        return BlankCompletion(self.mode, STOP[api][self.mode])
