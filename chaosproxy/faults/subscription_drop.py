from __future__ import annotations

import fnmatch
from typing import Annotated, Any, Literal

from pydantic import Field, StringConstraints

from chaosproxy.engine.actions import Drop, Rewrite
from chaosproxy.engine.message import Phase
from chaosproxy.faults._effects import short
from chaosproxy.faults._input_required import params_of, remembered
from chaosproxy.faults.base import Component, Fault, FaultContext, Level, register

SUBSCRIPTION_ID = "io.modelcontextprotocol/subscriptionId"
ACKNOWLEDGED = "notifications/subscriptions/acknowledged"
# What a subscriptions/listen stream carries (basic/patterns/subscriptions; the Tasks extension's
# notifications/tasks), and the listen request itself, whose reply is the stream
STREAMED = frozenset({ACKNOWLEDGED, "notifications/tools/list_changed", "notifications/prompts/list_changed",
                      "notifications/resources/list_changed", "notifications/resources/updated",
                      "notifications/tasks", "subscriptions/listen"})
CHANGES = ["notifications/*/list_changed", "notifications/resources/updated"]
CONNECTION_CLOSED = -32000  # what the Python SDK client makes of a stream that ended without a reply

Glob = Annotated[str, StringConstraints(min_length=1, max_length=128)]


@register
class SubscriptionDrop(Fault):
    """Change notifications never reach the agent: chosen ones are dropped, or the subscription ends at one."""

    type: Literal["subscription_drop"] = "subscription_drop"
    notifications: list[Glob] = Field(default_factory=lambda: list(CHANGES), min_length=1, max_length=16,
                                      description="globs of the notification methods the fault takes")
    end: Literal["lost", "closed"] | None = Field(None, description=(
        "unset: each chosen notification is dropped; lost: the subscriptions/listen stream ends there "
        "without the server's close (an error for the listen request: the client's subscription is lost); "
        "closed: it ends there as the server closes it (a result): the client stops listening, none the wiser"))

    component = Component.TRANSITION
    level = Level.MCP
    phase = Phase.RESPONSE
    methods = STREAMED

    def act(self, ctx: FaultContext) -> Drop | Rewrite | None:
        rpc = ctx.message.rpc or {}
        method = rpc.get("method")
        if not isinstance(method, str) or "id" in rpc:
            return None  # the listen request's own reply (the stream's end), not a notification
        meta = params_of(rpc).get("_meta")
        subscription = meta.get(SUBSCRIPTION_ID) if isinstance(meta, dict) else None
        ended = remembered(ctx.state, "ended")
        if subscription is not None and _key(subscription) in ended:
            return Drop()  # the agent was told its subscription is over: nothing more of it reaches it
        if not any(fnmatch.fnmatchcase(method, glob) for glob in self.notifications):
            return None
        if self.end is None:
            return Drop()
        if not isinstance(subscription, str | int):
            return None  # no subscription to end (a handshake-era notification)
        ended[_key(subscription)] = True
        return Rewrite(_ending(subscription, self.end), effect={"ended": self.end, "at": short(method)})


def _key(subscription: Any) -> str:
    return repr(subscription)


def _ending(subscription: str | int, end: str) -> dict[str, Any]:
    """The listen request's reply: an error (the stream lost) or a result (the server closed it)."""
    if end == "lost":
        return {"jsonrpc": "2.0", "id": subscription,
                "error": {"code": CONNECTION_CLOSED, "message": "Connection closed: the subscription stream ended"}}
    return {"jsonrpc": "2.0", "id": subscription, "result": {"resultType": "complete"}}
