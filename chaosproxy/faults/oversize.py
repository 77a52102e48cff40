from __future__ import annotations

import math
import random
from typing import Any, Literal, Self

from pydantic import Field, model_validator

from chaosproxy.engine.actions import Skip
from chaosproxy.faults import _text_edits
from chaosproxy.faults._content import ContentFault
from chaosproxy.faults._schema import Guard
from chaosproxy.faults.base import register


@register
class Oversize(ContentFault):
    """Pad a result to N bytes or N times its size with plausible bulk: log lines, more records.

    Sizes are of each text item or JSON value as compact UTF-8: JSON text in the server's own
    (roomier) style comes out at least as large.
    """

    type: Literal["oversize"] = "oversize"
    bytes: int | None = Field(None, ge=1, le=_text_edits.MAX_OVERSIZE,
                              description="grow each targeted text or JSON value to at least this many bytes")
    factor: float | None = Field(None, gt=1, le=1000,
                                 description="grow each to at least this many times its size")

    @model_validator(mode="after")
    def _one_size(self) -> Self:
        if (self.bytes is None) == (self.factor is None):
            raise ValueError("give exactly one of bytes or factor")
        return self

    def perturb_result(self, result: dict[str, Any], rng: random.Random,
                       schema: dict[str, Any] | None = None) -> dict[str, Any] | Skip | None:
        """As every content fault, and when the schema left nothing in structuredContent to grow
        (no free text), the bulk arrives as a text item of its own, which no client validates."""
        changed = super().perturb_result(result, rng, schema)
        structured = result.get("structuredContent")
        if changed is not None or structured is None or self.where == "structured":
            return changed
        content = result.get("content")
        items: list[Any] = content if isinstance(content, list) else []
        filler = _text_edits.filler(self._target(structured), rng)
        return {**result, "content": [*items, {"type": "text", "text": filler}]}

    def _target(self, value: Any) -> int:
        return self.bytes if self.bytes is not None else math.ceil(_text_edits.size(value) * (self.factor or 1))

    def perturb(self, value: Any, rng: random.Random, guard: Guard) -> Any:
        return _text_edits.oversize(value, self._target(value), rng, paths=self.paths, probability=self.probability,
                                keep=guard.keep, strings_only=guard.strict)
