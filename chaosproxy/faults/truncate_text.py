from __future__ import annotations

import random
from typing import Any, ClassVar, Literal, Self

from pydantic import Field, model_validator

from chaosproxy.faults import _text_edits
from chaosproxy.faults._content import ContentFault
from chaosproxy.faults._schema import Guard
from chaosproxy.faults.base import register


@register
class TruncateText(ContentFault):
    """Cut result text to N characters or a fraction, optionally marked, as hosts cut long output."""

    type: Literal["truncate_text"] = "truncate_text"
    chars: int | None = Field(None, ge=0, description="keep this many characters")
    fraction: float | None = Field(None, ge=0, le=1, description="keep this fraction of the characters")
    marker: str = Field("", description="appended where text was cut, e.g. '…[truncated]'; "
                                        "{omitted} becomes the number of characters cut")

    # Without paths, JSON text is cut as text, mid-document, exactly as a host's length limit does;
    # structuredContent (and JSON with paths) is cut string by string and stays valid, and while
    # respect_schema holds, text restating structuredContent follows it rather than being cut.
    text_first: ClassVar[bool] = True

    @model_validator(mode="after")
    def _one_length(self) -> Self:
        if (self.chars is None) == (self.fraction is None):
            raise ValueError("give exactly one of chars or fraction")
        return self

    def perturb(self, value: Any, rng: random.Random, guard: Guard) -> Any:
        def cut(text: str) -> str:
            return _text_edits.truncate(text, chars=self.chars, fraction=self.fraction, marker=self.marker)
        return _text_edits.edit_strings(value, cut, rng, paths=self.paths, probability=self.probability,
                                        keep=guard.keep)
