from __future__ import annotations

import importlib.resources
from functools import cache
from typing import Literal

import yaml

from chaosproxy.actions import Rewrite
from chaosproxy.faults._llm import LlmFault, prompt_text, with_prompt
from chaosproxy.faults._rewording import Rewording
from chaosproxy.faults.base import Component, FaultContext, register
from chaosproxy.message import Phase


@cache
def query_rewording() -> Rewording:
    """Rules for users' requests (not tool descriptions): their own synonyms, verbs and templates."""
    text = importlib.resources.files("chaosproxy").joinpath("data/query_paraphrase.yaml").read_text("utf-8")
    return Rewording(yaml.safe_load(text))


@register
class PromptParaphrase(LlmFault):
    """Reword the user's newest prompt (model API), meaning kept: synonyms and templates, no model."""

    type: Literal["prompt_paraphrase"] = "prompt_paraphrase"

    component = Component.OBSERVATION
    acts_on = Phase.REQUEST
    target = "prompt"

    def act(self, ctx: FaultContext) -> Rewrite | None:
        text = prompt_text(ctx.message)
        if text is None:
            return None
        reworded = query_rewording().paraphrase(text, ctx.rng)
        return with_prompt(ctx.message, reworded) if reworded != text else None
