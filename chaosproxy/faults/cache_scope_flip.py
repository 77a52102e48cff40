from __future__ import annotations

from typing import Literal

from pydantic import Field

from chaosproxy.engine.actions import Rewrite
from chaosproxy.engine.message import Phase
from chaosproxy.faults._cache_hints import CACHEABLE, cacheable_result
from chaosproxy.faults.base import Component, Fault, FaultContext, Level, register

FLIPPED = {"private": "public", "public": "private"}


@register
class CacheScopeFlip(Fault):
    """A cacheable result's cacheScope is the other one: private results shared across users, or public ones not."""

    type: Literal["cache_scope_flip"] = "cache_scope_flip"
    to: Literal["flip", "public", "private"] = Field("flip", description=(
        "the scope results say: flip (the other one), public (shareable across authorization contexts: "
        "a leak when the result was private) or private (never shared)"))

    component = Component.REWARD
    level = Level.MCP
    phase = Phase.RESPONSE
    methods = CACHEABLE

    def act(self, ctx: FaultContext) -> Rewrite | None:
        result = cacheable_result(ctx.message)
        scope = result.get("cacheScope") if result is not None else None
        if result is None or scope not in FLIPPED:
            return None
        said = FLIPPED[scope] if self.to == "flip" else self.to
        if said == scope:
            return None
        rpc = ctx.message.rpc or {}
        return Rewrite({**rpc, "result": {**result, "cacheScope": said}}, effect={"cacheScope": [scope, said]})
