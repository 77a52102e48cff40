from __future__ import annotations

from typing import Literal

from pydantic import Field

from chaosproxy import content
from chaosproxy.actions import Rewrite
from chaosproxy.faults._llm import LlmFault, outside_protected, prompt_text, with_prompt
from chaosproxy.faults.base import Component, FaultContext, register
from chaosproxy.message import Phase


@register
class PromptTypos(LlmFault):
    """Keyboard slips in the user's newest prompt (model API); numbers, URLs, code and identifiers intact."""

    type: Literal["prompt_typos"] = "prompt_typos"
    rate: float = Field(0.05, gt=0, le=1, description="chance that each letter gets a typo")
    layout: content.Layout = Field("qwerty", description="keyboard whose neighbouring keys are hit")

    component = Component.OBSERVATION
    acts_on = Phase.REQUEST
    target = "prompt"

    def act(self, ctx: FaultContext) -> Rewrite | None:
        text = prompt_text(ctx.message)
        if text is None:
            return None
        typed = outside_protected(text, lambda prose: content.typo(prose, self.rate, self.layout, ctx.rng))
        return with_prompt(ctx.message, typed) if typed != text else None
