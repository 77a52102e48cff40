from __future__ import annotations

import math
from typing import Literal

from pydantic import Field

from chaosproxy.engine.actions import Respond
from chaosproxy.engine.message import Phase
from chaosproxy.faults.base import MAX_WAIT_MS, Component, Fault, FaultContext, Level, register
from chaosproxy.faults.http_error import error_body


@register
class RateLimit(Fault):
    """Answer 429 with Retry-After; with rate_per_s, only when a real token bucket runs dry."""

    type: Literal["rate_limit"] = "rate_limit"
    retry_after_s: float = Field(1, ge=0, le=MAX_WAIT_MS / 1000, description="Retry-After when no bucket is configured")
    rate_per_s: float | None = Field(None, gt=0, description="token refill rate; unset: always 429")
    burst: int = Field(1, ge=1, description="bucket capacity")

    component = Component.TRANSITION
    level = Level.HTTP
    phase = Phase.REQUEST

    def act(self, ctx: FaultContext) -> Respond | None:
        retry_after = self.retry_after_s
        if self.rate_per_s is not None:
            tokens, last = ctx.state.get("bucket", (float(self.burst), ctx.now))
            tokens = min(float(self.burst), tokens + (ctx.now - last) * self.rate_per_s)
            if tokens >= 1:
                ctx.state["bucket"] = (tokens - 1, ctx.now)
                return None
            ctx.state["bucket"] = (tokens, ctx.now)
            retry_after = (1 - tokens) / self.rate_per_s
        body, headers = error_body(429, "Rate limit exceeded")
        headers["Retry-After"] = str(math.ceil(retry_after))
        return Respond(429, body, headers)
