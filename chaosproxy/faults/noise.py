from __future__ import annotations

import random
from typing import Any, Literal

from pydantic import Field

from chaosproxy.faults import _text_edits
from chaosproxy.faults._content import ContentFault
from chaosproxy.faults._schema import Guard
from chaosproxy.faults.base import register


@register
class Noise(ContentFault):
    """Text that looks right but is not: homoglyphs, zero-width characters, whitespace, mojibake."""

    type: Literal["noise"] = "noise"
    kind: _text_edits.NoiseKind = Field("homoglyphs", description=(
        "homoglyphs (look-alike letters), zero_width (invisible characters), whitespace (odd spacing), "
        "mojibake (UTF-8 read as Latin-1: café -> cafÃ©)"))
    rate: float | None = Field(None, ge=0, le=1, description=(
        "chance that each character is hit; unset: 1 for mojibake (a whole text is misread), else 0.05"))

    def perturb(self, value: Any, rng: random.Random, guard: Guard) -> Any:
        rate = self.rate if self.rate is not None else 1.0 if self.kind == "mojibake" else 0.05
        return _text_edits.edit_strings(value, lambda text: _text_edits.noise(text, self.kind, rate, rng), rng,
                                    paths=self.paths, probability=self.probability, keep=guard.keep)
