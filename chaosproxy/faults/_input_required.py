"""What the faults on multi-round-trip requests (MCP 2026-07-28, `input_required`) share: which replies
ask the agent for input, which requests answer such a question, and which call a round belongs to.

Not a fault itself: it registers nothing.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import orjson

from chaosproxy.engine.message import Message

# The requests a server may answer with input_required (basic/patterns/mrtr, "Supported Requests").
ROUND_METHODS = frozenset({"tools/call", "prompts/get", "resources/read"})
INPUT_REQUIRED = "input_required"
MAX_CALLS = 256  # calls a rule remembers the last question of, per session, oldest forgotten first


def params_of(rpc: dict[str, Any] | None) -> dict[str, Any]:
    params = (rpc or {}).get("params")
    return params if isinstance(params, dict) else {}


def asks_for_input(result: Any) -> bool:
    """True for an InputRequiredResult: the server asks before it answers."""
    return isinstance(result, dict) and result.get("resultType") == INPUT_REQUIRED


def is_retry(request: dict[str, Any] | None) -> bool:
    """True for a request that answers a question: it carries inputResponses or the echoed requestState."""
    params = params_of(request)
    return params.get("inputResponses") is not None or params.get("requestState") is not None


def call_key(msg: Message) -> str:
    """The call a round belongs to, whatever round it is: its method, name (or uri) and arguments. Rounds
    of one call differ in their id, inputResponses and requestState only (mrtr, "Basic Workflow")."""
    request = msg.request.rpc if msg.request is not None else msg.rpc
    params = params_of(request)
    salient = [msg.method, params.get("name", params.get("uri")), params.get("arguments")]
    return hashlib.sha256(orjson.dumps(salient, option=orjson.OPT_SORT_KEYS)).hexdigest()[:32]


def remembered(state: dict[str, Any], key: str) -> OrderedDict[str, Any]:
    """A rule's bounded memory under `key` in its scratch space (MAX_CALLS entries, least recent out)."""
    memory: OrderedDict[str, Any] = state.setdefault(key, OrderedDict())
    while len(memory) > MAX_CALLS:
        memory.popitem(last=False)
    return memory


def with_questions_perturbed(request: Any, perturb: Callable[[str], str]) -> Any:
    """An input request (an `inputRequests` value) with its free text passed through `perturb`: an
    elicitation's message, a sampling request's text messages and system prompt. Its requested schema
    and everything else stay: the answers must still fit what the server asked for."""
    params = request.get("params") if isinstance(request, dict) else None
    if not isinstance(params, dict):
        return request
    new = dict(params)
    for name in ("message", "systemPrompt"):
        if isinstance(params.get(name), str):
            new[name] = perturb(params[name])
    if isinstance(params.get("messages"), list):
        new["messages"] = [_text_perturbed(message, perturb) for message in params["messages"]]
    return {**request, "params": new} if new != params else request


def _text_perturbed(message: Any, perturb: Callable[[str], str]) -> Any:
    content = message.get("content") if isinstance(message, dict) else None
    if not isinstance(content, dict) or content.get("type") != "text" or not isinstance(content.get("text"), str):
        return message
    return {**message, "content": {**content, "text": perturb(content["text"])}}
