"""What the model-API faults share: their base, and the prompt as the LLM relay shows it to them.

Not a fault itself: it registers nothing. These faults act on the synthetic messages the LLM relay
(chaosproxy.llm) builds from a model-API exchange: `llm/prompt` (the newest user turn), `tools/call`
requests (the tool calls the model made), `llm/completion` (the model's reply as a whole).
"""

from __future__ import annotations

import os
import random
import re
from collections.abc import Callable
from typing import Any, ClassVar

from chaosproxy.actions import Rewrite, Skip
from chaosproxy.faults._rewording import PROTECTED
from chaosproxy.faults.base import Component, Fault, FaultContext, Level
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


class PromptFault(LlmFault):
    """Base of the faults that reword the user's newest prompt: they say how, in `reword`."""

    component = Component.OBSERVATION
    acts_on = Phase.REQUEST
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
    target = "call"

    def change(self, params: dict[str, Any], arguments: dict[str, Any],
               ctx: FaultContext) -> dict[str, Any] | Skip | None:
        raise NotImplementedError

    def effect(self, params: dict[str, Any], changed: dict[str, Any]) -> dict[str, Any]:
        """What the change did, for the log line (small: no argument values)."""
        return {}

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


def text_change(old: str, new: str) -> dict[str, Any]:
    """How a text was reworded, for the log line, without the text (it is the user's): its length before
    and after, and where it changed. Word for word when the words still line up (typos never touch
    spaces): how many words and characters changed, and the first offsets; else the span that changed."""
    before = [(found.start(), found.group()) for found in _WORD.finditer(old)]
    after = _WORD.findall(new)
    effect: dict[str, Any] = {"chars": [len(old), len(new)]}
    if len(before) != len(after):
        head, tail = _shared_ends(old, new)
        return effect | {"changed_span": [head, len(old) - tail]}
    changed = [(at, word, other) for (at, word), other in zip(before, after, strict=True) if word != other]
    chars = sum(max(len(word), len(other)) - sum(_shared_ends(word, other)) for _, word, other in changed)
    return effect | {"words_changed": len(changed), "chars_changed": chars,
                     "at": [at for at, _, _ in changed[:MAX_OFFSETS]]}


_WORD = re.compile(r"\S+")
MAX_OFFSETS = 8  # offsets a log line lists of what changed (the count says how many there were)


def _shared_ends(a: str, b: str) -> tuple[int, int]:
    """How long a head and a (not overlapping) tail two texts share."""
    head = len(os.path.commonprefix([a, b]))
    return head, len(os.path.commonprefix([a[head:][::-1], b[head:][::-1]]))


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
