from __future__ import annotations

from typing import Literal

from pydantic import Field

from chaosproxy.engine.actions import Hang as HangAction
from chaosproxy.engine.message import Phase
from chaosproxy.faults.base import MAX_WAIT_MS, Component, Fault, FaultContext, Level, register


@register
class Hang(Fault):
    """Accept the request and never answer (or forward it only after release_after_ms)."""

    type: Literal["hang"] = "hang"
    release_after_ms: float | None = Field(None, gt=0, le=MAX_WAIT_MS, description="forward normally after this long")

    component = Component.TRANSITION
    level = Level.TRANSPORT
    phase = Phase.REQUEST

    def act(self, ctx: FaultContext) -> HangAction:
        release = self.release_after_ms / 1000 if self.release_after_ms is not None else None
        return HangAction(release)
