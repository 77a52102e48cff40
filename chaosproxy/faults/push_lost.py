from __future__ import annotations

from typing import Any, ClassVar, Literal

from chaosproxy.engine.actions import Reply, Rewrite
from chaosproxy.engine.message import Phase
from chaosproxy.faults.base import Component, Fault, FaultContext, Level, register
from chaosproxy.protocols import a2a

_IN_SEND = {"1.0": "taskPushNotificationConfig", "0.3": "pushNotificationConfig"}  # SendMessage's configuration


@register
class PushLost(Fault):
    """The agent's push notifications never come: the remote agent is never given its webhook."""

    type: Literal["push_lost"] = "push_lost"

    component = Component.TRANSITION
    level = Level.A2A
    phase = Phase.REQUEST
    # the A2A methods it acts on, by their v1.0 names (`methods` would meet v0.3's own names on the wire)
    a2a_methods: ClassVar[frozenset[str]] = a2a.SENDS | {a2a.CREATE_PUSH_CONFIG}

    def act(self, ctx: FaultContext) -> Reply | Rewrite | None:
        msg = ctx.message
        call, rpc = msg.a2a, msg.rpc or {}
        params = rpc.get("params")
        if call is None or call.method not in self.a2a_methods or not isinstance(params, dict):
            return None
        if call.method == a2a.CREATE_PUSH_CONFIG:  # answered as if stored; the remote agent never hears of it
            return Reply({"jsonrpc": "2.0", "id": rpc.get("id"), "result": _as_stored(params, call.task_id)})
        configuration = params.get("configuration")
        key = _IN_SEND[call.version]
        if not isinstance(configuration, dict) or key not in configuration:
            return None
        left = {name: value for name, value in configuration.items() if name != key}
        return Rewrite({**rpc, "params": {**params, "configuration": left}}, effect={"removed": key})


def _as_stored(config: dict[str, Any], task_id: str | None) -> dict[str, Any]:
    """The push configuration as a server answers its creation: as sent, with an id."""
    inner = config.get("pushNotificationConfig")
    if isinstance(inner, dict):  # v0.3: {taskId, pushNotificationConfig: {url, id, token}}
        return {**config, "pushNotificationConfig": {"id": task_id or "default", **inner}}
    return {"id": task_id or "default", **config}
