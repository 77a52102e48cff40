from __future__ import annotations

from typing import Literal

from pydantic import Field

from chaosproxy.faults._llm import LlmFault
from chaosproxy.faults.base import Component, FaultContext, register
from chaosproxy.llm.actions import EmptyCompletion as Empty
from chaosproxy.llm.view import COMPLETION
from chaosproxy.message import Phase


@register
class EmptyCompletion(LlmFault):
    """Make the model's reply empty, or cut off at the token limit (finish_reason length / max_tokens)."""

    type: Literal["empty_completion"] = "empty_completion"
    mode: Literal["empty", "length"] = Field("empty", description=(
        "empty: no text and no tool calls; length: the text cut short, no tool calls, and the "
        "provider's token-limit stop reason"))

    component = Component.TRANSITION
    acts_on = Phase.RESPONSE
    target = "completion"

    def act(self, ctx: FaultContext) -> Empty | None:
        if ctx.message.api is None or ctx.message.method != COMPLETION:
            return None
        return Empty(self.mode)
