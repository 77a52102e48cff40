from __future__ import annotations

import random
from typing import Any, Literal

from pydantic import Field

from chaosproxy.faults import _text_edits
from chaosproxy.faults._content import ContentFault
from chaosproxy.faults._schema import Guard
from chaosproxy.faults.base import register


@register
class Typos(ContentFault):
    """Keyboard-neighbour typos in result text: wrong key, dropped, doubled or swapped letters."""

    type: Literal["typos"] = "typos"
    rate: float = Field(0.05, ge=0, le=1, description="chance that each letter gets a typo")
    layout: _text_edits.Layout = Field("qwerty", description="keyboard whose neighbouring keys are hit")

    def perturb(self, value: Any, rng: random.Random, guard: Guard) -> Any:
        return _text_edits.edit_strings(value, lambda text: _text_edits.typo(text, self.rate, self.layout, rng), rng,
                                    paths=self.paths, probability=self.probability, keep=guard.keep)
