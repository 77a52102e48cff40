"""What the model-API faults share: their base, and the prompt as the LLM relay shows it to them.

Not a fault itself: it registers nothing. These faults act on the synthetic messages the LLM relay
(chaosproxy.llm) builds from a model-API exchange: `llm/prompt` (the newest user turn), `tools/call`
requests (the tool calls the model made), `llm/completion` (the model's reply as a whole).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, ClassVar

from chaosproxy.actions import Rewrite
from chaosproxy.faults._rewording import PROTECTED
from chaosproxy.faults.base import Fault, Level
from chaosproxy.llm.view import PROMPT
from chaosproxy.message import Message, Phase

_PROTECTED = re.compile("|".join(PROTECTED))


class LlmFault(Fault):
    """Base of the faults that act on model-API traffic only.

    `target` says which part of an exchange: `prompt`, `call` (a tool call the model made),
    `completion` (the reply as a whole) or `request` (the HTTP request itself: a wire fault).
    """

    level = Level.LLM
    target: ClassVar[str]


def prompt_text(msg: Message) -> str | None:
    """The text of the user's newest turn, when `msg` is the relay's prompt message."""
    rpc = msg.rpc
    if msg.phase is not Phase.REQUEST or rpc is None or rpc.get("method") != PROMPT:
        return None
    text = (rpc.get("params") or {}).get("text")
    return text if isinstance(text, str) and text.strip() else None


def with_prompt(msg: Message, text: str) -> Rewrite:
    rpc = msg.rpc
    assert rpc is not None
    return Rewrite({**rpc, "params": {**rpc["params"], "text": text}})


def outside_protected(text: str, edit: Callable[[str], str]) -> str:
    """`edit` applied to the prose between what a prompt is precise about (code spans, quotes, URLs,
    numbers, identifiers), which stays as it is."""
    out: list[str] = []
    position = 0
    for found in _PROTECTED.finditer(text):
        out += [edit(text[position:found.start()]), found.group(0)]
        position = found.end()
    out.append(edit(text[position:]))
    return "".join(out)


def call_arguments(msg: Message) -> dict[str, Any] | None:
    """The arguments of a tool call the model made (the relay's tools/call request), else None."""
    rpc = msg.rpc
    if msg.api is None or msg.phase is not Phase.REQUEST or rpc is None or rpc.get("method") != "tools/call":
        return None
    arguments = (rpc.get("params") or {}).get("arguments")
    return arguments if isinstance(arguments, dict) else {}


def is_stream(msg: Message) -> bool:
    return "text/event-stream" in msg.headers.get("Content-Type", "")
