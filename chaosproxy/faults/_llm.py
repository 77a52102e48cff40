"""What the model-API faults share: their base, and the prompt as the LLM relay shows it to them.

Not a fault itself: it registers nothing. These faults act on the synthetic messages the LLM relay
(chaosproxy.adapters.llm_relay) builds from a model-API exchange: `llm/prompt` (the newest user turn), `tools/call`
requests (the tool calls the model made), `llm/completion` (the model's reply as a whole).
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from typing import Any, ClassVar

from chaosproxy.engine.actions import Rewrite, Skip
from chaosproxy.engine.message import Message, Phase
from chaosproxy.faults._effects import call_effect, text_change
from chaosproxy.faults._rewording import PROTECTED
from chaosproxy.faults.base import Component, Fault, FaultContext, Level
from chaosproxy.protocols.llm.view import PROMPT

_PROTECTED = re.compile("|".join(PROTECTED))


class LlmFault(Fault):
    """Base of the faults that act on model-API traffic only.

    `target` says which part of an exchange: `prompt`, `call` (a tool call the model made),
    `completion` (the reply as a whole) or `request` (the HTTP request itself: a wire fault).
    """

    level = Level.LLM
    target: ClassVar[str]


class PromptFault(LlmFault):
    """Base of the faults that reword the user's newest prompt: they say how, in `reword`."""

    component = Component.OBSERVATION
    phase = Phase.REQUEST
    target = "prompt"

    def reword(self, text: str, rng: random.Random) -> str:
        raise NotImplementedError

    async def prepare(self, text: str) -> None:
        """Before the request is decided: fetch what `reword` will need from elsewhere (a model's answer)."""

    def act(self, ctx: FaultContext) -> Rewrite | None:
        text = prompt_text(ctx.message)
        if text is None:
            return None
        new = self.reword(text, ctx.rng)
        return with_prompt(ctx.message, new, text_change(text, new)) if new != text else None


class ToolCallFault(LlmFault):
    """Base of the faults that change a tool call the model made: they return its new params in `change`."""

    component = Component.ACTION
    phase = Phase.REQUEST
    target = "call"

    def change(self, params: dict[str, Any], arguments: dict[str, Any],
               ctx: FaultContext) -> dict[str, Any] | Skip | None:
        raise NotImplementedError

    def effect(self, params: dict[str, Any], changed: dict[str, Any]) -> dict[str, Any]:
        """What the change did, for the log line: the tool it names, the arguments changed (by name)."""
        return call_effect(params, changed)

    def act(self, ctx: FaultContext) -> Rewrite | Skip | None:
        arguments = call_arguments(ctx.message)
        rpc = ctx.message.rpc
        if arguments is None or rpc is None:
            return None
        params = self.change(rpc["params"], arguments, ctx)
        if not isinstance(params, dict):
            return params
        return Rewrite({**rpc, "params": params}, effect=self.effect(rpc["params"], params))


def prompt_text(msg: Message) -> str | None:
    """The text of the user's newest turn, when `msg` is the relay's prompt message."""
    rpc = msg.rpc
    if msg.phase is not Phase.REQUEST or rpc is None or rpc.get("method") != PROMPT:
        return None
    text = (rpc.get("params") or {}).get("text")
    return text if isinstance(text, str) and text.strip() else None


def with_prompt(msg: Message, text: str, effect: dict[str, Any]) -> Rewrite:
    """The prompt message with this text instead."""
    rpc = msg.rpc
    assert rpc is not None
    return Rewrite({**rpc, "params": {**rpc["params"], "text": text}}, effect=effect)


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
    """Whether the reply to a tool call's exchange is streamed (the relay's tools/call messages say so)."""
    return "text/event-stream" in msg.headers.get("Content-Type", "")
