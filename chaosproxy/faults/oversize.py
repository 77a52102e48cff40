from __future__ import annotations

import math
import random
from typing import Any, Literal, Self

from pydantic import Field, model_validator

from chaosproxy import content
from chaosproxy.faults._content import ContentFault
from chaosproxy.faults.base import register


@register
class Oversize(ContentFault):
    """Pad a result to N bytes or N times its size with plausible bulk: log lines, more records.

    Sizes are of each text item or JSON value as compact UTF-8: JSON text in the server's own
    (roomier) style comes out at least as large.
    """

    type: Literal["oversize"] = "oversize"
    bytes: int | None = Field(None, ge=1, le=content.MAX_OVERSIZE,
                              description="grow each targeted text or JSON value to at least this many bytes")
    factor: float | None = Field(None, gt=1, le=1000,
                                 description="grow each to at least this many times its size")

    @model_validator(mode="after")
    def _one_size(self) -> Self:
        if (self.bytes is None) == (self.factor is None):
            raise ValueError("give exactly one of bytes or factor")
        return self

    def perturb(self, value: Any, rng: random.Random) -> Any:
        target = self.bytes if self.bytes is not None else math.ceil(content.size(value) * (self.factor or 1))
        return content.oversize(value, target, rng, paths=self.paths, probability=self.probability)
