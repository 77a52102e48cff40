"""A2A on the wire: what a request is (`A2aCall`), and the tasks, messages and task events a reply carries.

Both bindings and both versions are read here, so that the relay and the faults never look at a
spelling: a reply is a list of `Piece`s (a task, a message, a status update, an artifact update), each
with its task id and state, and each can be replaced in the body it came from.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import orjson

from chaosproxy.engine.message import Message
from chaosproxy.protocols import a2a
from chaosproxy.protocols.tasks import INTERRUPTED, TERMINAL, TaskState, a2a_spelling, parse_state

JSONRPC = "jsonrpc"
REST = "rest"  # the HTTP+JSON binding (and the card, which both bindings fetch by GET)


@dataclass(slots=True)
class A2aCall:
    """A request in A2A's terms (the engine's `Message.a2a`), and, on the synthetic messages the relay
    decides on, the piece of the reply they stand for (`kind`, `event`).

    `agent` is the remote agent's name as its card gives it, `skill` the skill the message names (its
    metadata) or the only skill the card lists, `state` the task's state in this piece of a reply (on a
    request: as the proxy last saw it).
    """

    method: str
    version: str  # "1.0" or "0.3"
    binding: str
    task_id: str | None = None
    skill: str | None = None
    agent: str | None = None
    state: TaskState | None = None
    kind: str | None = None  # a reply's piece: task, message, status, artifact, or card
    event: int | None = None  # a stream event's index (0: the first)
    stream: int | None = None  # which of its session's streams a stream event came in (1: the first)
    followup: bool = False  # a message sent to a task already under way (an answer to its question)

    def piece(self, piece: Piece, event: int | None = None) -> A2aCall:
        """This call's view of one piece of its reply."""
        return replace(self, kind=piece.kind, task_id=piece.task_id or self.task_id, state=piece.state, event=event)


# --- requests ------------------------------------------------------------------------------------

_REST = (  # (HTTP method, path tail, method); a tenant or v0.3's /v1 may come before the tail
    ("POST", re.compile(r"/message:send$"), a2a.SEND_MESSAGE),
    ("POST", re.compile(r"/message:stream$"), a2a.SEND_STREAMING_MESSAGE),
    ("POST", re.compile(r"/tasks/(?P<task>[^/:]+):cancel$"), a2a.CANCEL_TASK),
    ("*", re.compile(r"/tasks/(?P<task>[^/:]+):subscribe$"), a2a.SUBSCRIBE_TO_TASK),
    ("GET", re.compile(r"/tasks/(?P<task>[^/:]+)$"), a2a.GET_TASK),
    ("GET", re.compile(r"/tasks$"), a2a.LIST_TASKS),
    ("POST", re.compile(r"/tasks/(?P<task>[^/:]+)/pushNotificationConfigs$"), a2a.CREATE_PUSH_CONFIG),
    ("GET", re.compile(r"/tasks/(?P<task>[^/:]+)/pushNotificationConfigs$"), a2a.LIST_PUSH_CONFIGS),
    ("GET", re.compile(r"/tasks/(?P<task>[^/:]+)/pushNotificationConfigs/[^/]+$"), a2a.GET_PUSH_CONFIG),
    ("DELETE", re.compile(r"/tasks/(?P<task>[^/:]+)/pushNotificationConfigs/[^/]+$"), a2a.DELETE_PUSH_CONFIG),
    ("GET", re.compile(r"/(?:extendedAgentCard|v1/card)$"), a2a.GET_EXTENDED_CARD),
)
_SKILL_KEYS = ("skill", "skillId", "skill_id")
MAX_SKILL = 256  # a skill named longer (the agent's words: they reach the log as the call's tool) is none


def is_card(http_method: str | None, path: str | None) -> bool:
    """A GET of the agent card (the well-known paths of v1.0, v0.3 and v0.2)."""
    return http_method == "GET" and path is not None and path.endswith(a2a.CARD_PATHS)


def classify(msg: Message, an_agent: bool) -> A2aCall | None:
    """What `msg` (a request whose body, if any, was read) is in A2A's terms, or None when it is none.

    A JSON-RPC request is told by its method; an HTTP+JSON one by its path, when it carries the
    `A2A-Version` header (as the SDKs send it) or `an_agent` is true (the route served an agent card).
    """
    if is_card(msg.http_method, msg.path):
        return A2aCall(a2a.GET_AGENT_CARD, _header_version(msg.headers) or "1.0", REST)
    rpc = msg.rpc
    if rpc is not None:
        return _jsonrpc_call(rpc)
    version = _header_version(msg.headers)
    if msg.path is None or (version is None and not an_agent):
        return None
    for http_method, pattern, method in _REST:
        found = pattern.search(msg.path)
        if found is not None and http_method in ("*", msg.http_method):
            call = A2aCall(method, version or "0.3", REST, task_id=found.groupdict().get("task"))
            if method in a2a.SENDS and msg.body:
                body = json_value(msg.body)
                if isinstance(body, dict):
                    _read_send(call, body)
            return call
    return None


def _jsonrpc_call(rpc: dict[str, Any]) -> A2aCall | None:
    method = a2a.jsonrpc_method(rpc)
    if method is None:
        return None
    params = rpc.get("params")
    params = params if isinstance(params, dict) else {}
    call = A2aCall(method, "1.0" if rpc.get("method") == method else "0.3", JSONRPC)
    if call.method in a2a.SENDS:
        _read_send(call, params)
    else:
        task = params.get("taskId") if call.method in _PUSH else params.get("id")
        call.task_id = task if isinstance(task, str) else None
    return call


_PUSH = frozenset({a2a.CREATE_PUSH_CONFIG, a2a.GET_PUSH_CONFIG, a2a.LIST_PUSH_CONFIGS, a2a.DELETE_PUSH_CONFIG})


def _read_send(call: A2aCall, params: Mapping[str, Any]) -> None:
    """A sent message's task (a follow-up names it) and skill (its metadata's, or the request's)."""
    message = params.get("message", params.get("request"))  # (v0.3's HTTP+JSON calls it the request)
    if not isinstance(message, dict):
        return
    task = message.get("taskId")
    call.task_id = task if isinstance(task, str) else None
    call.followup = call.task_id is not None
    for metadata in (message.get("metadata"), params.get("metadata")):
        if isinstance(metadata, dict):
            skill = next((value for key in _SKILL_KEYS if isinstance(value := metadata.get(key), str)
                          and len(value) <= MAX_SKILL), None)
            if skill is not None:
                call.skill = skill
                return


def _header_version(headers: Mapping[str, str]) -> str | None:
    value = headers.get(a2a.VERSION_HEADER)
    if value is None:
        return None
    return "0.3" if value.strip().startswith("0.") else "1.0"


def json_value(body: bytes) -> Any:
    """The JSON value `body` holds, or None."""
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        return None


# --- replies -------------------------------------------------------------------------------------

_WRAPPED = {"task": "task", "message": "message", "statusUpdate": "status", "artifactUpdate": "artifact"}  # v1.0
_KINDS = {"task": "task", "message": "message", "status-update": "status", "artifact-update": "artifact"}  # v0.3


@dataclass(slots=True)
class Piece:
    """A task, message, status update or artifact update in a reply, and how to put a new one in its place."""

    kind: str
    obj: dict[str, Any]
    put: Callable[[dict[str, Any]], None]

    @property
    def task_id(self) -> str | None:
        value = self.obj.get("id") if self.kind == "task" else self.obj.get("taskId")
        return value if isinstance(value, str) else None

    @property
    def state(self) -> TaskState | None:
        status = self.obj.get("status") if self.kind in ("task", "status") else None
        return parse_state(status.get("state")) if isinstance(status, dict) else None

    @property
    def ends_stream(self) -> bool:
        """True for the piece after which a task's stream ends: its state is terminal or interrupted."""
        return self.state in TERMINAL or self.state in INTERRUPTED


def pieces(holder: dict[str, Any], key: str = "result") -> list[Piece]:
    """The pieces in `holder[key]` (a JSON-RPC reply's result, or a REST body held under "result"):
    a task, a message, either wrapped as v1.0 wraps them or tagged with v0.3's `kind`, an event of a
    stream, or a list of tasks (ListTasks)."""
    value = holder.get(key)
    if not isinstance(value, dict):
        return []
    tag = value.get("kind")
    kind = _KINDS.get(tag) if isinstance(tag, str) else None
    if kind is not None or _is_task(value):
        return [Piece(kind or "task", value, _putter(holder, key))]
    wrapped = [(name, kind) for name, kind in _WRAPPED.items() if isinstance(value.get(name), dict)]
    if len(wrapped) == 1:
        name, kind = wrapped[0]
        return [Piece(kind, value[name], _putter(value, name))]
    tasks = value.get("tasks")
    if isinstance(tasks, list):
        return [Piece("task", task, _putter(tasks, i)) for i, task in enumerate(tasks) if isinstance(task, dict)]
    return []


def _putter(container: Any, index: Any) -> Callable[[dict[str, Any]], None]:
    def put(new: dict[str, Any]) -> None:
        container[index] = new
    return put


def _is_task(value: dict[str, Any]) -> bool:
    return isinstance(value.get("id"), str) and isinstance(value.get("status"), dict)


V1_0, V0_3, V0_3_REST = "1.0", "0.3", "0.3-rest"  # how a piece is spelled: see `dialect`


def dialect(piece: Piece, call: A2aCall) -> str:
    """How a piece is spelled: v1.0's JSON (enum names, `parts`, `status.message`); v0.3's JSON-RPC (a
    `kind` on every object, kebab-case states, `role: agent`); or v0.3's HTTP+JSON, its protobuf's JSON
    (enum names, a message's parts in `content`, the status message in `status.update`)."""
    if "kind" in piece.obj:
        return V0_3
    return V0_3_REST if call.version == "0.3" and call.binding == REST else V1_0


def with_state(piece: Piece, spelling: str, state: TaskState, text: str | None, *,
               keep_results: bool) -> dict[str, Any]:
    """The piece (a task or a status update) in `state`, its status message saying `text` (none when
    None); a task's artifacts dropped unless `keep_results`. Other fields as they were."""
    obj = in_state(piece, spelling, state)
    status = obj["status"]
    key = "update" if spelling == V0_3_REST else "message"
    if text is None:
        status.pop(key, None)
    else:
        status[key] = agent_message(text, spelling, piece.task_id, obj.get("contextId"))
    if piece.kind == "task" and not keep_results:
        obj.pop("artifacts", None)
    return obj


def in_state(piece: Piece, spelling: str, state: TaskState) -> dict[str, Any]:
    """The piece (a task or a status update) in `state`, all else as it was (its status message too)."""
    obj = dict(piece.obj)
    obj["status"] = {**(obj.get("status") or {}), "state": a2a_spelling(state, "0.3" if spelling == V0_3 else "1.0")}
    if piece.kind == "status" and spelling != V1_0:
        obj["final"] = state in TERMINAL or state in INTERRUPTED
    return obj


def agent_message(text: str, spelling: str, task_id: str | None, context_id: Any) -> dict[str, Any]:
    """A message from the remote agent saying `text` (its id a digest of what it says, so a resent
    answer is the same message)."""
    message_id = hashlib.blake2b(f"{task_id}\0{text}".encode(), digest_size=16).hexdigest()
    if spelling == V0_3:
        message: dict[str, Any] = {"kind": "message", "messageId": message_id, "role": "agent",
                                   "parts": [{"kind": "text", "text": text}]}
    else:
        parts = "content" if spelling == V0_3_REST else "parts"
        message = {"messageId": message_id, "role": "ROLE_AGENT", parts: [{"text": text}]}
    if task_id is not None:
        message["taskId"] = task_id
    if isinstance(context_id, str):
        message["contextId"] = context_id
    return message


def part_lists(piece: Piece) -> list[list[Any]]:
    """The lists of parts a piece carries what the remote agent says in: a message's, a status message's,
    each artifact's (a task's) or the artifact's (an artifact update). A task's history is the past."""
    obj = piece.obj
    found: list[Any] = []
    if piece.kind == "message":
        found.append(_parts(obj))
    elif piece.kind in ("task", "status"):
        status = obj.get("status")
        message = (status.get("message") or status.get("update")) if isinstance(status, dict) else None
        if isinstance(message, dict):
            found.append(_parts(message))
        if piece.kind == "task" and isinstance(obj.get("artifacts"), list):
            found += [artifact.get("parts") for artifact in obj["artifacts"] if isinstance(artifact, dict)]
    elif piece.kind == "artifact" and isinstance(obj.get("artifact"), dict):
        found.append(obj["artifact"].get("parts"))
    return [parts for parts in found if isinstance(parts, list)]


def _parts(message: dict[str, Any]) -> Any:
    """A message's parts (v0.3's HTTP+JSON calls them its `content`)."""
    return message.get("parts", message.get("content"))


def part_text(part: Any) -> str | None:
    """A text part's text, or a data part's data as JSON text; None for files, URLs and raw bytes."""
    if not isinstance(part, dict):
        return None
    if isinstance(part.get("text"), str):
        return part["text"]
    if "data" in part and part.get("kind", "data") == "data":
        return orjson.dumps(part["data"]).decode()
    return None


def with_text(part: dict[str, Any], text: str) -> dict[str, Any] | None:
    """`part` saying `text` instead (a data part: `text` parsed as JSON), or None when it cannot."""
    if isinstance(part.get("text"), str):
        return {**part, "text": text}
    data = json_value(text.encode())
    return None if data is None and text.strip() != "null" else {**part, "data": data}


# --- the proxy's own answers ---------------------------------------------------------------------


def result_body(call: A2aCall, rpc_id: Any, result: Any) -> bytes:
    """A reply carrying `result`, as `call`'s binding writes it."""
    if call.binding == JSONRPC:
        return orjson.dumps({"jsonrpc": "2.0", "id": rpc_id, "result": result})
    return orjson.dumps(result)


def task_result(call: A2aCall, task: dict[str, Any]) -> dict[str, Any]:
    """How a task answers a send (or is a stream's event), as `call`'s version and binding write it: v0.3's
    JSON-RPC bare and tagged with its `kind`, the others wrapped."""
    if call.version == "0.3" and call.binding == JSONRPC:
        return task if "kind" in task else {**task, "kind": "task"}
    return {"task": task}


def sse_event(data: bytes) -> bytes:
    return b"data: " + data + b"\r\n\r\n"
