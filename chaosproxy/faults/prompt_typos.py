from __future__ import annotations

import random
from typing import Literal

from pydantic import Field

from chaosproxy.faults import _text_edits
from chaosproxy.faults._llm import PromptFault, outside_protected
from chaosproxy.faults.base import register


@register
class PromptTypos(PromptFault):
    """Keyboard slips in the user's newest prompt (model API); numbers, URLs, code and identifiers intact."""

    type: Literal["prompt_typos"] = "prompt_typos"
    rate: float = Field(0.05, gt=0, le=1, description="chance that each letter gets a typo")
    layout: _text_edits.Layout = Field("qwerty", description="keyboard whose neighbouring keys are hit")

    def reword(self, text: str, rng: random.Random) -> str:
        return outside_protected(text, lambda prose: _text_edits.typo(prose, self.rate, self.layout, rng))
