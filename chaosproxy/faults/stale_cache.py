from __future__ import annotations

from typing import Literal

from pydantic import Field

from chaosproxy.engine.actions import Rewrite
from chaosproxy.engine.message import Phase
from chaosproxy.faults._cache_hints import CACHEABLE, cacheable_result
from chaosproxy.faults.base import Component, Fault, FaultContext, Level, register

MAX_TTL_MS = 86_400_000  # a day: what the Python SDK client clamps a ttlMs to (mcp.client.caching.MAX_TTL_MS)


@register
class StaleCache(Fault):
    """List results say they stay fresh for long (ttlMs): a caching client misses tools that change underneath."""

    type: Literal["stale_cache"] = "stale_cache"
    ttl_ms: int = Field(3_600_000, ge=1, le=MAX_TTL_MS, description="the ttlMs the results carry, in ms")

    component = Component.ACTION
    level = Level.MCP
    phase = Phase.RESPONSE
    methods = CACHEABLE

    def act(self, ctx: FaultContext) -> Rewrite | None:
        result = cacheable_result(ctx.message)
        if result is None or result.get("ttlMs") == self.ttl_ms:
            return None
        rpc = ctx.message.rpc or {}
        return Rewrite({**rpc, "result": {**result, "ttlMs": self.ttl_ms}},
                       effect={"ttlMs": [result.get("ttlMs"), self.ttl_ms]})
