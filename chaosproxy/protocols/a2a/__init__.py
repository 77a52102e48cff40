"""A2A (Agent2Agent, v1.0 and v0.3): an agent delegating to a remote agent, as a fault surface.

The view the engine gets, as the model API's: the agent card is the tool list (its skills are tools),
a message sent is a call, a task's updates are its results. `wire` reads a request (either binding,
either version) as an `A2aCall` and finds the tasks, messages and events in a reply; `card` points a
card's URLs back through the proxy; the A2A relay (`chaosproxy.adapters.a2a_relay`) asks the engine and
writes the outcome back.

Methods are named as v1.0 names them, whatever the binding or version on the wire (a rule on
`SendMessage` acts on v0.3's `message/send` and on `POST /message:send` alike); the card fetch is
`GetAgentCard`. Task states are named as `chaosproxy.protocols.tasks` does (`working`, `input-required`).
"""

from __future__ import annotations

from typing import Any

GET_AGENT_CARD = "GetAgentCard"
SEND_MESSAGE = "SendMessage"
SEND_STREAMING_MESSAGE = "SendStreamingMessage"
GET_TASK = "GetTask"
LIST_TASKS = "ListTasks"
CANCEL_TASK = "CancelTask"
SUBSCRIBE_TO_TASK = "SubscribeToTask"
CREATE_PUSH_CONFIG = "CreateTaskPushNotificationConfig"
GET_PUSH_CONFIG = "GetTaskPushNotificationConfig"
LIST_PUSH_CONFIGS = "ListTaskPushNotificationConfigs"
DELETE_PUSH_CONFIG = "DeleteTaskPushNotificationConfig"
GET_EXTENDED_CARD = "GetExtendedAgentCard"

METHODS = frozenset({
    GET_AGENT_CARD, SEND_MESSAGE, SEND_STREAMING_MESSAGE, GET_TASK, LIST_TASKS, CANCEL_TASK, SUBSCRIBE_TO_TASK,
    CREATE_PUSH_CONFIG, GET_PUSH_CONFIG, LIST_PUSH_CONFIGS, DELETE_PUSH_CONFIG, GET_EXTENDED_CARD,
})

FROM_V0_3 = {  # v0.3's JSON-RPC method names
    "message/send": SEND_MESSAGE,
    "message/stream": SEND_STREAMING_MESSAGE,
    "tasks/get": GET_TASK,
    "tasks/cancel": CANCEL_TASK,
    "tasks/resubscribe": SUBSCRIBE_TO_TASK,
    "tasks/pushNotificationConfig/set": CREATE_PUSH_CONFIG,
    "tasks/pushNotificationConfig/get": GET_PUSH_CONFIG,
    "tasks/pushNotificationConfig/list": LIST_PUSH_CONFIGS,
    "tasks/pushNotificationConfig/delete": DELETE_PUSH_CONFIG,
    "agent/getAuthenticatedExtendedCard": GET_EXTENDED_CARD,
}

SENDS = frozenset({SEND_MESSAGE, SEND_STREAMING_MESSAGE})
SENDS_ON_THE_WIRE = SENDS | {"message/send", "message/stream"}  # a message sent: A2A's call (both versions)
STREAMING = frozenset({SEND_STREAMING_MESSAGE, SUBSCRIBE_TO_TASK})
# the methods whose replies carry tasks (or a message, or task events)
TASK_REPLIES = frozenset({SEND_MESSAGE, SEND_STREAMING_MESSAGE, GET_TASK, LIST_TASKS, CANCEL_TASK, SUBSCRIBE_TO_TASK})
CARDS = frozenset({GET_AGENT_CARD, GET_EXTENDED_CARD})

CARD_PATHS = ("/.well-known/agent-card.json", "/.well-known/agent.json")  # v1.0 and v0.3, and v0.2's
VERSION_HEADER = "A2A-Version"


def jsonrpc_method(rpc: dict[str, Any]) -> str | None:
    """The A2A method (its v1.0 name) a JSON-RPC request calls, or None when it is no A2A request. MCP's
    Tasks has a `tasks/get` and a `tasks/cancel` too: theirs name a `taskId`, A2A's an `id`."""
    name = rpc.get("method")
    if name in METHODS:
        return str(name)
    if name not in FROM_V0_3:
        return None
    params = rpc.get("params")
    if name in ("tasks/get", "tasks/cancel") and isinstance(params, dict) and "taskId" in params:
        return None
    return FROM_V0_3[name]
